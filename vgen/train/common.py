"""Pieces every zoo recipe shares: atomic checkpoints, resume, LR schedule, autocast, logging."""
from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from vgen.io import atomic_write_bytes, save_safetensors


def lr_at(step: int, total: int, base: float, warmup: int, final_frac: float = 0.1) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def autocast(device: str, precision: str):
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    if precision == "fp32":
        return nullcontext()
    raise ValueError(f"precision must be 'bf16' or 'fp32', got {precision!r}")


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
        import io
        buf = io.BytesIO()
        torch.save(state, buf)
        atomic_write_bytes(self.ckpt, buf.getvalue())

    def log(self, record: dict) -> None:
        record = {"time": time.time(), **record}
        with open(self.path / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def resume(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[int, dict | None]:
        """Restore model, optimiser and RNG from ``last.pt`` if there is one -> (step, the whole state)."""
        state = self.load()
        if state is None:
            return 0, None
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        set_rng_state(state["rng"])
        return int(state["step"]), state

    def export(self, name: str, state_dict: dict, config: dict, extra: dict | None = None) -> Path:
        meta = {"config": json.dumps(config)}
        if extra:
            meta.update({k: json.dumps(v) for k, v in extra.items()})
        out = self.path / name
        save_safetensors(state_dict, out, metadata=meta)
        return out


def rng_state() -> dict:
    return {"torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
