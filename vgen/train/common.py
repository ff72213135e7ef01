"""Pieces every zoo recipe shares: the training loop, atomic checkpoints, resume, LR schedule, autocast, logging."""
from __future__ import annotations

import io
import json
import math
import os
import time
from contextlib import nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from vgen import validate
from vgen.errors import VGenError
from vgen.io import atomic_write_bytes, save_safetensors


def lr_at(step: int, total: int, base: float, warmup: int, final_frac: float = 0.1) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def autocast(device: str | torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    if precision == "fp32":
        return nullcontext()
    raise ValueError(f"precision must be 'bf16' or 'fp32', got {precision!r}")


def train_device(name) -> torch.device:
    """The device a recipe's ``device`` field names, checked up front (``vgen.validate.device``)."""
    return validate.device(name)


@dataclass
class RecipeConfig:
    """Fields every zoo recipe has; each recipe's config subclasses it with its own defaults and fields."""
    out: str = "runs/recipe"       # run folder: last.pt (resumable), log.jsonl, the exported safetensors
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    warmup: int = 50
    precision: str = "fp32"        # fp32 | bf16 (autocast; slow on AVX2-only CPUs)
    seed: int = 0
    save_every: int = 100
    threads: int = 0               # torch threads (0: torch's default)
    device: str = "cpu"            # cpu | cuda | cuda:N


def adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.95) with weight decay on matrices only (not on norms, biases or 1-D tables)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


_RECIPES: dict[type, Callable] = {}


def recipe(config_cls: type):
    """Decorator: ``fn`` trains the recipe configured by ``config_cls`` (``vgen train recipe=...`` dispatches on the
    config's type; registered where the recipe is defined)."""
    def deco(fn):
        _RECIPES[config_cls] = fn
        return fn
    return deco


_ACCEPTED: ContextVar[Callable | None] = ContextVar("accepted", default=None)


def check_config(cfg) -> None:
    """The fields every recipe shares, checked before any work (one-line errors): counts in range, a finite
    positive learning rate, a known precision and device, a run folder that can be written."""
    import numbers
    for key, low in (("steps", 0), ("batch_size", 1), ("warmup", 0), ("save_every", 1), ("threads", 0), ("seed", 0)):
        v = getattr(cfg, key, None)
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low):
            raise VGenError(f"recipe.{key} must be a whole number >= {low}, got {v!r}")
    for key in ("lr", "weight_decay"):
        v = getattr(cfg, key, None)
        if v is not None and (not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0
                              or (key == "lr" and v == 0)):
            raise VGenError(f"recipe.{key} must be a finite number {'> 0' if key == 'lr' else '>= 0'}, got {v!r}")
    if getattr(cfg, "precision", "fp32") not in ("fp32", "bf16"):
        raise VGenError(f"recipe.precision must be fp32 or bf16, got {cfg.precision!r}")
    validate.device(cfg.device)
    validate.outdir(cfg.out, "recipe.out")


def run_recipe(cfg, accepted: Callable[[Path], None] | None = None) -> dict:
    """Run a recipe; ``accepted(run folder)`` is called once its inputs have been checked and the folder opened
    (the CLI records its Hydra config there: a refused run writes nothing)."""
    if type(cfg) not in _RECIPES:
        raise VGenError(f"unknown recipe {type(cfg).__name__}")
    check_config(cfg)
    token = _ACCEPTED.set(accepted)
    try:
        return _RECIPES[type(cfg)](cfg)
    finally:
        _ACCEPTED.reset(token)


def require_file(path: str, what: str, recipe_name: str) -> None:
    """An input a recipe needs from an earlier one (a tokenizer): a one-line error before any work. A safetensors
    file's header is read; any other file must at least be named like a checkpoint."""
    p = Path(path)
    if not p.is_file():
        raise VGenError(f"{what} {path} not found: train it first (vgen train recipe={recipe_name}) or point "
                        f"recipe.tokenizer at a {what} safetensors file")
    if p.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open
        try:
            with safe_open(str(p), "pt") as f:
                f.keys()
        except (SafetensorError, OSError, ValueError) as e:
            raise VGenError(f"{what} {path} is not a readable safetensors file ({str(e).splitlines()[0]}): train it "
                            f"again (vgen train recipe={recipe_name})") from None
    elif p.suffix not in (".pt", ".pth", ".bin", ".ckpt"):
        raise VGenError(f"{what} {path} is not a checkpoint (.safetensors, .pt, .pth, .bin): point at the file "
                        f"vgen train recipe={recipe_name} writes")


def start_run(cfg, needs: tuple[tuple[str, str, str], ...] = ()) -> tuple[RunDir, torch.device]:
    """What every recipe does first: check the device and the inputs it ``needs`` ((path, what, the recipe that
    makes it), e.g. a tokenizer), set threads and the seed, open the run folder."""
    device = train_device(cfg.device)
    for path, what, maker in needs:
        require_file(path, what, maker)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    run = RunDir(cfg.out)
    accepted = _ACCEPTED.get()
    if accepted is not None:
        accepted(run.path)
    return run, device


