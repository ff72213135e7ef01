"""Zoo recipe: the photo classifier behind FID-photo / KID-photo / IS-photo.

A timm architecture (default ``resnet10t``) trained from scratch to tell the photo classes apart, on the
same random training crops the generators see (random scale, flips; no colour or blur augmentation, so the
features stay sensitive to exactly the defects FID should see). Held-out accuracy is measured on the test
region of every photo, which training never touches.

``data=captioned`` trains on the captioned crops of ``photos-t2i`` instead (:mod:`vgen.data.captions`: crops up to
the whole region, colour and brightness treatments): the judge of a text model's subjects, which the plain
classifier, never shown a tinted or darkened crop, is not (it names the subject of 31% of captioned test crops).

``roundtrip=<VQ tokenizer>`` shows the classifier a share of its crops (``roundtrip_share``) after a round trip through
that tokenizer (encode to codes, decode), labels unchanged: a judge of a VQ model's samples should name a real crop's
subject as well after the round trip as before, since every sample the model can make is a decoded code grid. The
crops stay real crops: no generated image is ever shown. ``init`` continues from a classifier file.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from vgen.data import CROP_SETS, NUM_CLASSES, crops, to_model_range, to_uint8
from vgen.eval.extractors import PhotoClassifier, load_photo_classifier
from vgen.train.common import RecipeConfig, recipe, start_run, train_loop


@dataclass
class PhotoTrainConfig(RecipeConfig):
    out: str = "runs/photo-classifier"
    arch: str = "resnet10t"
    image_size: int = 64
    steps: int = 1200
    batch_size: int = 64
    lr: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    save_every: int = 100
    eval_n: int = 1024
    data: str = "photos"  # photos | captioned (the photos-t2i crops, treatments included)
    roundtrip: str = ""       # a VQ tokenizer: a share of the crops shown after its round trip ('' = none)
    roundtrip_share: float = 0.5
    init: str = ""            # a classifier.safetensors to continue from ('' = from scratch)


# crops of the training region no recipe run draws: step s of a run with recipe.seed r draws seed r * 1_000_003 + s
UNSEEN_SEED = 1_000_002


@torch.no_grad()
def round_trip(vq, images: torch.Tensor, batch: int = 128) -> torch.Tensor:
    """uint8 images (N, 3, H, W) encoded to ``vq``'s codes and decoded back to uint8."""
    device = next(vq.parameters()).device
    return torch.cat([to_uint8(vq.decode_codes(vq.encode_to_codes(to_model_range(images[i:i + batch].to(device)))))
                      .cpu() for i in range(0, images.shape[0], batch)])


@torch.no_grad()
def predict(model: PhotoClassifier, images: torch.Tensor, batch: int = 128) -> torch.Tensor:
    """The classifier's class per uint8 image (N,), on the CPU."""
    device = next(model.parameters()).device
    return torch.cat([model(images[i:i + batch].to(device))[1].argmax(-1).cpu() for i in range(0, len(images), batch)])


@torch.no_grad()
def evaluate(model: PhotoClassifier, n: int = 1024, seed: int = 0, batch: int = 128, data: str = "photos",
             vq=None) -> dict:
    """Held-out (test-region) accuracy, per class, and the confusion matrix; with ``vq``, the accuracy on the same
    crops after its round trip and on ``n`` unseen crops of the training region (:data:`UNSEEN_SEED`, never a
    training draw: the generators' own region) before and after it."""
    model.eval()

    def acc(images, labels):
        return float((predict(model, images, batch) == labels).float().mean())

    d = crops(data, "test", n, seed, model.image_size)
    preds = predict(model, d.images, batch)
    conf = torch.zeros(NUM_CLASSES, NUM_CLASSES, dtype=torch.long)
    conf.index_put_((d.labels, preds), torch.ones_like(preds), accumulate=True)
    per_class = (conf.diag().float() / conf.sum(1).clamp_min(1)).tolist()
    out = {"test_accuracy": float((preds == d.labels).float().mean()), "per_class_accuracy": per_class,
           "confusion": conf.tolist(), "eval_n": n}
    if vq is not None:
        out["test_accuracy_roundtrip"] = acc(round_trip(vq, d.images), d.labels)
        t = crops(data, "train", n, UNSEEN_SEED, model.image_size)
        out["train_region_accuracy"] = acc(t.images, t.labels)
        out["train_region_accuracy_roundtrip"] = acc(round_trip(vq, t.images), t.labels)
    return out


@recipe(PhotoTrainConfig)
def train_photo(cfg: PhotoTrainConfig) -> dict:
    if cfg.data not in CROP_SETS:
        from vgen.errors import VGenError
        raise VGenError(f"recipe.data must be {' or '.join(CROP_SETS)}, got {cfg.data!r}")
    if not 0.0 <= cfg.roundtrip_share <= 1.0:
        from vgen.errors import VGenError
        raise VGenError(f"recipe.roundtrip_share is a share of each batch: give a number in [0, 1], got "
                        f"{cfg.roundtrip_share}")
    needs = ((cfg.roundtrip, "VQ tokenizer for the round trips", "vq"),) if cfg.roundtrip else ()
    needs += ((cfg.init, "photo classifier to continue from", "photo"),) if cfg.init else ()
    run, device = start_run(cfg, needs=needs)
    if cfg.init:
        model = load_photo_classifier(cfg.init, device).train().requires_grad_(True)
    else:
        model = PhotoClassifier(cfg.arch, NUM_CLASSES, cfg.image_size).to(device)
    vq = None
    if cfg.roundtrip:
        from vgen.kinds import load_official
        vq = load_official("vq", cfg.roundtrip, device=device).eval()
    k = round(cfg.roundtrip_share * cfg.batch_size) if vq is not None else 0
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)

    def step_fn(step):
        d = crops(cfg.data, "train", cfg.batch_size, cfg.seed * 1_000_003 + step, cfg.image_size)
        images, labels = d.images, d.labels
        if k:  # the first k crops after the tokenizer's round trip (classes come in turn: k = 32 is every class twice)
            images = torch.cat([round_trip(vq, images[:k]), images[k:]])
        images, labels = images.to(device), labels.to(device)
        _, logits = model(images)
        acc = float((logits.argmax(-1) == labels).float().mean())
        return F.cross_entropy(logits, labels, label_smoothing=cfg.label_smoothing), {"train_accuracy": acc}

    step, _ = train_loop(cfg, model, opt, run, step_fn, desc="photo classifier", clip=2.0, log_every=20,
                         bar={"loss": "{loss:.3f}", "acc": "{train_accuracy:.2f}"})
    with torch.no_grad():  # the zoo ships fp16 weights: measure the model that ships
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.half().float())
    metrics = evaluate(model, cfg.eval_n, data=cfg.data, vq=vq)
    run.log({"step": step, "final": True, **metrics})
    half = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    run.export("classifier.safetensors", half, model.config,
               extra={"train": asdict(cfg), "metrics": metrics})
    return {k: v for k, v in metrics.items() if k != "confusion"}
