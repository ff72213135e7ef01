"""Zoo recipe: train a KL tokenizer (diffusers ``AutoencoderKL``) on the embedded photos: 64x64 -> 16x16 latents.

Loss: L2 + L1 reconstruction of a posterior draw plus a small KL term (``kl_weight`` times the KL per latent element;
the LDM recipe's KL weight is similarly small next to its reconstruction terms). After training the latents are
normalised the way MAR normalises its KL-16 tokens (``x 0.2325``): the shift and scale that give the training
latents mean 0 and standard deviation 1 are stored in the tokenizer's config (diffusers' ``shift_factor`` and
``scaling_factor``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from vgen.data import photos, to_model_range, to_uint8
from vgen.eval.psnr import psnr
from vgen.tokenizers.kl import KLConfig, KLTokenizer
from vgen.train.common import RecipeConfig, recipe, start_run, train_loop


@dataclass
class KLTrainConfig(RecipeConfig):
    out: str = "runs/photos-kl"
    steps: int = 1200
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 50
    l1_weight: float = 0.5
    kl_weight: float = 1e-5
    eval_n: int = 256
    model: dict = field(default_factory=lambda: dict(latent_channels=4, block_out_channels=[32, 64, 64],
                                                     layers_per_block=1))


@torch.no_grad()
def evaluate(model: KLTokenizer, n: int = 256, seed: int = 0, batch: int = 64) -> dict:
    """Test-split reconstruction PSNR (through the posterior mean) of a KL tokenizer."""
    model.eval()
    device = next(model.parameters()).device
    data = photos("test", n, seed=seed).images
    recs = [to_uint8(model.decode(model.encode(to_model_range(data[i:i + batch].to(device))))).cpu()
            for i in range(0, n, batch)]
    return {"test_psnr": psnr(torch.cat(recs), data)}


@torch.no_grad()
def latent_stats(model: KLTokenizer, n: int = 1024, seed: int = 1, batch: int = 128) -> tuple[float, float]:
    """Mean and standard deviation of posterior draws of training crops (all channels together)."""
    model.eval()
    device = next(model.parameters()).device
    data = photos("train", n, seed=seed).images
    g = torch.Generator(device).manual_seed(seed)
    zs = torch.cat([model.posterior(to_model_range(data[i:i + batch].to(device))).sample(g).flatten().cpu()
                    for i in range(0, n, batch)])
    return float(zs.mean()), float(zs.std())


@recipe(KLTrainConfig)
def train_kl(cfg: KLTrainConfig) -> dict:
    run, device = start_run(cfg)
    model = KLTokenizer(KLConfig(**cfg.model)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def step_fn(step):
        x = to_model_range(photos("train", cfg.batch_size, seed=cfg.seed * 1_000_003 + step).images.to(device))
        rec, post = model(x)
        kl = post.kl().mean() / post.mean[0].numel()
        rec_loss = F.mse_loss(rec, x) + cfg.l1_weight * F.l1_loss(rec, x)
        psnr_train = -10 * math.log10(max(F.mse_loss(rec.detach(), x).item() / 4.0, 1e-10))
        return rec_loss + cfg.kl_weight * kl, {"rec": rec_loss, "kl": kl, "train_psnr": psnr_train}

    step, _ = train_loop(cfg, model, opt, run, step_fn, desc="kl", clip=1.0, log_every=20,
                         bar={"loss": "{loss:.4f}", "psnr": "{train_psnr:.1f}"})
    shift, std = latent_stats(model)
    model.config.shift_factor, model.config.scaling_factor = shift, 1.0 / std
    model.vae.register_to_config(shift_factor=shift, scaling_factor=1.0 / std)
    metrics = {**evaluate(model, cfg.eval_n), "latent_mean": shift, "latent_std": std}
    run.log({"step": step, "final": True, **metrics})
    run.export("kl.safetensors", model.state_dict(), asdict(model.config),
               extra={"train": asdict(cfg), "metrics": metrics})
    return metrics
