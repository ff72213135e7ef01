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
from tqdm.auto import tqdm

from vgen.data import photos, to_model_range
from vgen.tokenizers.msvq import MSVQConfig, MultiScaleVQVAE
from vgen.train.common import RunDir, autocast, lr_at, rng_state
from vgen.train.vq import evaluate  # noqa: F401  (re-exported: the generic tokenizer evaluation)


@dataclass
class MSVQTrainConfig:
    out: str = "runs/photos-msvq"
    steps: int = 1500
    batch_size: int = 16
    lr: float = 5e-4
    warmup: int = 50
    precision: str = "fp32"
    seed: int = 0
    l1_weight: float = 0.5
    restart_every: int = 100
    save_every: int = 100
    eval_n: int = 256
    threads: int = 0
    model: dict = field(default_factory=lambda: dict(
        vocab_size=1024, z_channels=16, ch=32, ch_mult=[1, 1, 2], num_res_blocks=1,
        v_patch_nums=[1, 2, 3, 4, 6, 8, 11, 16]))


def train_msvq(cfg: MSVQTrainConfig) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    run = RunDir(cfg.out)
    model = MultiScaleVQVAE(MSVQConfig(**cfg.model))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    last_used = torch.zeros(model.codebook_size, dtype=torch.long)
    step, state = run.resume(model, opt)
    if state is not None:
        last_used = state["last_used"]
    pbar = tqdm(total=cfg.steps, initial=step, desc="msvq", dynamic_ncols=True)
    model.train()
    while step < cfg.steps:
        x = to_model_range(photos("train", cfg.batch_size, seed=cfg.seed * 1_000_003 + step).images)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        with autocast("cpu", cfg.precision):
            rec, q_loss, idx = model(x)
        rec = rec.float()
        rec_loss = F.mse_loss(rec, x) + cfg.l1_weight * F.l1_loss(rec, x)
        loss = rec_loss + q_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        last_used[torch.cat([i.flatten() for i in idx]).unique()] = step
        if cfg.restart_every and step % cfg.restart_every == 0 and step < 0.9 * cfg.steps:
            dead = (step - last_used) >= cfg.restart_every
            n_dead = int(dead.sum())
            if n_dead:
                with torch.no_grad():
                    pool = model.quantize.last_queried.detach().float()
                    pick = pool[torch.randint(0, pool.shape[0], (n_dead,))]
                    model.quantize.embedding.weight.data[dead] = pick + 0.01 * pick.std() * torch.randn_like(pick)
                    last_used[dead] = step
        psnr_train = -10 * math.log10(max(F.mse_loss(rec.detach(), x).item() / 4.0, 1e-10))
        pbar.set_postfix(loss=f"{loss.item():.4f}", psnr=f"{psnr_train:.1f}")
        pbar.update(1)
        if step % 20 == 0:
            run.log({"step": step, "loss": loss.item(), "rec": rec_loss.item(), "q": float(q_loss),
                     "train_psnr": psnr_train, "used": int((step - last_used < 20).sum())})
        if step % cfg.save_every == 0 or step == cfg.steps:
            run.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                      "last_used": last_used, "rng": rng_state()})
    pbar.close()
    metrics = evaluate(model, cfg.eval_n)
    run.log({"step": step, "final": True, **metrics})
    run.export("msvq.safetensors", model.state_dict(), model.config_dict(),
               extra={"train": asdict(cfg), "metrics": metrics})
    return metrics
