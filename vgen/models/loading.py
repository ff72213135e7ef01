"""Loading official checkpoints: unwrap the known layouts, infer the config from tensor shapes, and
explain mismatches (missing / unexpected keys, shape conflicts, the preset that would fit)."""
from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch

from vgen.errors import VGenError
from vgen.plugins import load_group

# kind -> builder, config dataclass, infer(state_dict) -> dict, signature(state_dict) -> bool, description, and the
# optional hooks preset(cfg) -> name, finalize(cfg, inferred, given) -> cfg, required (config fields shapes cannot give)
_KINDS: dict[str, dict] = {}
KIND_GROUP = "vgen.kinds"  # entry points: packages whose modules call register_kind when imported


def _registry() -> dict[str, dict]:
    """Every registered kind, after importing the packages declared under the ``vgen.kinds`` entry points (vgen's own
    models and tokenizers, a plugin's), once per process on the first lookup: ``build("vq")`` works after importing
    :mod:`vgen.models` alone."""
    load_group(KIND_GROUP)
    return _KINDS


GPT_PRESETS = {  # LlamaGen: n_layer, n_head, dim
    "GPT-B": (12, 12, 768), "GPT-L": (24, 16, 1024), "GPT-XL": (36, 20, 1280), "GPT-XXL": (48, 24, 1536),
    "GPT-XXXL": (48, 40, 2560), "GPT-1B": (22, 32, 2048), "GPT-3B": (24, 32, 3200), "GPT-7B": (32, 32, 4096),
}
VQ_PRESETS = {"VQ-16": [1, 1, 2, 2, 4], "VQ-8": [1, 2, 2, 4]}
_WRAPPERS = ("model", "module", "state_dict", "ema", "model_ema")
_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.")


def register_kind(name: str, builder: Callable, config_cls, infer: Callable, signature: Callable[[dict], bool],
                  description: str, *, preset: Callable[[dict], str | None] | None = None,
                  finalize: Callable[[dict, dict, dict], dict] | None = None, required: tuple[str, ...] = (),
                  convert: Callable[[dict], dict] | None = None):
    """Make a model or tokenizer kind loadable by name; called where the kind is defined (timm's
    ``register_model`` pattern). ``builder(config)`` builds it from its ``config_cls``; ``infer(state_dict)`` reads
    what config it can from tensor shapes; ``signature(state_dict)`` recognises its checkpoints; ``preset(cfg)`` names
    the released size a config matches; ``finalize(cfg, inferred, given)`` adjusts the merged config;
    ``required`` lists fields that must come from the caller or the file's metadata when the shapes cannot say;
    ``convert(state_dict)`` maps other released key layouts onto the model's (before anything else reads them).
    A package of its own declares the module that calls it under the ``vgen.kinds`` entry-point group."""
    _KINDS[name] = dict(builder=builder, config_cls=config_cls, infer=infer, signature=signature,
                        description=description, preset=preset, finalize=finalize, required=required,
                        convert=convert)


def list_kinds() -> list[str]:
    return sorted(_registry())


def _kind(kind: str) -> dict:
    if kind not in _registry():
        raise VGenError(f"unknown model kind {kind!r}; available kinds: {', '.join(list_kinds())}")
    return _KINDS[kind]


def build(kind: str, **config):
    """Build a model of ``kind`` from scratch (random init) with official config field names."""
    k = _kind(kind)
    fields = {f.name for f in dataclasses.fields(k["config_cls"])}
    unknown = sorted(set(config) - fields)
    if unknown:
        raise VGenError(f"unknown config field(s) {unknown} for {kind!r}; valid fields: {sorted(fields)}")
    return k["builder"](k["config_cls"](**config))


def read_checkpoint(src) -> tuple[dict, dict]:
    """Path or dict -> (flat state dict of tensors, config found in the file's metadata or {})."""
    meta: dict = {}
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        if not path.exists():
            raise VGenError(f"checkpoint not found: {path}")
        if path.suffix == ".safetensors":
            sd, meta = _read_safetensors(path)
        else:
            sd = _read_weights_only(path)
    else:
        sd = src
    if not isinstance(sd, dict):
        raise VGenError(f"checkpoint holds a {type(sd).__name__}, not a state dict")
    for w in _WRAPPERS:  # official layouts: ckpt["model"], ckpt["module"], ckpt["state_dict"], or raw
        if w in sd and isinstance(sd[w], dict):
            sd = sd[w]
            break
    out = {}
    for key, v in sd.items():
        if not isinstance(v, torch.Tensor):
            continue
        for p in _PREFIXES:
            if key.startswith(p):
                key = key[len(p):]
        out[key] = v
    return out, meta


def _read_safetensors(path: Path) -> tuple[dict, dict]:
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file
    try:
        sd = load_file(str(path))
        with safe_open(str(path), "pt") as f:
            m = f.metadata() or {}
        meta = json.loads(m["config"]) if "config" in m else {}
    except (SafetensorError, OSError, ValueError) as e:  # truncated, corrupt, or not safetensors at all
        raise VGenError(f"{path} is not a readable safetensors file ({str(e).splitlines()[0]}): it is truncated, "
                        "corrupt or in another format; download or export it again") from None
    return sd, meta


