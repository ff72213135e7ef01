"""Weight-only int8 / int4 linear layers: fewer bytes per weight for decoding that is bound by reading them.

``quantize_linears(module, "int8" | "int4")`` replaces the ``nn.Linear`` layers of a module in place (activations,
biases, the KV cache and the logits keep their dtype; only the weight matrices are stored in fewer bits):

* **int8**: one scale per output channel, symmetric (``w ~ q * s``, q in -127..127). On the CPU the product runs on
  vgen's native kernel (:mod:`vgen.kernels.native`: each code read once and widened in registers) for up to
  :data:`vgen.kernels.native.ROWS` float32 rows, else on :func:`int8_tiled` (a float tile at a time through BLAS);
  where the native kernel cannot build, up to :func:`fused_rows` rows on a compiled reduction (AVX-512) with
  ``torch._weight_int8pack_mm`` as its fallback. Elsewhere as ``(x @ q.T) * s``, which ``torch.compile`` fuses into
  one kernel (gpt-fast's formulation).
* **int4**: one scale and offset per group of ``group_size`` input channels, asymmetric (tinygemm's layout:
  ``w ~ (q - 8) * s + z``, q in 0..15). Stored two codes a byte; on the CPU the product runs on the native kernel up
  to its rows, else dequantized a tile at a time (:func:`int4_tiled`); where the native kernel cannot build, the
  layer stores PyTorch's packed layout and runs ``torch._weight_int4pack_mm_for_cpu``. Elsewhere the codes are
  unpacked and dequantized inside the call (compiled, that fuses too).

torchao's ``Int8WeightOnlyConfig`` (0.18) casts the whole int8 matrix to float in every eager call, which reads more
bytes than float32 does (the comparison is in docs/lab/benchmarks-log.md, "int8 / int4 weights"). An int4 layer whose
input width the group size does not divide, or whose outputs are not a multiple of 16, stays in float
(``quantize_linears`` returns how many layers it changed and kept).

An embedding table can be stored in int8 too (:func:`quantize_embedding`: one scale per row; a lookup reads only
its rows), sharing its codes with an output layer tied to it: a transformers model's text vocabulary (Janus-Pro-1B's
102,400 x 2,048 float32 table is 0.8 GB, the size of three of its layers) only embeds the prompt.

The distribution a sampler draws from is the quantized model's: speculative samplers stay exact with respect to it.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from vgen.errors import VGenError
from vgen.kernels import native
from vgen.kernels.linear import Linear

LINEARS = (nn.Linear, Linear)  # the layers replaced (exactly these types: a subclass may read its own weight)

MODES = ("int8", "int4")
INT4_GROUPS = (32, 64, 128, 256)  # what the CPU kernel takes


def check_mode(mode: str | None, group_size: int = 32) -> str | None:
    """None or a known mode, and a group size int4's kernel takes (one-line errors, before any weights load)."""
    if mode in (None, "", "none", "null", False):
        return None
    if mode not in MODES:
        raise VGenError(f"quantize={mode!r} is not a weight format; use one of {', '.join(MODES)} (or leave it unset "
                        "for the model's dtype)")
    if mode == "int4" and group_size not in INT4_GROUPS:
        raise VGenError(f"quantize_group={group_size} is not a group size the int4 kernel takes; use one of "
                        f"{', '.join(map(str, INT4_GROUPS))}")
    return mode


