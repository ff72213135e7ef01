"""Input rules shared by the CLI, the Python API and the demo: one rule per kind of input, checked before any work,
each failure a one-line ``VGenError`` that names the problem and the fix."""
from __future__ import annotations

import numbers
import os
from pathlib import Path

import numpy as np
import torch

from vgen.errors import VGenError

SEED_MAX = 2 ** 63 - 1


def seed(value, count: int = 1) -> int:
    """A whole number in 0..2^63-1 such that the ``count`` per-sample seeds ``value + i`` stay in range too."""
    if isinstance(value, bool):
        raise VGenError(f"seed must be a whole number in 0..{SEED_MAX}, got {value!r}")
    if not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            value = int(value)
        else:
            raise VGenError(f"seed must be a whole number in 0..{SEED_MAX}, got {value!r}")
    value = int(value)
    if count - 1 > SEED_MAX:
        raise VGenError(f"{count} samples are more than there are seeds (sample i uses seed + i, at most {SEED_MAX}): "
                        "ask for fewer samples")
    if not 0 <= value <= SEED_MAX - max(count - 1, 0):
        raise VGenError(f"seed must be a whole number in 0..{SEED_MAX - max(count - 1, 0)} (sample i uses seed + i), "
                        f"got {value}")
    return value


def labels(value) -> torch.Tensor:
    """Class ids as an int64 (N,) tensor: an int, a list/tuple of ints, or a 1-D integer tensor or array."""
    hint = "pass integer class ids: an int, a list of ints, or a 1-D integer tensor or array"
    if isinstance(value, bool):
        raise VGenError(f"labels must be class ids, got a bool: {hint}")
    if isinstance(value, numbers.Integral):
        return torch.tensor([int(value)])
    if isinstance(value, (str, bytes)):
        raise VGenError(f"labels must be class ids, got the string {value!r}: {hint}")
    if isinstance(value, (list, tuple)):
        bad = [x for x in value if isinstance(x, bool) or not isinstance(x, numbers.Integral)]
        if bad:
            raise VGenError(f"labels must be class ids, got {bad[0]!r} ({type(bad[0]).__name__}): {hint}")
        return torch.tensor([int(x) for x in value], dtype=torch.long).reshape(-1)
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor):
        raise VGenError(f"labels must be class ids, got a {type(value).__name__}: {hint}")
    if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
        raise VGenError(f"labels must be class ids, got a {value.dtype} tensor: {hint}")
    if value.dim() > 1:
        raise VGenError(f"labels must be one class id per sample, got a tensor of shape {tuple(value.shape)}: {hint}")
    return value.reshape(-1).long()


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def dtype(value) -> torch.dtype | None:
    """A floating dtype: a torch dtype or its usual name (``float16``, ``fp16``, ``half``, ``bfloat16``, ``bf16``,
    ``float32``, ``fp32``, with or without ``torch.``); None stays None (as stored)."""
    if value is None or isinstance(value, torch.dtype) and value.is_floating_point:
        return value
    if isinstance(value, str) and value.strip().lower().removeprefix("torch.") in DTYPES:
        return DTYPES[value.strip().lower().removeprefix("torch.")]
    raise VGenError(f"dtype must be one of {', '.join(sorted(DTYPES))} (or a floating torch dtype), got {value!r}")


