"""Zoo recipe: train a continuous-token model (CAR, or MAR) over a trained KL tokenizer's latents.

The photo crops are encoded once: each crop's posterior mean and standard deviation (scaled as tokens, fp16) are
cached next to the run as ``latents_<split>.pt``; every training step draws fresh tokens from those posteriors (MAR
trains on posterior draws the same way). The loss is MAR's diffusion loss (noise MSE + variational bound), with
label dropout for classifier-free guidance.
"""
from __future__ import annotations

import io
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from vgen.data import photos, to_model_range
from vgen.io import atomic_write_bytes
from vgen.train.common import RecipeConfig, RunDir, adamw, recipe, start_run, train_loop


@dataclass
class ContinuousTrainConfig(RecipeConfig):
    out: str = "runs/photos-car"
    kind: str = "car"                       # car (causal, raster order) | mar (bidirectional, masked)
    tokenizer: str = "runs/photos-kl/kl.safetensors"
    steps: int = 800
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 50
    n_train: int = 16000
    n_test: int = 256
    save_every: int = 100
    # the model's constructor fields (no defaults here: Hydra would merge a CAR default into a MAR config)
    model: dict = field(default_factory=dict)


@torch.no_grad()
def encode_latents(tokenizer, split: str, n: int, seed: int, batch: int = 128, size: int = 64) -> dict:
    """``n`` photo crops of ``size`` pixels -> posterior mean and std as tokens (n, L, C) fp16, and labels."""
    device = next(tokenizer.parameters()).device
    data = photos(split, n, seed=seed, size=size)
    means, stds = [], []
    for i in tqdm(range(0, n, batch), desc=f"encode {split}", leave=False):
        post = tokenizer.posterior(to_model_range(data.images[i:i + batch].to(device)))
        means.append(tokenizer.to_tokens(post.mean).flatten(1, 2).half().cpu())
        stds.append((post.std * tokenizer.config.scaling_factor).permute(0, 2, 3, 1).flatten(1, 2).half().cpu())
    return {"mean": torch.cat(means), "std": torch.cat(stds), "labels": data.labels}


def cached_latents(run: RunDir, tokenizer, split: str, n: int, seed: int, size: int = 64) -> dict:
    path = run.path / f"latents_{split}.pt"
    if path.exists():
        d = torch.load(path, weights_only=True)
        if d["mean"].shape[0] == n:
            return d
    d = encode_latents(tokenizer, split, n, seed, size=size)
    buf = io.BytesIO()
    torch.save(d, buf)
    atomic_write_bytes(path, buf.getvalue())
    return d


def draw(d: dict, idx: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    mean, std = d["mean"][idx].float(), d["std"][idx].float()
    return mean + std * torch.randn(mean.shape, generator=g), d["labels"][idx]


@torch.no_grad()
def test_loss(model, d: dict, batch: int = 64, seed: int = 0) -> float:
    """The diffusion loss on held-out latents, at fixed timesteps and noise (comparable between runs)."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    dev = next(model.parameters()).device
    tot, n = 0.0, 0
    for i in range(0, d["mean"].shape[0], batch):
        idx = torch.arange(i, min(i + batch, d["mean"].shape[0]))
        x, y = draw(d, idx, g)
        tot += model.loss(x.to(dev), y.to(dev)).item() * len(idx)
        n += len(idx)
    torch.set_rng_state(state)
    model.train()
    return tot / n


@recipe(ContinuousTrainConfig)
def train_continuous(cfg: ContinuousTrainConfig) -> dict:
    from vgen.kinds import build, load_official
    run, device = start_run(cfg, needs=((cfg.tokenizer, "KL tokenizer", "kl"),))
    tokenizer = load_official("kl", cfg.tokenizer, device=device).eval()
    train = cached_latents(run, tokenizer, "train", cfg.n_train, cfg.seed)
    test = cached_latents(run, tokenizer, "test", cfg.n_test, cfg.seed + 1)
    model = build(cfg.kind, **cfg.model).to(device)
    opt = adamw(model, cfg.lr, cfg.weight_decay)
    g = torch.Generator()

    def step_fn(step):
        g.manual_seed(cfg.seed * 1_000_003 + step)
        idx = torch.randint(0, train["mean"].shape[0], (cfg.batch_size,), generator=g)
        x, y = draw(train, idx, g)
        return model.loss(x.to(device), y.to(device)), {}

    def on_save(step):
        if step % (cfg.save_every * 4) == 0 or step == cfg.steps:
            tl = test_loss(model, test)
            run.log({"step": step, "test_loss": tl})
            tqdm.write(f"step {step}: test diffusion loss {tl:.4f}")

    step, last_loss = train_loop(cfg, model, opt, run, step_fn, desc=cfg.kind, clip=1.0, log_every=20,
                                 on_save=on_save)
    metrics = {"test_loss": test_loss(model, test), "train_loss_last": last_loss, "steps": step,
               "params": sum(p.numel() for p in model.parameters())}
    run.log({"final": True, **metrics})
    run.export(f"{cfg.kind}.safetensors", model.state_dict(), asdict(model.config),
               extra={"train": asdict(cfg), "metrics": metrics})
    return metrics
