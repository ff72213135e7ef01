"""Zoo recipe: train VAR's multi-scale VQVAE on the embedded photos (64x64 -> scales 1..16).

Loss: L2 + L1 reconstruction and VAR's multi-scale VQ loss (commitment + codebook, averaged over scales), with
dead-code restarts: codes no scale used for ``restart_every`` steps move onto residual vectors some scale
looked up, so the codebook stays in use.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from vgen.data import photos, to_model_range
from vgen.tokenizers.msvq import MSVQConfig, MultiScaleVQVAE
from vgen.train.common import RecipeConfig, autocast, recipe, start_run, train_loop
from vgen.train.vq import evaluate


@dataclass
class MSVQTrainConfig(RecipeConfig):
    out: str = "runs/photos-msvq"
    steps: int = 1500
    batch_size: int = 16
    lr: float = 5e-4
    warmup: int = 50
    precision: str = "fp32"
    l1_weight: float = 0.5
    restart_every: int = 100
    save_every: int = 100
    eval_n: int = 256
    model: dict = field(default_factory=lambda: dict(
        vocab_size=1024, z_channels=16, ch=32, ch_mult=[1, 1, 2], num_res_blocks=1,
        v_patch_nums=[1, 2, 3, 4, 6, 8, 11, 16]))


@recipe(MSVQTrainConfig)
def train_msvq(cfg: MSVQTrainConfig) -> dict:
    run, device = start_run(cfg)
    model = MultiScaleVQVAE(MSVQConfig(**cfg.model)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    last_used = torch.zeros(model.codebook_size, dtype=torch.long, device=device)  # step each code was last used
    fwd = {}  # this step's codes (every scale), for the restarts after the optimiser step

    def step_fn(step):
        x = to_model_range(photos("train", cfg.batch_size, seed=cfg.seed * 1_000_003 + step).images.to(device))
        with autocast(device, cfg.precision):
            rec, q_loss, fwd["idx"] = model(x)
        rec = rec.float()
        rec_loss = F.mse_loss(rec, x) + cfg.l1_weight * F.l1_loss(rec, x)
        psnr_train = -10 * math.log10(max(F.mse_loss(rec.detach(), x).item() / 4.0, 1e-10))
        return rec_loss + q_loss, {"rec": rec_loss, "q": q_loss, "train_psnr": psnr_train}

    def after_step(step):  # dead-code restarts onto residuals some scale looked up this step
        last_used[torch.cat([i.flatten() for i in fwd["idx"]]).unique()] = step
        if cfg.restart_every and step % cfg.restart_every == 0 and step < 0.9 * cfg.steps:
            dead = (step - last_used) >= cfg.restart_every
            n_dead = int(dead.sum())
            if n_dead:
                with torch.no_grad():
                    pool = model.quantize.last_queried.detach().float()
                    pick = pool[torch.randint(0, pool.shape[0], (n_dead,))]
                    model.quantize.embedding.weight.data[dead] = pick + 0.01 * pick.std() * torch.randn_like(pick)
                    last_used[dead] = step
        return {"used": int((step - last_used < 20).sum())}

    step, _ = train_loop(cfg, model, opt, run, step_fn, desc="msvq", clip=1.0, log_every=20,
                         bar={"loss": "{loss:.4f}", "psnr": "{train_psnr:.1f}"}, after_step=after_step,
                         extra_state={"last_used": last_used})
    metrics = evaluate(model, cfg.eval_n)
    run.log({"step": step, "final": True, **metrics})
    run.export("msvq.safetensors", model.state_dict(), model.config_dict(),
               extra={"train": asdict(cfg), "metrics": metrics})
    return metrics
