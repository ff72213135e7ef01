"""Zoo recipe: train a LlamaGen-architecture VQ tokenizer on the embedded photos.

Loss: L2 + L1 reconstruction, codebook and commitment terms (cosine codebook), and dead-code restarts
(codes unused for ``restart_every`` steps are moved onto random encoder outputs) to keep usage high.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vgen.data import photos, to_model_range
from vgen.tokenizers.vq import VQConfig, VQModel
from vgen.train.common import RunDir, autocast, lr_at, rng_state


@dataclass
class VQTrainConfig:
    out: str = "runs/photos-vq"
    steps: int = 3000
    batch_size: int = 32
    lr: float = 4e-4
    warmup: int = 100
    precision: str = "fp32"
    seed: int = 0
    beta: float = 0.25
    l1_weight: float = 0.5
    restart_every: int = 100
    save_every: int = 100
    eval_n: int = 256
    threads: int = 0
    model: dict = field(default_factory=lambda: dict(
        codebook_size=1024, codebook_embed_dim=8, codebook_l2_norm=True, encoder_ch_mult=[1, 2, 2],
        decoder_ch_mult=[1, 2, 2], z_channels=64, ch=64))


def psnr(x: torch.Tensor, y: torch.Tensor) -> float:
    """PSNR in dB between two uint8 batches, averaged per image."""
    mse = (x.float() - y.float()).pow(2).flatten(1).mean(1).clamp_min(1e-10)
    return float((10 * torch.log10(255.0 ** 2 / mse)).mean())


@torch.no_grad()
def evaluate(model, n: int = 256, seed: int = 0, batch: int = 64) -> dict:
    """Test-split reconstruction PSNR and codebook usage of a tokenizer (VQ or multi-scale VQVAE: anything with
    ``encode_to_codes``, ``decode_codes`` and ``codebook_size``)."""
    from vgen.data import to_uint8
    model.eval()
    data = photos("test", n, seed=seed).images
    recs, codes = [], []
    for i in range(0, n, batch):
        x = to_model_range(data[i:i + batch])
        c = model.encode_to_codes(x)
        codes.append(c)
        recs.append(to_uint8(model.decode_codes(c)))
    codes = torch.cat(codes)
    usage = codes.unique().numel() / model.codebook_size
    return {"test_psnr": psnr(torch.cat(recs), data), "codebook_usage": usage}


def train_vq(cfg: VQTrainConfig) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    run = RunDir(cfg.out)
    model = VQModel(VQConfig(**cfg.model))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    last_used = torch.zeros(model.codebook_size, dtype=torch.long)
    step, state = run.resume(model, opt)
    if state is not None:
        last_used = state["last_used"]
    pbar = tqdm(total=cfg.steps, initial=step, desc="vq", dynamic_ncols=True)
    model.train()
    while step < cfg.steps:
        x = to_model_range(photos("train", cfg.batch_size, seed=cfg.seed * 1_000_003 + step).images)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        with autocast("cpu", cfg.precision):
            rec, zq, zp, idx = model(x)
        rec = rec.float()
        rec_loss = F.mse_loss(rec, x) + cfg.l1_weight * F.l1_loss(rec, x)
        q_loss = F.mse_loss(zq, zp.detach().float()) + cfg.beta * F.mse_loss(zp.float(), zq.detach())
        loss = rec_loss + q_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        last_used[idx.flatten().unique()] = step
        if cfg.restart_every and step % cfg.restart_every == 0 and step < 0.9 * cfg.steps:
            dead = (step - last_used) >= cfg.restart_every
            n_dead = int(dead.sum())
            if n_dead:
                with torch.no_grad():
                    pool = zp.detach().float().reshape(-1, zp.shape[-1])
                    pick = pool[torch.randint(0, pool.shape[0], (n_dead,))]
                    pick = pick + 0.01 * torch.randn_like(pick)
                    model.quantize.embedding.weight.data[dead] = F.normalize(pick, dim=-1)
                    last_used[dead] = step
        psnr_train = -10 * math.log10(max(F.mse_loss(rec.detach(), x).item() / 4.0, 1e-10))
        pbar.set_postfix(loss=f"{loss.item():.4f}", psnr=f"{psnr_train:.1f}")
        pbar.update(1)
        if step % 20 == 0:
            run.log({"step": step, "loss": loss.item(), "rec": rec_loss.item(), "q": q_loss.item(),
                     "train_psnr": psnr_train})
        if step % cfg.save_every == 0 or step == cfg.steps:
            run.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                      "last_used": last_used, "rng": rng_state()})
    pbar.close()
    metrics = evaluate(model, cfg.eval_n)
    run.log({"step": step, "final": True, **metrics})
    run.export("vq.safetensors", model.state_dict(), asdict(model.config),
               extra={"train": asdict(cfg), "metrics": metrics})
    return metrics