def to_cpu(obj):
    """Tensors in nested dicts/lists moved to the CPU (checkpoints load anywhere, with or without a GPU)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


class RunDir:
    """A training run folder: ``last.pt`` (resumable state), ``log.jsonl``, final safetensors."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.ckpt = self.path / "last.pt"

    def load(self) -> dict | None:
        if not self.ckpt.exists():
            return None
        return torch.load(self.ckpt, map_location="cpu", weights_only=True)

    def save(self, state: dict) -> None:
        buf = io.BytesIO()
        torch.save(to_cpu(state), buf)
        atomic_write_bytes(self.ckpt, buf.getvalue())

    def log(self, record: dict) -> None:
        record = {"time": time.time(), **record}
        with open(self.path / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def resume(self, model: torch.nn.Module, opt: torch.optim.Optimizer,
               device: str | torch.device | None = None) -> tuple[int, dict | None]:
        """Restore model, optimiser and RNG from ``last.pt`` if there is one -> (step, the whole state)."""
        state = self.load()
        if state is None:
            return 0, None
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        set_rng_state(state["rng"], device)
        return int(state["step"]), state

    def export(self, name: str, state_dict: dict, config: dict, extra: dict | None = None) -> Path:
        meta = {"config": json.dumps(config)}
        if extra:
            meta.update({k: json.dumps(v) for k, v in extra.items()})
        out = self.path / name
        save_safetensors(state_dict, out, metadata=meta)
        return out


def rng_state(device: str | torch.device | None = None) -> dict:
    """The global RNG state (and, training on CUDA, that device's generator: dropout draws from it)."""
    state = {"torch": torch.get_rng_state()}
    if device is not None and torch.device(device).type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: str | torch.device | None = None) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device is not None and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def train_loop(cfg, model: torch.nn.Module, opt: torch.optim.Optimizer, run: RunDir,
               step_fn: Callable[[int], tuple[torch.Tensor, dict]], *, desc: str, clip: float = 1.0,
               log_every: int = 20, bar: dict[str, str] | None = None,
               after_step: Callable[[int], dict | None] | None = None,
               extra_state: dict[str, torch.Tensor] | None = None,
               on_save: Callable[[int], None] | None = None) -> tuple[int, float]:
    """The one training loop of the zoo recipes; returns (final step, last training loss, nan if none ran).

    Resumes from ``run``'s ``last.pt`` (model, optimiser, RNG and the ``extra_state`` tensors, restored in
    place), then until ``cfg.steps``: sets the cosine LR (``cfg.lr``, ``cfg.warmup``), calls
    ``step_fn(step) -> (loss, logs)`` (the recipe's batch -- seeded by ``step`` -- forward and loss; ``logs``
    holds numbers or 0-dim tensors), back-propagates, clips the gradient norm to ``clip`` and steps the
    optimiser. Then, with ``step`` now counting the steps done: ``after_step(step)`` (work that must follow
    the optimiser step, e.g. dead-code restarts; may return more logs), the progress bar (``bar``: label ->
    format string over the logs, e.g. ``{"psnr": "{train_psnr:.1f}"}``), ``{"step", "loss", **logs}`` into
    ``log.jsonl`` every ``log_every`` steps, and every ``cfg.save_every`` steps and at the end a checkpoint
    (saved on the CPU) followed by ``on_save(step)`` (e.g. a periodic test-loss evaluation).
    """
    extra_state = extra_state or {}
    bar = bar or {"loss": "{loss:.3f}"}
    step, state = run.resume(model, opt, cfg.device)
    if state is not None:
        for k, t in extra_state.items():
            t.copy_(state[k])
    last_loss = float("nan")
    pbar = tqdm(total=cfg.steps, initial=step, desc=desc, dynamic_ncols=True)
    model.train()
    while step < cfg.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        loss, logs = step_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        step += 1
        more = after_step(step) if after_step is not None else None
        last_loss = loss.item()
        logs = {"loss": last_loss, **{k: v.item() if isinstance(v, torch.Tensor) else v
                                      for k, v in {**logs, **(more or {})}.items()}}
        pbar.set_postfix({label: fmt.format(**logs) for label, fmt in bar.items()})
        pbar.update(1)
        if step % log_every == 0:
            run.log({"step": step, **logs})
        if step % cfg.save_every == 0 or step == cfg.steps:
            run.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, **extra_state,
                      "rng": rng_state(cfg.device)})
            if on_save is not None:
                on_save(step)
    pbar.close()
    return step, last_loss


def cached_codes(run: RunDir, tokenizer, split: str, n: int, seed: int,
                 encode: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` examples of a split encoded by ``tokenizer`` -> (codes int16 (n, L), labels int64 (n,)), on the
    CPU; cached in the run folder as ``codes_<split>.pt`` (reused while it holds ``n`` examples). ``encode``:
    ``(tokenizer, split, n, seed) -> (codes, labels)``, photo crops (``encode_split``) by default."""
    path = run.path / f"codes_{split}.pt"
    if path.exists():
        d = torch.load(path, weights_only=True)
        if d["codes"].shape[0] == n:
            return d["codes"], d["labels"]
    codes, labels = (encode or encode_split)(tokenizer, split, n, seed)
    buf = io.BytesIO()
    torch.save({"codes": codes, "labels": labels}, buf)
    atomic_write_bytes(path, buf.getvalue())
    return codes, labels


@torch.no_grad()
def encode_split(tokenizer, split: str, n: int, seed: int, batch: int = 128, desc: str = "encode"):
    """Encode ``n`` photo crops of a split into (codes int16 (n, L), labels int64 (n,)), on the CPU (the
    tokenizer may sit on any device)."""
    from vgen.data import photos, to_model_range
    device = next(tokenizer.parameters()).device
    data = photos(split, n, seed=seed)
    codes = []
    for i in tqdm(range(0, n, batch), desc=f"{desc} {split}", leave=False):
        x = to_model_range(data.images[i:i + batch].to(device))
        codes.append(tokenizer.encode_to_codes(x).to(torch.int16).cpu())
    return torch.cat(codes), data.labels
