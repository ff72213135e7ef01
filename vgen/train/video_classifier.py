"""Zoo recipe: the video classifier behind FVD-photo.

A torchvision ``r3d_18`` (random init; the zoo's keeps its first three residual stages, 256-d pooled features)
trained from scratch on the embedded clips (``vgen.data.clips``) with two heads on its pooled features: which photograph (16 classes) and which camera motion (still, pan, zoom-in,
zoom-out). The class head makes the features see content, the motion head makes them see time, so FVD-photo
notices both wrong pictures and wrong movement. Training clips are drawn fresh every step (seeded by the step);
held-out accuracy of both heads is measured on the test region of every photograph, which training never touches.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from vgen.data import MOTIONS, NUM_CLASSES, clips
from vgen.eval.video_extractors import VideoClassifier
from vgen.train.common import RecipeConfig, recipe, start_run, train_loop


@dataclass
class VideoClassifierTrainConfig(RecipeConfig):
    out: str = "runs/video-classifier"
    arch: str = "r3d_18"
    stages: int = 3                # residual stages kept (4 = the whole network; 3: 256-d features, 7 MB fp16)
    differences: bool = True       # the stem also sees frame differences (without: the motion head stayed at chance)
    frames: int = 8
    image_size: int = 32
    steps: int = 600
    batch_size: int = 24
    lr: float = 1e-3
    warmup: int = 30
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    motion_weight: float = 1.0     # loss = CE(class) + motion_weight * CE(motion)
    save_every: int = 100
    eval_n: int = 512              # test clips for the final numbers
    log_eval_n: int = 96           # test clips for the accuracies logged at every checkpoint (0: off)


def motion_ids(motions) -> torch.Tensor:
    return torch.tensor([MOTIONS.index(m) for m in motions], dtype=torch.long)


@torch.no_grad()
def evaluate(model: VideoClassifier, n: int = 512, seed: int = 0, batch: int = 64) -> dict:
    """Held-out (test-region) accuracy of both heads, per class and per motion, and the motion confusion
    matrix. Leaves the model in the mode it found it in."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    data = clips("test", n, seed=seed, frames=model.frames, size=model.image_size)
    cls, mot = [], []
    for i in range(0, n, batch):
        _, c, m = model(data.videos[i:i + batch].to(device))
        cls.append(c.argmax(-1).cpu())
        mot.append(m.argmax(-1).cpu())
    model.train(was_training)
    cls, mot, motions = torch.cat(cls), torch.cat(mot), motion_ids(data.motions)
    conf = torch.zeros(len(MOTIONS), len(MOTIONS), dtype=torch.long)
    conf.index_put_((motions, mot), torch.ones_like(mot), accumulate=True)
    per_class = [float((cls[data.labels == c] == c).float().mean()) if (data.labels == c).any() else 0.0
                 for c in range(NUM_CLASSES)]
    return {"test_accuracy": float((cls == data.labels).float().mean()),
            "test_motion_accuracy": float((mot == motions).float().mean()),
            "per_class_accuracy": per_class,
            "per_motion_accuracy": dict(zip(MOTIONS, (conf.diag().float() / conf.sum(1).clamp_min(1)).tolist())),
            "motion_confusion": conf.tolist(), "eval_n": n}


@recipe(VideoClassifierTrainConfig)
def train_video_classifier(cfg: VideoClassifierTrainConfig) -> dict:
    run, device = start_run(cfg)
    model = VideoClassifier(cfg.arch, NUM_CLASSES, len(MOTIONS), cfg.frames, cfg.image_size, cfg.stages,
                            cfg.differences).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)

    def step_fn(step):
        batch = clips("train", cfg.batch_size, seed=cfg.seed * 1_000_003 + step, frames=cfg.frames,
                      size=cfg.image_size)
        videos, labels, motions = batch.videos.to(device), batch.labels.to(device), motion_ids(batch.motions).to(device)
        _, cl, ml = model(videos)
        loss = (F.cross_entropy(cl, labels, label_smoothing=cfg.label_smoothing)
                + cfg.motion_weight * F.cross_entropy(ml, motions, label_smoothing=cfg.label_smoothing))
        return loss, {"train_accuracy": float((cl.argmax(-1) == labels).float().mean()),
                      "train_motion_accuracy": float((ml.argmax(-1) == motions).float().mean())}

    def on_save(step):
        if cfg.log_eval_n:
            m = evaluate(model, cfg.log_eval_n)
            run.log({"step": step, "test_accuracy": m["test_accuracy"],
                     "test_motion_accuracy": m["test_motion_accuracy"], "eval_n": cfg.log_eval_n})

    step, _ = train_loop(cfg, model, opt, run, step_fn, desc="video classifier", clip=2.0, log_every=10,
                         bar={"loss": "{loss:.3f}", "acc": "{train_accuracy:.2f}",
                              "motion": "{train_motion_accuracy:.2f}"}, on_save=on_save)
    with torch.no_grad():  # the zoo ships fp16 weights: measure the model that ships
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.half().float())
    metrics = evaluate(model, cfg.eval_n)
    run.log({"step": step, "final": True, **metrics})
    half = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    run.export("classifier.safetensors", half, model.config, extra={"train": asdict(cfg), "metrics": metrics})
    return {k: v for k, v in metrics.items() if k != "motion_confusion"}