def _read_weights_only(path: Path):
    import pickle
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # weights_only refused something: pickled code, not just tensors
        raise VGenError(f"{path} holds pickled Python objects, not only tensors, and will not be loaded (that could "
                        "run code); if you trust the file, save its state dict once with safetensors.torch.save_file "
                        "and load the .safetensors") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise VGenError(f"{path} is not a readable torch checkpoint ({str(e).splitlines()[0]}): it is truncated "
                        "or corrupt; download it again") from None


def detect_kind(sd: dict) -> str | None:
    for name, k in _registry().items():
        if k["signature"](sd):
            return name
    return None


def load_official(kind: str, src, *, filename: str | None = None, revision: str | None = None, strict: bool = True,
                  device="cpu", dtype=None, **config):
    """Load an official (or vgen zoo) checkpoint into a vgen model.

    ``src``: a path (.safetensors, or .pt/.pth/.bin read with ``torch.load(weights_only=True)``) or a state
    dict, in any official layout (``model``/``module``/``state_dict`` wrappers or raw; a stray
    ``freqs_cis`` is dropped), or a Hugging Face Hub file read through the local HF cache (``vgen.hub``):
    ``"hf://owner/repo/file.pt"``, or ``"owner/repo"`` with ``filename=`` (a local path of that name wins);
    ``revision=``: a branch, tag or commit. Config: explicit keyword arguments, then the file's metadata, then
    what the tensor shapes imply."""
    k = _kind(kind)
    from vgen.hub import resolve_checkpoint
    src = resolve_checkpoint(src, filename=filename, revision=revision)
    sd, meta = read_checkpoint(src)
    if k["convert"] is not None and k["signature"](sd):
        sd = k["convert"](sd)
    inferred = k["infer"](sd)
    sd = {key: v for key, v in sd.items() if key != "freqs_cis"}
    found = detect_kind(sd)
    if found is not None and found != kind and not k["signature"](sd):
        raise VGenError(f"this checkpoint is a {_KINDS[found]['description']}, not a {k['description']}: "
                        f"load it with load_official({found!r}, ...)")
    if found is None and not sd:
        raise VGenError("the checkpoint holds no tensors")
    fields = {f.name for f in dataclasses.fields(k["config_cls"])}
    unknown = sorted(set(config) - fields)
    if unknown:
        raise VGenError(f"unknown config field(s) {unknown} for {kind!r}; valid fields: {sorted(fields)}")
    cfg = {**inferred, **{a: b for a, b in meta.items() if a in fields}, **config}
    if k["finalize"] is not None:
        cfg = k["finalize"](cfg, inferred, {**{a: b for a, b in meta.items() if a in fields}, **config})
    for f in k["required"]:
        if f not in cfg:
            raise VGenError(f"{f} cannot be read from the weights of a non-preset {kind!r} model: pass it, e.g. "
                            f"load_official({kind!r}, path, {f}=...)")
    model = k["builder"](k["config_cls"](**cfg))
    check_state_dict(model, sd, kind, cfg, inferred, strict)
    model.load_state_dict(sd, strict=strict)
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    return model.eval()


def check_state_dict(model, sd: dict, kind: str, cfg: dict, inferred: dict, strict: bool = True) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    conflicts = [f"{key}: checkpoint {tuple(sd[key].shape)} vs model {tuple(own[key].shape)}"
                 for key in sorted(set(own) & set(sd)) if own[key].shape != sd[key].shape]
    if not conflicts and (not strict or not (missing or unexpected)):
        return

    def short(xs, n=8):
        return ", ".join(xs[:n]) + (f", ... ({len(xs)} in all)" if len(xs) > n else "")

    parts = [f"checkpoint does not fit a {kind!r} model with config {_brief(cfg)}"]
    if missing:
        parts.append(f"missing keys: {short(missing)}")
    if unexpected:
        parts.append(f"unexpected keys: {short(unexpected)}")
    if conflicts:
        parts.append(f"shape conflicts: {short(conflicts, 4)}")
    hint = f"the tensors suggest: {_brief(inferred)}"
    preset = preset_name(kind, inferred)
    if preset:
        hint += f" ({preset})"
    parts.append(hint)
    raise VGenError("; ".join(parts))


def preset_name(kind: str, cfg: dict) -> str | None:
    p = _kind(kind)["preset"]
    return p(cfg) if p is not None else None


def _brief(cfg: dict) -> str:
    return "{" + ", ".join(f"{a}={b}" for a, b in cfg.items()) + "}"


def count_indexed(sd: dict, prefix: str) -> int:
    """Number of modules ``prefix.N.`` in a state dict."""
    pat = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    idx = {int(m.group(1)) for key in sd for m in [pat.match(key)] if m}
    return max(idx) + 1 if idx else 0
