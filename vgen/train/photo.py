"""Zoo recipe: the photo classifier behind FID-photo / KID-photo / IS-photo.

A timm architecture (default ``resnet10t``) trained from scratch to tell the photo classes apart, on the
same random training crops the generators see (random scale, flips; no colour or blur augmentation, so the
features stay sensitive to exactly the defects FID should see). Held-out accuracy is measured on the test
region of every photo, which training never touches.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vgen.data import NUM_CLASSES, photos
from vgen.eval.extractors import PhotoClassifier
from vgen.train.common import RunDir, lr_at, rng_state


@dataclass
class PhotoTrainConfig:
    out: str = "runs/photo-classifier"
    arch: str = "resnet10t"
    image_size: int = 64
    steps: int = 1200
    batch_size: int = 64
    lr: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    seed: int = 0
    save_every: int = 100
    eval_n: int = 1024
    threads: int = 0


@torch.no_grad()
def evaluate(model: PhotoClassifier, n: int = 1024, seed: int = 0, batch: int = 128) -> dict:
    """Held-out (test-region) accuracy, per class, and the confusion matrix."""
    model.eval()
    data = photos("test", n, seed=seed, size=model.image_size)
    preds = torch.cat([model(data.images[i:i + batch])[1].argmax(-1) for i in range(0, n, batch)])
    conf = torch.zeros(NUM_CLASSES, NUM_CLASSES, dtype=torch.long)
    conf.index_put_((data.labels, preds), torch.ones_like(preds), accumulate=True)
    per_class = (conf.diag().float() / conf.sum(1).clamp_min(1)).tolist()
    return {"test_accuracy": float((preds == data.labels).float().mean()), "per_class_accuracy": per_class,
            "confusion": conf.tolist(), "eval_n": n}


def train_photo(cfg: PhotoTrainConfig) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    run = RunDir(cfg.out)
    model = PhotoClassifier(cfg.arch, NUM_CLASSES, cfg.image_size)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    step, _ = run.resume(model, opt)
    pbar = tqdm(total=cfg.steps, initial=step, desc="photo classifier", dynamic_ncols=True)
    model.train()
    while step < cfg.steps:
        batch = photos("train", cfg.batch_size, seed=cfg.seed * 1_000_003 + step, size=cfg.image_size)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        _, logits = model(batch.images)
        loss = F.cross_entropy(logits, batch.labels, label_smoothing=cfg.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()
        step += 1
        acc = float((logits.argmax(-1) == batch.labels).float().mean())
        pbar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.2f}")
        pbar.update(1)
        if step % 20 == 0:
            run.log({"step": step, "loss": loss.item(), "train_accuracy": acc})
        if step % cfg.save_every == 0 or step == cfg.steps:
            run.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "rng": rng_state()})
    pbar.close()
    with torch.no_grad():  # the zoo ships fp16 weights: measure the model that ships
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.half().float())
    metrics = evaluate(model, cfg.eval_n)
    run.log({"step": step, "final": True, **metrics})
    half = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    run.export("classifier.safetensors", half, model.config,
               extra={"train": asdict(cfg), "metrics": metrics})
    return {k: v for k, v in metrics.items() if k != "confusion"}
