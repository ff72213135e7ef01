"""Zoo recipe: train a LlamaGen-architecture VQ tokenizer on the embedded photos.

``data=captioned`` trains on photos-t2i's captioned crops (:mod:`vgen.data.captions`: tinted, black-and-white,
brightened and darkened crops among the plain ones); ``init=<vq.safetensors>`` starts from a trained tokenizer
(its architecture replaces ``model``), e.g. fine-tuning photos-gpt's tokenizer so that its codes keep what the
captions say. With ``data=captioned`` the evaluation also reports how often a round trip keeps each crop's colour
and brightness, measured as the prompt accuracy measures them.

Loss: L2 + L1 reconstruction, codebook and commitment terms (cosine codebook), and dead-code restarts
(codes unused for ``restart_every`` steps are moved onto random encoder outputs) to keep usage high.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from vgen.data import CROP_SETS, crops, to_model_range
from vgen.errors import VGenError
from vgen.eval.psnr import psnr
from vgen.tokenizers.vq import VQConfig, VQModel
from vgen.train.common import RecipeConfig, autocast, recipe, start_run, train_loop


@dataclass
class VQTrainConfig(RecipeConfig):
    out: str = "runs/photos-vq"
    steps: int = 3000
    batch_size: int = 32
    lr: float = 4e-4
    warmup: int = 100
    precision: str = "fp32"
    beta: float = 0.25
    l1_weight: float = 0.5
    restart_every: int = 100
    save_every: int = 100
    eval_n: int = 256
    data: str = "photos"  # photos | captioned (photos-t2i's crops, treatments included)
    init: str = ""        # a trained VQ to start from ('' = from scratch; its architecture replaces model)
    model: dict = field(default_factory=lambda: dict(
        codebook_size=1024, codebook_embed_dim=8, codebook_l2_norm=True, encoder_ch_mult=[1, 2, 2],
        decoder_ch_mult=[1, 2, 2], z_channels=64, ch=64))


@torch.no_grad()
def evaluate(model, n: int = 256, seed: int = 0, batch: int = 64, data: str = "photos") -> dict:
    """Test-split reconstruction PSNR and codebook usage of a tokenizer (VQ or multi-scale VQVAE: anything with
    ``encode_to_codes``, ``decode_codes`` and ``codebook_size``); ``data="captioned"``: on captioned test crops,
    plus the share of round trips that keep each crop's colour and brightness."""
    from vgen.data import to_uint8
    model.eval()
    device = next(model.parameters()).device
    test = crops(data, "test", n, seed)
    recs, codes = [], []
    for i in range(0, n, batch):
        x = to_model_range(test.images[i:i + batch].to(device))
        c = model.encode_to_codes(x)
        codes.append(c)
        recs.append(to_uint8(model.decode_codes(c)).cpu())
    codes = torch.cat(codes)
    usage = codes.unique().numel() / model.codebook_size
    recs = torch.cat(recs)
    out = {"test_psnr": psnr(recs, test.images), "codebook_usage": usage}
    if data == "captioned":
        out.update(treatments_kept(recs, test.facts))
    return out


def treatments_kept(images: torch.Tensor, facts) -> dict:
    """Share of ``images`` whose measured colour / brightness equals their crop's fact (the prompt-accuracy
    measures of :mod:`vgen.data.captions`), overall and per value."""
    from vgen.data.captions import measure_brightness, measure_colour
    out = {}
    for key, got in (("colour", measure_colour(images)), ("brightness", measure_brightness(images))):
        hits: dict[str, list[bool]] = {}
        for f, m in zip(facts, got):
            hits.setdefault(getattr(f, key), []).append(m == getattr(f, key))
        out[f"{key}_kept"] = sum(map(sum, hits.values())) / len(facts)
        out[f"{key}_kept_by_value"] = {k: sum(v) / len(v) for k, v in sorted(hits.items())}
    return out


@recipe(VQTrainConfig)
def train_vq(cfg: VQTrainConfig) -> dict:
    if cfg.data not in CROP_SETS:
        raise VGenError(f"recipe.data must be {' or '.join(CROP_SETS)}, got {cfg.data!r}")
    run, device = start_run(cfg, needs=((cfg.init, "VQ tokenizer to start from", "vq"),) if cfg.init else ())
    if cfg.init:
        from vgen.kinds import load_official
        model = load_official("vq", cfg.init, device=device).train()
    else:
        model = VQModel(VQConfig(**cfg.model)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    last_used = torch.zeros(model.codebook_size, dtype=torch.long, device=device)  # step each code was last used
    fwd = {}  # this step's encoder outputs and codes, for the restarts after the optimiser step

    def step_fn(step):
        x = to_model_range(crops(cfg.data, "train", cfg.batch_size, cfg.seed * 1_000_003 + step).images.to(device))
        with autocast(device, cfg.precision):
            rec, zq, zp, fwd["idx"] = model(x)
        fwd["zp"] = zp
        rec = rec.float()
        rec_loss = F.mse_loss(rec, x) + cfg.l1_weight * F.l1_loss(rec, x)
        q_loss = F.mse_loss(zq, zp.detach().float()) + cfg.beta * F.mse_loss(zp.float(), zq.detach())
        psnr_train = -10 * math.log10(max(F.mse_loss(rec.detach(), x).item() / 4.0, 1e-10))
        return rec_loss + q_loss, {"rec": rec_loss, "q": q_loss, "train_psnr": psnr_train}

    def after_step(step):  # dead-code restarts: unused codes move onto this batch's encoder outputs
        last_used[fwd["idx"].flatten().unique()] = step
        if cfg.restart_every and step % cfg.restart_every == 0 and step < 0.9 * cfg.steps:
            dead = (step - last_used) >= cfg.restart_every
            n_dead = int(dead.sum())
            if n_dead:
                with torch.no_grad():
                    zp = fwd["zp"]
                    pool = zp.detach().float().reshape(-1, zp.shape[-1])
                    pick = pool[torch.randint(0, pool.shape[0], (n_dead,))]
                    pick = pick + 0.01 * torch.randn_like(pick)
                    model.quantize.embedding.weight.data[dead] = F.normalize(pick, dim=-1)
                    last_used[dead] = step

    step, _ = train_loop(cfg, model, opt, run, step_fn, desc="vq", clip=1.0, log_every=20,
                         bar={"loss": "{loss:.4f}", "psnr": "{train_psnr:.1f}"}, after_step=after_step,
                         extra_state={"last_used": last_used})
    metrics = evaluate(model, cfg.eval_n, data=cfg.data)
    run.log({"step": step, "final": True, **metrics})
    run.export("vq.safetensors", model.state_dict(), asdict(model.config),
               extra={"train": asdict(cfg), "metrics": metrics})
    return metrics
