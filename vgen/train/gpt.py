"""Zoo recipe: train a class-conditional LlamaGen GPT over a trained VQ tokenizer's codes.

The photo crops are encoded once (cached next to the run as ``codes_<split>.pt``); training then runs on
token sequences with label dropout for classifier-free guidance.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vgen.data import NUM_CLASSES, photos, to_model_range
from vgen.models.gpt import GPT, GPTConfig
from vgen.train.common import RunDir, autocast, lr_at, rng_state


@dataclass
class GPTTrainConfig:
    out: str = "runs/photos-gpt"
    tokenizer: str = "runs/photos-vq/vq.safetensors"
    steps: int = 1500
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 100
    precision: str = "bf16"
    seed: int = 0
    n_train: int = 40000
    n_test: int = 512
    save_every: int = 100
    threads: int = 0
    model: dict = field(default_factory=lambda: dict(
        dim=256, n_layer=6, n_head=4, vocab_size=1024, num_classes=NUM_CLASSES, block_size=256,
        cls_token_num=1, class_dropout_prob=0.1, token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0))


@torch.no_grad()
def encode_split(tokenizer, split: str, n: int, seed: int, batch: int = 128, desc: str = "encode"):
    """Encode ``n`` photo crops of a split into (codes int16 (n, L), labels int64 (n,))."""
    data = photos(split, n, seed=seed)
    codes = []
    for i in tqdm(range(0, n, batch), desc=f"{desc} {split}", leave=False):
        codes.append(tokenizer.encode_to_codes(to_model_range(data.images[i:i + batch])).to(torch.int16))
    return torch.cat(codes), data.labels


def _cached_codes(run: RunDir, tokenizer, split, n, seed):
    path = run.path / f"codes_{split}.pt"
    if path.exists():
        d = torch.load(path, weights_only=True)
        if d["codes"].shape[0] == n:
            return d["codes"], d["labels"]
    codes, labels = encode_split(tokenizer, split, n, seed)
    import io
    buf = io.BytesIO()
    torch.save({"codes": codes, "labels": labels}, buf)
    from vgen.io import atomic_write_bytes
    atomic_write_bytes(path, buf.getvalue())
    return codes, labels


@torch.no_grad()
def test_loss(model: GPT, codes: torch.Tensor, labels: torch.Tensor, batch: int = 64) -> float:
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, codes.shape[0], batch):
        x, y = codes[i:i + batch].long(), labels[i:i + batch]
        logits = model(x, y)
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1), reduction="sum").item()
        n += x.numel()
    model.train()
    return tot / n


def train_gpt(cfg: GPTTrainConfig, model_cls=GPT, config_cls=GPTConfig, export_name: str = "gpt.safetensors",
              desc: str = "gpt") -> dict:
    """Train a token model over the VQ codes. The same loop trains NAR (``model_cls=NAR``): its forward also
    returns logits (B, n, V) that predict ``tokens`` (from earlier anti-diagonals instead of earlier tokens)."""
    from vgen.models import load_official
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    run = RunDir(cfg.out)
    tokenizer = load_official("vq", cfg.tokenizer).eval()
    tr_codes, tr_labels = _cached_codes(run, tokenizer, "train", cfg.n_train, cfg.seed)
    te_codes, te_labels = _cached_codes(run, tokenizer, "test", cfg.n_test, cfg.seed + 1)
    model = model_cls(config_cls(**cfg.model))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    step, _ = run.resume(model, opt)
    g = torch.Generator().manual_seed(cfg.seed)
    pbar = tqdm(total=cfg.steps, initial=step, desc=desc, dynamic_ncols=True)
    model.train()
    while step < cfg.steps:
        g.manual_seed(cfg.seed * 1_000_003 + step)
        idx = torch.randint(0, tr_codes.shape[0], (cfg.batch_size,), generator=g)
        x, y = tr_codes[idx].long(), tr_labels[idx]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        with autocast("cpu", cfg.precision):
            logits = model(x, y)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        pbar.set_postfix(loss=f"{loss.item():.3f}")
        pbar.update(1)
        if step % 20 == 0:
            run.log({"step": step, "loss": loss.item()})
        if step % cfg.save_every == 0 or step == cfg.steps:
            run.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "rng": rng_state()})
            if step % (cfg.save_every * 5) == 0 or step == cfg.steps:
                tl = test_loss(model, te_codes, te_labels)
                run.log({"step": step, "test_loss": tl})
                pbar.write(f"step {step}: test loss {tl:.4f} nats/token (perplexity {math.exp(tl):.1f})")
    pbar.close()
    metrics = {"test_loss": test_loss(model, te_codes, te_labels), "train_loss_last": loss.item(), "steps": step}
    run.log({"final": True, **metrics})
    run.export(export_name, model.state_dict(), asdict(model.config),
               extra={"train": asdict(cfg), "metrics": metrics})
    return metrics