def int8_gemv(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (M, K) times the int8 matrix (N, K), scaled per output channel: written as one reduction, so that compiled
    the cast happens inside the loop that reads each int8 weight once (no float copy of the matrix is made). Each
    output row is its own reduction: the same bytes whatever M."""
    return (x.unsqueeze(-2) * qweight.to(x.dtype)).sum(-1) * scale


_FUSED: dict = {}  # the compiled int8_gemv (one graph for every shape: dynamic=True), or the reason it failed


TILE = 1 << 18  # int8 weights made float at a time by int8_tiled: a 1 MiB float32 tile, read from the cache


def int8_tiled(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (M, K) times the int8 matrix (N, K), scaled per output channel, a tile of rows at a time: each tile of
    codes is cast into one reused float buffer (:data:`TILE` weights, so it stays in the CPU's cache) and multiplied
    by PyTorch's matrix product. Memory reads the int8 codes once whatever M, and every tile is a BLAS product, so a
    wide pass (many rows) costs about what float32's does (docs/quantization.md, "Speed on this CPU"). Rounds as a
    float32 matrix product does: a row's bytes can depend on M."""
    n, k = qweight.shape
    rows = max(16, TILE // max(1, k))
    out = torch.empty(n, x.shape[0], dtype=x.dtype, device=x.device)
    buf = torch.empty(min(rows, n), k, dtype=x.dtype, device=x.device)
    xt = x.t()
    for i in range(0, n, rows):
        j = min(n, i + rows)
        w = buf[: j - i]
        w.copy_(qweight[i:j])
        torch.mm(w, xt, out=out[i:j])
    return (out * scale[:, None]).t()


def int8_cpu(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The CPU product past :func:`fused_rows`: vgen's native kernel (:func:`vgen.kernels.native.int8_gemv`) for a
    float32 input of up to :data:`vgen.kernels.native.ROWS` rows where it built, else :func:`int8_tiled`."""
    if native.takes(x):
        return native.int8_gemv(x, qweight, scale)
    return int8_tiled(x, qweight, scale)


@torch.library.custom_op("vgen::int8_cpu", mutates_args=())
def int8_cpu_op(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """:func:`int8_cpu` as one opaque operator, so a compiled step calls it as it is (the native call and the tile
    loop are not traced; the choice by rows is made at run time)."""
    return int8_cpu(x, qweight, scale).contiguous()


@int8_cpu_op.register_fake
def _(x, qweight, scale):
    return x.new_empty(x.shape[0], qweight.shape[0])


def fused_rows() -> int:
    """Rows up to which :func:`int8_product` runs the compiled reduction (:func:`int8_gemv`) rather than
    :func:`int8_cpu`: 0 where vgen's native kernel built (:func:`vgen.kernels.native.library`: on the AVX2 machine
    3-8x faster than float32 at 1-4 rows, docs/bench/quant-kernels-cpu-avx2.json); else 2 (one sample with
    guidance) where the CPU runs AVX-512, on which the reduction made a 2-row int8 layer 5-6x faster than float32's
    (docs/bench/quant-kernels-cpu.json), and 0 elsewhere, as on AVX2, where it was slower than the tiled product at
    every width. Evaluated once, outside any compiled graph."""
    if "rows" not in _FUSED:
        avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
        _FUSED["rows"] = 2 if avx512 and native.library() is None else 0
    return _FUSED["rows"]


_GRAPH_ROWS = None  # fused_rows as dynamo's constant: made by graph_rows() when vgen first compiles a step


def graph_rows() -> None:
    """Makes :func:`fused_rows` dynamo's constant for compiled steps (``torch.compiler.assume_constant_result``:
    called once while a step is traced, its value baked in), once; :func:`vgen.kernels.decode.compiled` calls it
    before it compiles a step. Not at import: the decorator imports ``torch._dynamo`` (2.4 s and about 150 MB on a
    2-core CPU), which a command's start (``vgen --help``, a refusal before weights load) does not need."""
    global _GRAPH_ROWS
    if _GRAPH_ROWS is None:
        _GRAPH_ROWS = torch.compiler.assume_constant_result(fused_rows)


def int8_product(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The CPU product of :class:`Int8Linear`: :func:`int8_cpu` for more rows than :func:`fused_rows`, else
    :func:`int8_gemv` compiled (inside a compiled step, inlined into it; docs/quantization.md has the timings), or
    PyTorch's ``torch._weight_int8pack_mm`` where compiling fails (no C++ compiler), said once."""
    if torch.compiler.is_compiling():  # inside a compiled step: the rule by the machine alone (the rows are symbolic)
        rows = (_GRAPH_ROWS or fused_rows)()  # traced plainly in a step compiled outside vgen.kernels.decode
        return int8_cpu_op(x, qweight, scale) if rows == 0 else int8_gemv(x, qweight, scale)
    if x.shape[0] > fused_rows():
        return int8_cpu(x, qweight, scale)
    fn = _FUSED.get("fn")
    if fn is None and "failed" not in _FUSED:
        fn = _FUSED["fn"] = torch.compile(int8_gemv, dynamic=True)
    if fn is not None:
        try:
            return fn(x, qweight, scale)
        except Exception as e:  # noqa: BLE001 (a backend failure: the aten kernel instead, for the whole process)
            import warnings
            _FUSED.pop("fn")
            _FUSED["failed"] = f"{type(e).__name__}: {e}"
            warnings.warn(f"vgen: the fused int8 product did not compile ({_FUSED['failed'][:200]}); using "
                          "torch._weight_int8pack_mm (slower)", stacklevel=2)
    return torch._weight_int8pack_mm(x, qweight, scale)


CHUNK = 1 << 20  # weights quantized at a time (rows of a matrix): float temporaries of 4 MB however large it is


def row_chunks(weight: torch.Tensor):
    """Row slices of a matrix of about :data:`CHUNK` elements each (every computation here is per row or per group
    within a row, so chunking changes no byte)."""
    step = max(1, CHUNK // max(1, weight.shape[-1]))
    return [slice(i, i + step) for i in range(0, weight.shape[0], step)]


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (rows, K) matrix -> its int8 codes (symmetric, -127..127) and one scale per row in the matrix's dtype:
    ``w ~ q * s`` (a linear layer's output channels, an embedding table's rows)."""
    q = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scale = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    for rows in row_chunks(weight):
        w = weight[rows].detach().float()
        scale[rows] = w.abs().amax(1).clamp_min(1e-12) / 127
        q[rows] = torch.round(w / scale[rows, None]).clamp(-127, 127).to(torch.int8)
    return q, scale.to(weight.dtype)


class Int8Linear(nn.Module):
    """``nn.Linear`` with an int8 weight and one float scale per output channel."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        q, scale = int8_rows(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def dequantized(self) -> torch.Tensor:
        return self.qweight.to(self.scale.dtype) * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
            y = int8_product(x.reshape(-1, x.shape[-1]), self.qweight, self.scale.to(x.dtype))
            y = y.reshape(*x.shape[:-1], self.out_features)
        else:
            y = F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


    @classmethod
    def sharing(cls, table: "Int8Embedding", bias: torch.Tensor | None = None) -> "Int8Linear":
        """An output layer tied to an int8 embedding table: the same codes and scales (one copy in memory)."""
        lin = cls.__new__(cls)
        nn.Module.__init__(lin)
        lin.out_features, lin.in_features = table.qweight.shape
        lin.register_buffer("qweight", table.qweight)
        lin.register_buffer("scale", table.scale)
        lin.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        return lin


class Int8Embedding(nn.Module):
    """``nn.Embedding`` with an int8 table and one float scale per row: a lookup dequantizes only the rows it reads."""

    def __init__(self, emb: nn.Embedding):
        super().__init__()
        if emb.max_norm is not None:
            raise VGenError("an embedding with max_norm renormalises its rows on lookup: it cannot be stored in int8")
        q, scale = int8_rows(emb.weight)
        self.num_embeddings, self.embedding_dim = q.shape
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)

    def dequantized(self) -> torch.Tensor:
        return self.qweight.to(self.scale.dtype) * self.scale[:, None]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.qweight[ids].to(self.scale.dtype) * self.scale[ids].unsqueeze(-1)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8"


def quantize_embedding(root: nn.Module, emb: nn.Embedding) -> int:
    """Replace the embedding ``emb`` (wherever it sits under ``root``) by :class:`Int8Embedding`, and every linear
    layer under ``root`` whose weight is the same tensor (a tied output layer) by an :class:`Int8Linear` sharing its
    codes, in place, so the float table is freed. Returns how many modules changed. Callers holding ``emb`` itself
    keep the float table alive: look it up where it sits (``root.get_input_embeddings()``) at call time."""
    if type(emb) is not nn.Embedding:
        raise VGenError(f"quantize_embedding takes an nn.Embedding, got {type(emb).__name__}")
    weight = emb.weight
    table = Int8Embedding(emb)
    changed = 0
    for parent in list(root.modules()):
        for cname, child in list(parent.named_children()):
            if child is emb:
                setattr(parent, cname, table)
                changed += 1
            elif type(child) in LINEARS and child.weight is weight:
                setattr(parent, cname, Int8Linear.sharing(table, child.bias))
                changed += 1
    return changed


def int4_dequantized(qweight: torch.Tensor, scale_zero: torch.Tensor, group_size: int, rows: slice,
                     dtype: torch.dtype) -> torch.Tensor:
    """Rows ``rows`` of an int4 matrix in the portable layout (codes two to a byte, ``scale_zero`` (K/G, N, 2)),
    dequantized to ``dtype``: ``(q - 8) * s + z`` per group."""
    q = qweight[rows]
    codes = torch.stack([q & 15, q >> 4], -1).reshape(q.shape[0], -1, group_size).to(dtype)
    s, z = scale_zero[:, rows].transpose(0, 1).to(dtype).unbind(-1)  # (rows, K/G) each
    return ((codes - 8) * s[..., None] + z[..., None]).reshape(q.shape[0], -1)


def int4_tiled(x: torch.Tensor, qweight: torch.Tensor, scale_zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """x (M, K) times an int4 matrix in the portable layout, :data:`TILE` weights dequantized at a time into x's
    dtype and multiplied by PyTorch's matrix product (a wide pass; memory holds one float tile, never the matrix).
    Each tile's product is ``W @ x^T`` into contiguous rows of the (N, M) output, as :func:`int8_tiled`'s: ``x @ W^T``
    into a column slice measured 2-3x slower at Janus-Pro-1B's shapes and 32-96 rows (docs/lab, 2026-12-03)."""
    n, k = qweight.shape[0], x.shape[1]
    step = max(16, TILE // max(1, k))
    out = torch.empty(n, x.shape[0], dtype=x.dtype, device=x.device)
    xt = x.t()
    fast = x.dtype == torch.float32 and scale_zero.dtype == torch.float32 and x.device.type == "cpu" and \
        qweight.is_contiguous() and scale_zero.transpose(0, 1).is_contiguous() and \
        native.library() is not None  # the tile made natively (what native.int4_rows takes)
    buf = torch.empty(min(step, n), k) if fast else None
    for i in range(0, n, step):
        rows = slice(i, min(n, i + step))
        w = native.int4_rows(qweight, scale_zero, group_size, rows, buf[: rows.stop - i]) if fast else \
            int4_dequantized(qweight, scale_zero, group_size, rows, x.dtype)
        torch.mm(w, xt, out=out[rows])
    return out.t()


def int4_cpu(x: torch.Tensor, qweight: torch.Tensor, scale_zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """The CPU product of an int4 layer in the portable layout: vgen's native kernel
    (:func:`vgen.kernels.native.int4_gemv`) for a float32 input of up to its rows, else :func:`int4_tiled`."""
    if native.takes(x):
        return native.int4_gemv(x, qweight, scale_zero, group_size)
    return int4_tiled(x, qweight, scale_zero, group_size)


@torch.library.custom_op("vgen::int4_cpu", mutates_args=())
def int4_cpu_op(x: torch.Tensor, qweight: torch.Tensor, scale_zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """:func:`int4_cpu` as one opaque operator for compiled steps (as :func:`int8_cpu_op`)."""
    return int4_cpu(x, qweight, scale_zero, group_size).contiguous()


@int4_cpu_op.register_fake
def _(x, qweight, scale_zero, group_size):
    return x.new_empty(x.shape[0], qweight.shape[0])


def int4_product(x: torch.Tensor, qweight: torch.Tensor, scale_zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """:func:`int4_cpu`, called through its operator inside a compiled step."""
    if torch.compiler.is_compiling():
        return int4_cpu_op(x, qweight, scale_zero, group_size)
    return int4_cpu(x, qweight, scale_zero, group_size)


class Int4Linear(nn.Module):
    """``nn.Linear`` with 4-bit codes, one scale and offset per ``group_size`` inputs of each output channel."""

    def __init__(self, linear: nn.Linear, group_size: int = 32, cpu_kernel: bool | None = None):
        """``cpu_kernel``: store the CPU kernel's packed layout (default: where the weight is on the CPU) or the
        portable one (two codes a byte, dequantized in the call)."""
        super().__init__()
        w = linear.weight.detach()
        N, K = w.shape
        G = group_size
        q = torch.empty(N, K, dtype=torch.int32, device=w.device)
        scale = torch.empty(N, K // G, dtype=torch.float32, device=w.device)
        lo = torch.empty_like(scale)
        for rows in row_chunks(w):  # per group of a row: chunked, the same bytes with small temporaries
            wg = w[rows].float().reshape(-1, K // G, G)
            lo[rows], hi = wg.amin(-1), wg.amax(-1)
            scale[rows] = ((hi - lo[rows]) / 15).clamp_min(1e-12)
            q[rows] = torch.round((wg - lo[rows, :, None]) / scale[rows, :, None]).clamp(0, 15).to(
                torch.int32).reshape(-1, K)
        zero = lo + 8 * scale  # tinygemm's form: w ~ (q - 8) * scale + zero
        self.in_features, self.out_features, self.group_size = K, N, G
        if cpu_kernel is None:  # PyTorch's packed layout on a CPU where vgen's native kernel did not build
            cpu_kernel = w.device.type == "cpu" and native.library() is None
        self.cpu_kernel = cpu_kernel
        sz = torch.stack([scale, zero], -1).to(linear.weight.dtype)  # (N, K/G, 2)
        if self.cpu_kernel:
            self.register_buffer("qweight", torch._convert_weight_to_int4pack_for_cpu(q, 1))
            self.register_buffer("scale_zero", sz.transpose(0, 1).contiguous())  # (K/G, N, 2), the kernel's
        else:  # two codes a byte; the scales stored output by output (what the native kernel reads), seen as (K/G, N, 2)
            self.register_buffer("qweight", (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8))
            self.register_buffer("scale_zero", sz.transpose(0, 1))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def codes(self) -> torch.Tensor:
        """The (N, K) codes 0..15 (device-independent form, for the fallback and tests)."""
        if self.cpu_kernel:  # the packed CPU layout has no unpack op: read the codes back through the kernel
            eye = torch.eye(self.in_features, dtype=torch.float32, device=self.qweight.device)
            one = torch.stack([torch.ones_like(self.scale_zero[..., 0]), torch.full_like(self.scale_zero[..., 0], 8.0)],
                              -1).float()
            return torch._weight_int4pack_mm_for_cpu(eye, self.qweight, self.group_size, one).round().t().long()
        return torch.stack([self.qweight & 15, self.qweight >> 4], -1).reshape(self.out_features, -1).long()

    def dequantized(self) -> torch.Tensor:
        N, K, G = self.out_features, self.in_features, self.group_size
        s, z = self.scale_zero.transpose(0, 1).unbind(-1)  # (N, K/G) each
        q = self.codes().reshape(N, K // G, G).to(s.dtype)
        return ((q - 8) * s[..., None] + z[..., None]).reshape(N, K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
            x2 = x.reshape(-1, x.shape[-1])
            if self.cpu_kernel:
                y = torch._weight_int4pack_mm_for_cpu(x2, self.qweight, self.group_size, self.scale_zero.to(x.dtype))
            else:
                y = int4_product(x2, self.qweight, self.scale_zero.to(x.dtype), self.group_size)
            y = y.reshape(*x.shape[:-1], self.out_features)
        else:
            y = F.linear(x, self.dequantized().to(x.dtype))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4, group_size={self.group_size}"


def skipped(name: str, skip: tuple[str, ...]) -> bool:
    """Whether the layer at ``name`` sits under a child named in ``skip`` (kept in float by the model's choice)."""
    return any(name == s or name.startswith(s + ".") for s in skip)


def fits(lin: nn.Module, mode: str, group_size: int = 32) -> bool:
    """Whether a linear layer can be stored in ``mode``: int8 always; int4 when its input width is whole groups and its
    outputs a multiple of 16 (the kernel's shapes)."""
    return mode == "int8" or not (lin.in_features % group_size or lin.out_features % 16)


def quantized_layer(lin: nn.Module, mode: str, group_size: int = 32) -> nn.Module:
    """The int8 / int4 form of one linear layer (its weight read once; the float weight is not kept)."""
    return Int8Linear(lin) if mode == "int8" else Int4Linear(lin, group_size)


def summary(module: nn.Module, skip: tuple[str, ...] = ()) -> dict:
    """``{"quantized": n, "kept": m, "weight_bytes": b}`` of a module as it is: layers in int8 / int4, linear layers
    left in float outside ``skip`` (int4's shapes), and the bytes its parameters and buffers take."""
    done = kept = 0
    for name, m in module.named_modules():
        if type(m) in (Int8Linear, Int4Linear):
            done += 1
        elif type(m) in LINEARS and not skipped(name, skip):
            kept += 1
    return {"quantized": done, "kept": kept, "weight_bytes": weight_bytes(module)}


def quantize_linears(module: nn.Module, mode: str, group_size: int = 32, skip: tuple[str, ...] = ()) -> dict:
    """Replace every ``nn.Linear`` under ``module`` (except those under a child named in ``skip``) by its int8 / int4
    form, in place. Returns :func:`summary`: layers changed, layers left in float (int4: an input width the group does
    not divide, or outputs not a multiple of 16), and the bytes the module's parameters and buffers now take."""
    check_mode(mode, group_size)
    for name, child in list(module.named_modules()):
        for cname, lin in list(child.named_children()):
            full = f"{name}.{cname}" if name else cname
            if type(lin) in LINEARS and not skipped(full, skip) and fits(lin, mode, group_size):
                setattr(child, cname, quantized_layer(lin, mode, group_size))
    return summary(module, skip)


def quantize_model(model: nn.Module, mode: str, group_size: int = 32) -> dict:
    """A vgen model's weights in ``mode``, in place: a model with its own ``quantize_weights(mode, group_size)``
    (the transformers adapter: its decoder and its text table) decides what; any other has every linear layer replaced
    except under the children its class names in ``quantize_skip`` (such as MAR's diffusion head). Returns what
    :func:`quantize_linears` returns."""
    own = getattr(model, "quantize_weights", None)
    if callable(own):
        return own(mode, group_size)
    return quantize_linears(model, mode, group_size, skip=tuple(getattr(model, "quantize_skip", ())))


def weight_bytes(module: nn.Module) -> int:
    """Bytes of the module's parameters and buffers (quantized codes, scales, float weights alike)."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total