def name_or_path(value, what: str = "model") -> str:
    """A zoo name, a folder or a hub reference: a non-empty string or path."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise VGenError(f"{what} must be a zoo name (vgen.list_models()) or a folder holding pipeline.json, got "
                        f"{value!r}")
    return value


def device(name) -> torch.device:
    """A device this machine can use: a clear error for unknown strings, ``meta``, or CUDA without a GPU."""
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise VGenError(f"device={name!r} is not a torch device: use 'cpu', 'cuda', 'cuda:1', ...") from None
    if dev.type == "meta":
        raise VGenError("device='meta' holds no data: use 'cpu' or 'cuda'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise VGenError(f"device={name!r} but CUDA is not available here: use device=cpu")
    try:
        torch.empty(1, device=dev)
    except (RuntimeError, AssertionError) as e:
        raise VGenError(f"device={name!r} cannot be used here ({str(e).splitlines()[0]}): use device=cpu") from None
    return dev


def _nearest_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _refusal(p: Path) -> str | None:
    """Why folder ``p`` cannot be written into or created (None: it can). Nothing is left behind."""
    import tempfile
    base = _nearest_existing(p.absolute())
    if not base.is_dir():
        return f"{base} is a file"
    try:  # the one sure test (permission bits lie to root, and /proc refuses even root): make and remove a folder
        os.rmdir(tempfile.mkdtemp(dir=base, prefix=".vgen-probe-"))
    except OSError as e:
        return f"{base} is not writable: {e.strerror or e}"
    return None


def outdir(path, key: str = "outdir") -> Path:
    """A folder a run may write into: an existing folder, or one that can be created (its nearest existing
    ancestor is a writable folder). Nothing is created here."""
    if path is None or not str(path).strip():
        raise VGenError(f"{key} is empty: name the folder to write into, e.g. {key}=samples (use {key}=. for the "
                        "current folder)")
    p = Path(os.path.expanduser(str(path)))
    if p.exists() and not p.is_dir():
        raise VGenError(f"{key}={path} is a file, not a folder: choose another {key}")
    why = _refusal(p)
    if why:
        raise VGenError(f"{key}={path} cannot be written ({why}): choose a folder you can write to")
    return p


def out_file(path, key: str = "out") -> Path:
    """A file a command may write (atomically, in its folder): not a folder, and its folder exists or can be
    created and is writable. Checked before the work whose result it will hold."""
    p = Path(os.path.expanduser(str(path)))
    if p.is_dir():
        raise VGenError(f"{key}={path} is a folder: give a file name, e.g. {key}={Path(path) / 'metrics.json'}")
    why = _refusal(p.parent)
    if why:
        raise VGenError(f"{key}={path} cannot be written ({why}): choose a file in a folder you can write to")
    return p


def config(cfg, schema) -> None:
    """The rules a command's schema states for its own fields (:mod:`vgen.configs`: ``at_least``, ``writes``,
    ``reads``), checked in one place before the command runs, whatever the command: every float finite, a number at
    least its minimum (each item of a list), a folder or file it writes writable (nothing created), a file it reads
    present; and the inputs every command shares by name, each by its one rule here: ``seed``, ``device``,
    ``dtype``. Values Hydra already typed; a field left at None (null) is not checked."""
    import dataclasses
    import math
    import typing

    from omegaconf import ListConfig
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        v = cfg.get(f.name)
        if v is None:
            continue
        listed = isinstance(v, (list, tuple, ListConfig))
        items = list(v) if listed else [v]
        floats = float in (typing.get_args(hints[f.name]) or (hints[f.name],))
        if floats and any(isinstance(x, float) and not math.isfinite(x) for x in items):
            raise VGenError(f"{f.name} must be a finite number, got {v}")
        lo = f.metadata.get("min")
        if lo is not None and any(x < lo for x in items if isinstance(x, (int, float)) and not isinstance(x, bool)):
            kind = "finite number" if floats else "whole number"
            raise VGenError(f"{f.name} must {f'list {kind}s' if listed else f'be a {kind}'} >= {lo}, got {v}")
        if f.metadata.get("writes") == "dir":
            outdir(v, f.name)
        elif f.metadata.get("writes") == "file":
            out_file(v, f.name)
        if f.metadata.get("reads") and not Path(os.path.expanduser(str(v))).exists():
            raise VGenError(f"{f.name}={v} does not exist: give a file that does")
        shared = {"seed": seed, "device": device, "dtype": dtype}.get(f.name)
        if shared is not None:
            shared(v)
