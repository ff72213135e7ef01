"""Loading official checkpoints: unwrap the known layouts, infer the config from tensor shapes, and
explain mismatches (missing / unexpected keys, shape conflicts, the preset that would fit)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

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


def read_checkpoint(src, lazy: bool = False) -> tuple[dict, dict]:
    """Path or dict -> (flat state dict of tensors, config found in the file's metadata or {}). ``lazy``: a file's
    tensors are not read yet (:func:`open_tensor` reads one): a .safetensors file's entries are :class:`Stored`
    (read from the file when asked), a torch checkpoint's are memory-mapped (read as they are touched)."""
    meta: dict = {}
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        if not path.exists():
            raise VGenError(f"checkpoint not found: {path}")
        if path.suffix == ".safetensors":
            sd, meta = _index_safetensors(path) if lazy else _read_safetensors(path)
        else:
            sd, mapped = _read_weights_only(path, mmap=lazy)
            if mapped:
                sd = _wrap_mapped(sd)
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
        if not isinstance(v, (torch.Tensor, Stored, Mapped)):
            continue
        for p in _PREFIXES:
            if key.startswith(p):
                key = key[len(p):]
        out[key] = v
    return out, meta


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                       "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


@dataclasses.dataclass(frozen=True)
class Stored:
    """One tensor of a .safetensors file, not read yet: ``read()`` reads its bytes (and nothing else) with a plain
    file read, so only the tensors being loaded are in memory (a memory map would keep every page it touched)."""
    path: Path
    start: int
    end: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    def read(self) -> torch.Tensor:
        if self.end == self.start:
            return torch.empty(self.shape, dtype=self.dtype)
        buf = bytearray(self.end - self.start)
        with open(self.path, "rb") as f:
            f.seek(self.start)
            if f.readinto(buf) != len(buf):
                raise VGenError(f"{self.path} ends inside a tensor: it is truncated; download or export it again")
        return torch.frombuffer(buf, dtype=self.dtype).reshape(self.shape)


def _index_safetensors(path: Path) -> tuple[dict, dict]:
    """A .safetensors file's header: {name: :class:`Stored`} and the config in its metadata (format: an 8-byte
    little-endian header length, a JSON header of dtypes, shapes and byte offsets, then the data)."""
    import struct

    def bad(why: str):
        return VGenError(f"{path} is not a readable safetensors file ({why}): it is truncated, corrupt or in another "
                         "format; download or export it again")
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise bad("its header runs past the end of the file")
            header = json.loads(f.read(n))
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise bad(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    m = header.pop("__metadata__", None) or {}
    sd = {}
    for key, e in header.items():
        dtype = _SAFETENSORS_DTYPES.get(e.get("dtype"))
        if dtype is None:
            raise bad(f"tensor {key} has dtype {e.get('dtype')!r}, which vgen does not read")
        a, b = (8 + n + o for o in e["data_offsets"])
        if b > size:
            raise bad(f"tensor {key} runs past the end of the file")
        sd[key] = Stored(path, a, b, dtype, tuple(e["shape"]))
    return sd, json.loads(m["config"]) if "config" in m else {}


@dataclasses.dataclass(frozen=True)
class Mapped:
    """One tensor of a memory-mapped torch checkpoint (``torch.load(mmap=True)``): ``read()`` copies it and, on
    Linux, tells the kernel this process no longer needs the file pages it read (``madvise(MADV_DONTNEED)``; they
    are read again from the file if touched), so a load does not keep the whole file resident."""
    tensor: torch.Tensor

    def read(self) -> torch.Tensor:
        t = self.tensor.clone()
        _drop_pages(self.tensor)
        return t


def _libc():
    """The C library's functions (glibc's ``madvise`` and ``malloc_trim``), or None where there is none to call."""
    if "lib" not in _LIBC:
        import ctypes
        import ctypes.util
        import sys
        try:
            _LIBC["lib"] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True) \
                if sys.platform == "linux" else None
        except OSError:
            _LIBC["lib"] = None
    return _LIBC["lib"]


_LIBC: dict = {}


def _madvise(t: torch.Tensor, advice: int) -> None:
    lib = _libc()
    if lib is None or t.numel() == 0 or t.device.type != "cpu" or not hasattr(lib, "madvise"):
        return
    import ctypes
    import mmap
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    a, b = start - start % mmap.PAGESIZE, -(-end // mmap.PAGESIZE) * mmap.PAGESIZE
    lib.madvise(ctypes.c_void_p(a), ctypes.c_size_t(b - a), advice)


def _drop_pages(t: torch.Tensor) -> None:
    _madvise(t, 4)  # MADV_DONTNEED: only for a private file mapping this process reads no more (Mapped)


def page_out(t: torch.Tensor) -> None:
    """Ask the kernel (Linux 5.4 on) to reclaim the pages of a tensor read for the last time (``MADV_PAGEOUT``): the
    clean pages of a memory-mapped file leave the process's resident memory (read again from the file if touched);
    the data never changes, so any tensor may be given (anonymous memory without swap simply stays). A quantizing
    transformers load gives each float weight it has quantized (:mod:`vgen.models.hf.quantizer`): transformers maps
    safetensors files, so the file's pages would otherwise stay resident to the end."""
    _madvise(t, 21)


def trim_heap() -> None:
    """Hand the C heap's free memory back to the system (glibc's ``malloc_trim``): a quantizing load frees each
    layer's float weights, and glibc otherwise keeps the freed chunks, so the process's memory would grow by about
    the float model's size anyway (measured on cpu-M, 68 MB in int8: the load ended holding 180 MB without it, 79 MB
    with it). Elsewhere (another C library) nothing is handed back this way."""
    lib = _libc()
    if lib is not None and hasattr(lib, "malloc_trim"):
        lib.malloc_trim(0)


def _wrap_mapped(obj):
    """The tensors of a checkpoint ``torch.load(mmap=True)`` returned (all inside the file's private mapping), each
    as :class:`Mapped`, wrappers and nesting kept."""
    if isinstance(obj, torch.Tensor):
        return Mapped(obj)
    if isinstance(obj, dict):
        return {k: _wrap_mapped(v) for k, v in obj.items()}
    return obj


def open_tensor(v) -> torch.Tensor:
    """A lazily read checkpoint entry (:func:`read_checkpoint` with ``lazy``) as a tensor of its own memory."""
    return v.read() if isinstance(v, (Stored, Mapped)) else v


SMALL = 1 << 16  # entries of at most this many elements are read when only shapes are asked for: config inference
#                 may read a small table's values (VAR's level map)


def shape_only(v) -> torch.Tensor:
    """A checkpoint entry as config inference and checks read it: a meta tensor of its shape and dtype (no memory),
    or the tensor itself if it has at most :data:`SMALL` elements."""
    t = torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, Stored) else torch.empty_like(
        v.tensor if isinstance(v, Mapped) else v, device="meta")
    return open_tensor(v) if t.numel() <= SMALL else t


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


def _read_weights_only(path: Path, mmap: bool = False):
    import pickle
    try:
        if mmap:  # tensors read as they are touched (torch's zip format; an older file is read whole)
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True), True
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
        return torch.load(path, map_location="cpu", weights_only=True), False
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
                  device="cpu", dtype=None, quantize: str | None = None, quantize_group: int = 32,
                  stream: bool = True, **config):
    """Load an official (or vgen zoo) checkpoint into a vgen model.

    ``src``: a path (.safetensors, or .pt/.pth/.bin read with ``torch.load(weights_only=True)``) or a state
    dict, in any official layout (``model``/``module``/``state_dict`` wrappers or raw; a stray
    ``freqs_cis`` is dropped), or a Hugging Face Hub file read through the local HF cache (``vgen.hub``):
    ``"hf://owner/repo/file.pt"``, or ``"owner/repo"`` with ``filename=`` (a local path of that name wins);
    ``revision=``: a branch, tag or commit. Config: explicit keyword arguments, then the file's metadata, then
    what the tensor shapes imply.

    The model is built without memory for its parameters (:func:`parameters_on_meta`) and filled one tensor at a time
    from the file (:func:`stream_weights`), so a load holds the model and one tensor, not the model and the whole
    state dict besides. ``quantize="int8" | "int4"``: the linear layers in those weights
    (:func:`vgen.kernels.quant.quantize_model`'s choice: all but those under the class's ``quantize_skip``), each
    quantized as soon as it is read, so the float model is never whole in memory; the same bytes as loading in float
    and quantizing after. ``stream=False``: build the model in memory and ``load_state_dict`` the whole checkpoint
    (then quantize), as a class that reads its state dict its own way is always loaded."""
    from vgen.kernels.quant import check_mode
    quantize = check_mode(quantize, quantize_group)
    k = _kind(kind)
    from vgen.hub import resolve_checkpoint
    src = resolve_checkpoint(src, filename=filename, revision=revision)
    sd, meta = read_checkpoint(src, lazy=True)
    shapes = {a: shape_only(v) for a, v in sd.items()}
    if k["convert"] is not None and k["signature"](shapes):  # another layout: read whole, converted, loaded as usual
        sd = shapes = k["convert"]({a: open_tensor(v) for a, v in sd.items()})
    try:
        inferred = k["infer"](shapes)
    except (NotImplementedError, RuntimeError):  # it reads a large tensor's values: read the checkpoint whole
        sd = shapes = {a: open_tensor(v) for a, v in sd.items()}
        inferred = k["infer"](shapes)
    sd = {key: v for key, v in sd.items() if key != "freqs_cis"}
    shapes = {key: v for key, v in shapes.items() if key != "freqs_cis"}
    found = detect_kind(shapes)
    if found is not None and found != kind and not k["signature"](shapes):
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
    with parameters_on_meta():
        model = k["builder"](k["config_cls"](**cfg))
    check_state_dict(model, shapes, kind, cfg, inferred, strict)
    if stream and streamable(model, shapes):
        stream_weights(model, sd, device, dtype, quantize, quantize_group)
        return model.eval()
    # the class reads its state dict its own way, or keys are missing: built in memory, loaded, then quantized
    model = k["builder"](k["config_cls"](**cfg))
    model.load_state_dict({a: open_tensor(v) for a, v in sd.items()}, strict=strict)
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    if quantize is not None:
        from vgen.kernels.quant import quantize_model
        quantize_model(model, quantize, quantize_group)
    return model.eval()


