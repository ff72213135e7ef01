"""Zoo recipe: the video classifier behind FVD-photo.

A torchvision ``r3d_18`` (random init; the zoo's keeps its first three residual stages, 256-d pooled features)
trained from scratch on the embedded clips (``vgen.data.clips``) with three heads on its pooled features: which
photograph (16 classes), which camera motion (still, pan, zoom-in, zoom-out) and whether the frames are in order or
shuffled in time. The class head makes the features see content, the motion and order heads make them see time,
so FVD-photo notices wrong pictures, wrong movement and frames out of order. Training clips are drawn fresh every
step (seeded by the step); held-out accuracy of every head is measured on the test region of every photograph,
which training never touches.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from vgen.data import MOTIONS, NUM_CLASSES, clips
from vgen.errors import VGenError
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
    steps: int = 1000
    batch_size: int = 24
    lr: float = 1e-3
    warmup: int = 30
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    motion_weight: float = 1.0     # loss = CE(class) + motion_weight * CE(motion) + order_weight * CE(order)
    order_weight: float = 1.0      # 0: no order head (the first shipped classifier, blind to shuffled frames)
    shuffle_fraction: float = 0.5  # share of each batch whose frames are shuffled in time (order head targets)
    save_every: int = 100
    eval_n: int = 512              # test clips for the final numbers
    log_eval_n: int = 96           # test clips for the accuracies logged at every checkpoint (0: off)


def motion_ids(motions) -> torch.Tensor:
    return torch.tensor([MOTIONS.index(m) for m in motions], dtype=torch.long)


def shuffle_frames(videos: torch.Tensor, motions: torch.Tensor, fraction: float,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Shuffle the frames of a random ``fraction`` of the clips (a random permutation other than the identity,
    per clip) -> (clips, order targets: 1 = shuffled). A shuffled still shot looks ordered, so its target stays 0.
    Pure in ``generator``'s state."""
    n, t = videos.shape[:2]
    pick = torch.rand(n, generator=generator) < fraction
    out, target = videos.clone(), torch.zeros(n, dtype=torch.long)
    if t < 2:
        return out, target
    for i in pick.nonzero().flatten().tolist():
        perm = torch.randperm(t, generator=generator)
        while bool((perm == torch.arange(t)).all()):
            perm = torch.randperm(t, generator=generator)
        out[i] = videos[i, perm]
        target[i] = int(motions[i] != MOTIONS.index("still"))
    return out, target


