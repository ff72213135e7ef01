"""Zoo recipe: train a class-conditional VAR over a trained multi-scale VQVAE's codes.

Photo crops are encoded once into their token pyramids (cached next to the run as ``codes_<split>.pt``); each
step rebuilds the teacher-forcing input (coarser scales' f_hat, area-downsampled) from the codes with the
tokenizer's quantizer and trains on the cross-entropy of every scale, with label dropout for guidance.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vgen.data import NUM_CLASSES
from vgen.models.var import VAR, VARConfig
from vgen.train.common import RecipeConfig, autocast, cached_codes, recipe, start_run, train_loop


@dataclass
class VARTrainConfig(RecipeConfig):
    out: str = "runs/photos-var"
    tokenizer: str = "runs/photos-msvq/msvq.safetensors"
    steps: int = 800
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 50
    precision: str = "fp32"
    n_train: int = 24000
    n_test: int = 512
    save_every: int = 50
    model: dict = field(default_factory=lambda: dict(
        vocab_size=1024, Cvae=16, depth=6, embed_dim=256, num_heads=4, num_classes=NUM_CLASSES,
        patch_nums=[1, 2, 3, 4, 6, 8, 11, 16], cond_drop_rate=0.1))


def _split(codes: torch.Tensor, patch_nums) -> list[torch.Tensor]:
    return list(codes.long().split([p * p for p in patch_nums], dim=1))


@torch.no_grad()
def test_loss(model: VAR, tokenizer, codes: torch.Tensor, labels: torch.Tensor, batch: int = 64) -> dict:
    """Mean cross-entropy (nats/token) on held-out pyramids, overall and per scale."""
    was = model.training
    model.eval()
    pn = model.patch_nums
    per_scale = torch.zeros(len(pn))
    n = 0
    for i in range(0, codes.shape[0], batch):
        idx = _split(codes[i:i + batch], pn)
        logits = model(labels[i:i + batch], tokenizer.quantize.teacher_input(idx))
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.cat(idx, 1).reshape(-1),
                             reduction="none").view(logits.shape[0], -1)
        per_scale += torch.stack([c.sum() for c in ce.split([p * p for p in pn], dim=1)]).cpu()
        n += logits.shape[0]
    model.train(was)
    counts = torch.tensor([p * p for p in pn], dtype=torch.float)
    return {"test_loss": float(per_scale.sum() / (n * counts.sum())),
            "test_loss_per_scale": [round(float(x), 4) for x in per_scale / (n * counts)]}


@recipe(VARTrainConfig)
def train_var(cfg: VARTrainConfig) -> dict:
    from vgen.kinds import load_official
    run, device = start_run(cfg, needs=((cfg.tokenizer, "multi-scale VQVAE", "msvq"),))
    tokenizer = load_official("msvq", cfg.tokenizer, device=device).eval()
    for p in tokenizer.parameters():
        p.requires_grad_(False)
    tr_codes, tr_labels = (t.to(device) for t in cached_codes(run, tokenizer, "train", cfg.n_train, cfg.seed))
    te_codes, te_labels = (t.to(device) for t in cached_codes(run, tokenizer, "test", cfg.n_test, cfg.seed + 1))
    model = VAR(VARConfig(**cfg.model)).init_weights().to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "pos_" not in n and "emb" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "pos_" not in n and "emb" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    g = torch.Generator()

    def step_fn(step):
        g.manual_seed(cfg.seed * 1_000_003 + step)
        pick = torch.randint(0, tr_codes.shape[0], (cfg.batch_size,), generator=g)
        idx, y = _split(tr_codes[pick], model.patch_nums), tr_labels[pick]
        with torch.no_grad():
            x_in = tokenizer.quantize.teacher_input(idx)
        with autocast(device, cfg.precision):
            logits = model(y, x_in)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), torch.cat(idx, 1).reshape(-1)), {}

    def on_save(step):
        if step % (cfg.save_every * 4) == 0 or step == cfg.steps:
            tl = test_loss(model, tokenizer, te_codes, te_labels)
            run.log({"step": step, **tl})
            tqdm.write(f"step {step}: test loss {tl['test_loss']:.4f} nats/token "
                       f"(perplexity {math.exp(tl['test_loss']):.1f}); per scale {tl['test_loss_per_scale']}")

    step, last_loss = train_loop(cfg, model, opt, run, step_fn, desc="var", clip=2.0, log_every=10, on_save=on_save)
    metrics = {**test_loss(model, tokenizer, te_codes, te_labels), "train_loss_last": last_loss, "steps": step}
    run.log({"final": True, **metrics})
    run.export("var.safetensors", model.state_dict(), model.config_dict(),
               extra={"train": asdict(cfg), "metrics": metrics})
    return metrics