# In-place tensor ops that initialisers run and that have no C++ meta kernel: on a meta tensor torch runs them through
# torch._refs, whose first use imports torch._dynamo (3.4 s on a 2-core host). On a meta tensor each only checks
# shapes and leaves it as it was, so inside :func:`parameters_on_meta` a meta tensor skips them.
META_SKIPPED = ("normal_", "erfinv_", "clamp_", "exponential_", "log_normal_", "cauchy_", "geometric_")


def _meta_skips(op):
    def skip_on_meta(self, *args, **kwargs):
        return self if self.is_meta else op(self, *args, **kwargs)
    return skip_on_meta


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside keep their parameters on the meta device (shapes, no memory); buffers are made where they
    are (they are small, and some are computed at build time, such as rotary tables). Their initialisers' in-place
    ops leave a meta parameter as it is (:data:`META_SKIPPED`: a building command does not import torch._dynamo)."""
    register = nn.Module.register_parameter
    ops = {name: getattr(torch.Tensor, name) for name in META_SKIPPED}

    def on_meta(module, name, param):
        register(module, name, param)
        p = module._parameters.get(name)
        if p is not None and not p.is_meta:
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)
    nn.Module.register_parameter = on_meta
    for name, op in ops.items():
        setattr(torch.Tensor, name, _meta_skips(op))
    try:
        yield
    finally:
        nn.Module.register_parameter = register
        for name, op in ops.items():
            setattr(torch.Tensor, name, op)


def streamable(model: nn.Module, shapes: dict) -> bool:
    """Whether :func:`stream_weights` can fill ``model``: every parameter and persistent buffer has its key in the
    checkpoint, no module reads its state dict its own way, and the model does not choose its own quantization."""
    if callable(getattr(model, "quantize_weights", None)) or any(type(m).load_state_dict is not nn.Module.load_state_dict
           or type(m)._load_from_state_dict is not nn.Module._load_from_state_dict
           or m._load_state_dict_pre_hooks or m._load_state_dict_post_hooks for m in model.modules()):
        return False
    return set(model.state_dict()) <= set(shapes)


def stream_weights(model: nn.Module, sd: dict, device, dtype, quantize: str | None, group_size: int = 32) -> None:
    """Fill a model built under :func:`parameters_on_meta` from a lazily read checkpoint (:func:`read_checkpoint`),
    one module at a time, in place: each tensor is read, cast as ``load_state_dict`` then ``.to(device, dtype)``
    would (to the built parameter's dtype, then to ``dtype``), and each linear layer that ``quantize`` takes is
    replaced by its int8 / int4 form as soon as its weights are in, so the float weights of one layer at most are
    held. Shared parameters stay shared."""
    from vgen.kernels.quant import LINEARS, fits, quantized_layer, skipped
    skip = tuple(getattr(model, "quantize_skip", ()))
    uses: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    done: dict[int, torch.Tensor] = {}  # id(meta parameter) -> its loaded tensor, for tied weights only (read once;
    #                                     any other is held by its module alone, so a quantized layer frees it)

    def take(key: str, like: torch.Tensor) -> torch.Tensor:
        src = open_tensor(sd[key])
        t = src.to(like.dtype)
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        t = t.to(device)
        # a tensor of the caller's state dict is copied, as load_state_dict would (a file's are read fresh)
        return t.clone() if t.data_ptr() == src.data_ptr() and not isinstance(sd[key], (Stored, Mapped)) else t

    modules = dict(model.named_modules())  # parents are looked up here; a replaced layer's entry is dropped
    loaded = None
    for name in list(modules):
        m = modules[name]
        prefix = f"{name}." if name else ""
        for pname, p in list(m._parameters.items()):
            if p is None or not p.is_meta:
                continue
            loaded = done.get(id(p))
            if loaded is None:
                loaded = type(p)(take(prefix + pname, p), requires_grad=p.requires_grad)
                if uses[id(p)] > 1:
                    done[id(p)] = loaded
            m._parameters[pname] = loaded
        for bname, b in list(m._buffers.items()):
            if b is not None and bname not in m._non_persistent_buffers_set:
                m._buffers[bname] = take(prefix + bname, b)
        if quantize is not None and name and type(m) in LINEARS and not skipped(name, skip) and fits(m, quantize,
                                                                                                   group_size):
            parent, _, child = name.rpartition(".")
            setattr(modules[parent], child, quantized_layer(m, quantize, group_size))
            del modules[name]
            m = loaded = None  # the replaced layer's float weights go now, not when the next one is read
            trim_heap()
    model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise VGenError(f"loading left {len(left)} tensors unread ({', '.join(left[:4])}): a vgen bug; load without "
                        "quantize= and quantize the pipeline after (pipe.quantize(mode))")


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