@torch.no_grad()
def evaluate(model: VideoClassifier, n: int = 512, seed: int = 0, batch: int = 64) -> dict:
    """Held-out (test-region) accuracy of every head: class and motion (per class, per motion, the motion
    confusion matrix) on the clips as they are; with an order head, ordered-vs-shuffled accuracy on a second pass
    in which half of the moving clips have their frames shuffled. Leaves the model in the mode it found it in."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    data = clips("test", n, seed=seed, frames=model.frames, size=model.image_size)
    motions = motion_ids(data.motions)
    cls, mot, order = [], [], []
    for i in range(0, n, batch):
        f, c, m = model(data.videos[i:i + batch].to(device))
        cls.append(c.argmax(-1).cpu())
        mot.append(m.argmax(-1).cpu())
    out = {}
    if model.order:
        g = torch.Generator().manual_seed(seed + 1)
        moving = motions != MOTIONS.index("still")
        shuffled, target = shuffle_frames(data.videos[moving], motions[moving], 0.5, g)
        for i in range(0, len(shuffled), batch):
            order.append(model.order_head(model(shuffled[i:i + batch].to(device))[0]).argmax(-1).cpu())
        order = torch.cat(order)
        out = {"test_order_accuracy": float((order == target).float().mean()),
               "test_order_accuracy_shuffled": float((order[target == 1] == 1).float().mean()),
               "test_order_accuracy_ordered": float((order[target == 0] == 0).float().mean())}
    model.train(was_training)
    cls, mot = torch.cat(cls), torch.cat(mot)
    conf = torch.zeros(len(MOTIONS), len(MOTIONS), dtype=torch.long)
    conf.index_put_((motions, mot), torch.ones_like(mot), accumulate=True)
    per_class = [float((cls[data.labels == c] == c).float().mean()) if (data.labels == c).any() else 0.0
                 for c in range(NUM_CLASSES)]
    return {"test_accuracy": float((cls == data.labels).float().mean()),
            "test_motion_accuracy": float((mot == motions).float().mean()), **out,
            "per_class_accuracy": per_class,
            "per_motion_accuracy": dict(zip(MOTIONS, (conf.diag().float() / conf.sum(1).clamp_min(1)).tolist())),
            "motion_confusion": conf.tolist(), "eval_n": n}


@recipe(VideoClassifierTrainConfig)
def train_video_classifier(cfg: VideoClassifierTrainConfig) -> dict:
    if not 0.0 <= cfg.shuffle_fraction < 1.0:
        raise VGenError(f"shuffle_fraction must be in [0, 1), got {cfg.shuffle_fraction}: the share of each batch "
                        "whose frames are shuffled")
    run, device = start_run(cfg)
    order = cfg.order_weight > 0
    model = VideoClassifier(cfg.arch, NUM_CLASSES, len(MOTIONS), cfg.frames, cfg.image_size, cfg.stages,
                            cfg.differences, order=order).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)

    def step_fn(step):
        batch = clips("train", cfg.batch_size, seed=cfg.seed * 1_000_003 + step, frames=cfg.frames,
                      size=cfg.image_size)
        videos, motions = batch.videos, motion_ids(batch.motions)
        target = torch.zeros(len(videos), dtype=torch.long)
        if order:  # shuffled clips keep their photograph; their motion is undefined, so only ordered ones teach it
            g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
            videos, target = shuffle_frames(videos, motions, cfg.shuffle_fraction, g)
        shuffled = (videos != batch.videos).flatten(1).any(1)
        videos, labels, motions = videos.to(device), batch.labels.to(device), motions.to(device)
        feats, cl, ml = model(videos)
        keep = (~shuffled).to(device)
        loss = (F.cross_entropy(cl, labels, label_smoothing=cfg.label_smoothing)
                + cfg.motion_weight * F.cross_entropy(ml[keep], motions[keep], label_smoothing=cfg.label_smoothing))
        logs = {"train_accuracy": float((cl.argmax(-1) == labels).float().mean()),
                "train_motion_accuracy": float((ml[keep].argmax(-1) == motions[keep]).float().mean())}
        if order:
            ol, target = model.order_head(feats), target.to(device)
            loss = loss + cfg.order_weight * F.cross_entropy(ol, target, label_smoothing=cfg.label_smoothing)
            logs["train_order_accuracy"] = float((ol.argmax(-1) == target).float().mean())
        return loss, logs

    def on_save(step):
        if cfg.log_eval_n:
            m = evaluate(model, cfg.log_eval_n)
            run.log({"step": step, **{k: v for k, v in m.items() if k.startswith("test_")},
                     "eval_n": cfg.log_eval_n})

    step, _ = train_loop(cfg, model, opt, run, step_fn, desc="video classifier", clip=2.0, log_every=10,
                         bar={"loss": "{loss:.3f}", "acc": "{train_accuracy:.2f}",
                              "motion": "{train_motion_accuracy:.2f}",
                              **({"order": "{train_order_accuracy:.2f}"} if order else {})}, on_save=on_save)
    with torch.no_grad():  # the zoo ships fp16 weights: measure the model that ships
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.half().float())
    metrics = evaluate(model, cfg.eval_n)
    run.log({"step": step, "final": True, **metrics})
    half = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    run.export("classifier.safetensors", half, model.config, extra={"train": asdict(cfg), "metrics": metrics})
    return {k: v for k, v in metrics.items() if k != "motion_confusion"}
