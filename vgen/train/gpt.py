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

from vgen.data import NUM_CLASSES
from vgen.models.gpt import GPT, GPTConfig
from vgen.train.common import RecipeConfig, adamw, autocast, cached_codes, recipe, start_run, train_loop


@dataclass
class GPTTrainConfig(RecipeConfig):
    out: str = "runs/photos-gpt"
    tokenizer: str = "runs/photos-vq/vq.safetensors"
    steps: int = 1500
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 100
    precision: str = "bf16"
    n_train: int = 40000
    n_test: int = 512
    save_every: int = 100
    model: dict = field(default_factory=lambda: dict(
        dim=256, n_layer=6, n_head=4, vocab_size=1024, num_classes=NUM_CLASSES, block_size=256,
        cls_token_num=1, class_dropout_prob=0.1, token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0))


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


@recipe(GPTTrainConfig)
def train_gpt(cfg: GPTTrainConfig, model_cls=GPT, config_cls=GPTConfig, export_name: str = "gpt.safetensors",
              desc: str = "gpt", encode=None) -> dict:
    """Train a token model over the VQ codes. The same recipe trains NAR (``model_cls=NAR``): its forward also
    returns logits (B, n, V) that predict ``tokens`` (from earlier anti-diagonals instead of earlier tokens).
    ``encode(tokenizer, split, n, seed) -> (codes, labels)`` gives the data (photo crops by default; video
    recipes pass clips encoded frame by frame)."""
    from vgen.kinds import load_official
    run, device = start_run(cfg, needs=((cfg.tokenizer, "VQ tokenizer", "vq"),))
    tokenizer = load_official("vq", cfg.tokenizer, device=device).eval()
    tr_codes, tr_labels = (t.to(device) for t in cached_codes(run, tokenizer, "train", cfg.n_train, cfg.seed,
                                                              encode))
    te_codes, te_labels = (t.to(device) for t in cached_codes(run, tokenizer, "test", cfg.n_test, cfg.seed + 1,
                                                              encode))
    model = model_cls(config_cls(**cfg.model)).to(device)
    opt = adamw(model, cfg.lr, cfg.weight_decay)
    g = torch.Generator()

    def step_fn(step):
        g.manual_seed(cfg.seed * 1_000_003 + step)
        idx = torch.randint(0, tr_codes.shape[0], (cfg.batch_size,), generator=g)
        x, y = tr_codes[idx].long(), tr_labels[idx]
        with autocast(device, cfg.precision):
            logits = model(x, y)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x.reshape(-1)), {}

    def on_save(step):
        if step % (cfg.save_every * 5) == 0 or step == cfg.steps:
            tl = test_loss(model, te_codes, te_labels)
            run.log({"step": step, "test_loss": tl})
            tqdm.write(f"step {step}: test loss {tl:.4f} nats/token (perplexity {math.exp(tl):.1f})")

    step, last_loss = train_loop(cfg, model, opt, run, step_fn, desc=desc, clip=1.0, log_every=20, on_save=on_save)
    metrics = {"test_loss": test_loss(model, te_codes, te_labels), "train_loss_last": last_loss, "steps": step}
    run.log({"final": True, **metrics})
    run.export(export_name, model.state_dict(), asdict(model.config),
               extra={"train": asdict(cfg), "metrics": metrics})
    return metrics
