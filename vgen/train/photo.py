"""Zoo recipe: the photo classifier behind FID-photo / KID-photo / IS-photo.

A timm architecture (default ``resnet10t``) trained from scratch to tell the photo classes apart, on the
same random training crops the generators see (random scale, flips; no colour or blur augmentation, so the
features stay sensitive to exactly the defects FID should see). Held-out accuracy is measured on the test
region of every photo, which training never touches.

``data=captioned`` trains on the captioned crops of ``photos-t2i`` instead (:mod:`vgen.data.captions`: crops up to
the whole region, colour and brightness treatments): the judge of a text model's subjects, which the plain
classifier, never shown a tinted or darkened crop, is not (it names the subject of 31% of captioned test crops).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from vgen.data import CROP_SETS, NUM_CLASSES, crops
from vgen.eval.extractors import PhotoClassifier
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


@torch.no_grad()
def evaluate(model: PhotoClassifier, n: int = 1024, seed: int = 0, batch: int = 128, data: str = "photos") -> dict:
    """Held-out (test-region) accuracy, per class, and the confusion matrix."""
    model.eval()
    device = next(model.parameters()).device
    d = crops(data, "test", n, seed, model.image_size)
    images, labels = d.images, d.labels
    preds = torch.cat([model(images[i:i + batch].to(device))[1].argmax(-1).cpu() for i in range(0, n, batch)])
    conf = torch.zeros(NUM_CLASSES, NUM_CLASSES, dtype=torch.long)
    conf.index_put_((labels, preds), torch.ones_like(preds), accumulate=True)
    per_class = (conf.diag().float() / conf.sum(1).clamp_min(1)).tolist()
    return {"test_accuracy": float((preds == labels).float().mean()), "per_class_accuracy": per_class,
            "confusion": conf.tolist(), "eval_n": n}


@recipe(PhotoTrainConfig)
def train_photo(cfg: PhotoTrainConfig) -> dict:
    if cfg.data not in CROP_SETS:
        from vgen.errors import VGenError
        raise VGenError(f"recipe.data must be {' or '.join(CROP_SETS)}, got {cfg.data!r}")
    run, device = start_run(cfg)
    model = PhotoClassifier(cfg.arch, NUM_CLASSES, cfg.image_size).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)

    def step_fn(step):
        d = crops(cfg.data, "train", cfg.batch_size, cfg.seed * 1_000_003 + step, cfg.image_size)
        images, labels = d.images, d.labels
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
    metrics = evaluate(model, cfg.eval_n, data=cfg.data)
    run.log({"step": step, "final": True, **metrics})
    half = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    run.export("classifier.safetensors", half, model.config,
               extra={"train": asdict(cfg), "metrics": metrics})
    return {k: v for k, v in metrics.items() if k != "confusion"}
