"""A linear layer at Janus-Pro-1B's shapes, timed per weight format: float32; vgen's int8 products (the fused
reduction, compiled; the tiled product; the native kernel, up to its rows, where it builds) beside PyTorch's int8
kernel; vgen's int4 layers (the native kernel up to its rows where it builds, else PyTorch's) beside PyTorch's int4
kernel; and, when torchao is installed, torchao's Int8WeightOnlyConfig eager and compiled.

    python docs/scripts/quant_kernels.py [--out docs/bench/quant-kernels-cpu.json] [--threads N] [--copies 16]

Rows 2 (batch 1 with CFG: the decode step) and 16 (batch 8). Each format holds ``copies`` layers with distinct
weights (built from distinct float matrices) and the calls cycle through them, as a model's layers do: one layer
called again and again would sit in the CPU's last-level cache (an int8 up-projection is 11 MiB) and time the cache,
not memory. Median of ``calls`` rounds (ms per layer) after a warm-up round. Records the machine, torch and torchao versions."""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
import torch.nn as nn

from vgen.eval.bench.reporting import machine
from vgen.kernels import native
from vgen.kernels.linear import Linear
from vgen.kernels.quant import Int4Linear, Int8Linear, int8_gemv, int8_tiled

fused = torch.compile(int8_gemv, dynamic=True)  # what int8_product runs up to fused_rows() rows

SHAPES = {"ffn up (2048 -> 5632)": (2048, 5632), "ffn down (5632 -> 2048)": (5632, 2048),
          "qkv (2048 -> 6144)": (2048, 6144)}


def timed(layers, x, calls=5) -> float:
    """Median ms per call over ``calls`` rounds through every layer (a round after a warm-up one)."""
    with torch.inference_mode():
        for m in layers:
            m(x)
        out = []
        for _ in range(calls):
            t0 = time.perf_counter()
            for m in layers:
                m(x)
            out.append((time.perf_counter() - t0) / len(layers))
    return 1e3 * statistics.median(out)


class Product(nn.Module):
    """An int8 layer's codes through one of vgen's CPU products, whatever ``int8_product`` would pick: the fused
    reduction (``int8_gemv``, compiled), the tiled product (``int8_tiled``) or the native kernel
    (``vgen.kernels.native.int8_gemv``)."""

    def __init__(self, q: Int8Linear, fn):
        super().__init__()
        self.q, self.fn = q, fn

    def forward(self, x):
        return self.fn(x, self.q.qweight, self.q.scale)


class AtenInt8(nn.Module):
    """An int8 layer's codes through PyTorch's own kernel ``torch._weight_int8pack_mm`` (what vgen's int8 layer used
    before its fused product; still its fallback)."""

    def __init__(self, q: Int8Linear):
        super().__init__()
        self.q = q

    def forward(self, x):
        return torch._weight_int8pack_mm(x, self.q.qweight, self.q.scale)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/bench/quant-kernels-cpu.json")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--copies", type=int, default=16)
    ap.add_argument("--calls", type=int, default=5, help="timed rounds through the copies")
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 16], help="rows of x (2: batch 1 with CFG)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        import torchao
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        torchao = None
    rows_out = []
    for label, (K, N) in SHAPES.items():
        torch.manual_seed(0)
        fmts: dict[str, list] = {}
        for _ in range(a.copies):
            lin = nn.Linear(K, N, bias=False).eval()
            vlin = Linear(K, N, bias=False).eval()
            vlin.load_state_dict(lin.state_dict())
            q8 = Int8Linear(lin)
            made = {"float32 F.linear": lin, "float32 vgen Linear (W @ x^T)": vlin, "int8 vgen (fused)": Product(q8, fused),
                    "int8 vgen (tiled)": Product(q8, int8_tiled), "int8 aten kernel": AtenInt8(q8), "int4 vgen (group 32)": Int4Linear(lin, 32),
                    "int4 vgen (group 128)": Int4Linear(lin, 128),
                    "int4 aten kernel (group 32)": Int4Linear(lin, 32, cpu_kernel=True)}
            if native.library() is not None:
                made["int8 vgen (native)"] = Product(q8, native.int8_gemv)
            if torchao is not None:
                t8 = copy.deepcopy(lin)
                quantize_(t8, Int8WeightOnlyConfig())
                made["int8 torchao eager"] = t8
                made["int8 torchao compiled"] = torch.compile(copy.deepcopy(t8), dynamic=False)
            for name, m in made.items():
                fmts.setdefault(name, []).append(m)
        for rows in a.rows:
            x = torch.randn(rows, K)
            ms = {name: timed(layers, x, a.calls) for name, layers in fmts.items()
                  if name != "int8 vgen (native)" or native.takes(x)}
            base = ms["float32 F.linear"]
            rows_out.append({"layer": label, "rows": rows, "ms": ms, "x_float32": {k: base / v for k, v in ms.items()},
                             "float_mb": K * N * 4 / 2 ** 20, "copies": a.copies})
            print(label, rows, {k: f"{v:.3f} ms ({base / v:.2f}x)" for k, v in ms.items()}, flush=True)
        del fmts
    rep = {"command": f"python docs/scripts/quant_kernels.py --copies {a.copies} --calls {a.calls} "
                      f"--rows {' '.join(map(str, a.rows))}", "torch": torch.__version__,
           "torchao": getattr(torchao, "__version__", None), "threads": torch.get_num_threads(),
           "machine": machine(), "rows": rows_out}
    with open(a.out, "w") as f:
        json.dump(rep, f, indent=1)
    print("wrote", a.out)



if __name__ == "__main__":
    main()
