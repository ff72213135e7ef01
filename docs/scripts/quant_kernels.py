"""One linear layer at Janus-Pro-1B's shapes, timed per weight format: float32, vgen's int8 / int4 layers
(vgen.kernels.quant) and, when torchao is installed, torchao's Int8WeightOnlyConfig eager and compiled.

    python docs/scripts/quant_kernels.py [--out docs/bench/quant-kernels-cpu.json] [--threads N]

Rows 2 (batch 1 with CFG: the decode step) and 16 (batch 8). Median of 30 calls after 5 warm-up calls; all the
formats' weights are built from one float matrix. Records the machine, torch and torchao versions."""
from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time

import torch
import torch.nn as nn

from vgen.kernels.linear import Linear
from vgen.kernels.quant import Int4Linear, Int8Linear

SHAPES = {"ffn up (2048 -> 5632)": (2048, 5632), "ffn down (5632 -> 2048)": (5632, 2048),
          "qkv (2048 -> 6144)": (2048, 6144)}


def timed(fn, x, calls=30, warm=5) -> float:
    with torch.inference_mode():
        for _ in range(warm):
            fn(x)
        out = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn(x)
            out.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/bench/quant-kernels-cpu.json")
    ap.add_argument("--threads", type=int, default=None)
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
        lin = nn.Linear(K, N, bias=False).eval()
        vlin = Linear(K, N, bias=False).eval()
        vlin.load_state_dict(lin.state_dict())
        fmts = {"float32 F.linear": lin, "float32 vgen Linear (W @ x^T)": vlin, "int8 vgen": Int8Linear(lin),
                "int4 vgen (group 32)": Int4Linear(lin, 32), "int4 vgen (group 128)": Int4Linear(lin, 128)}
        if torchao is not None:
            t8 = copy.deepcopy(lin)
            quantize_(t8, Int8WeightOnlyConfig())
            fmts["int8 torchao eager"] = t8
            fmts["int8 torchao compiled"] = torch.compile(copy.deepcopy(t8), dynamic=False)
        for rows in (2, 16):
            x = torch.randn(rows, K)
            ms = {name: timed(m, x) for name, m in fmts.items()}
            base = ms["float32 F.linear"]
            rows_out.append({"layer": label, "rows": rows, "ms": ms, "x_float32": {k: base / v for k, v in ms.items()},
                             "float_mb": K * N * 4 / 2 ** 20})
            print(label, rows, {k: f"{v:.3f} ms ({base / v:.2f}x)" for k, v in ms.items()}, flush=True)
    rep = {"command": "python docs/scripts/quant_kernels.py", "torch": torch.__version__,
           "torchao": getattr(torchao, "__version__", None), "threads": torch.get_num_threads(),
           "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                       "cpu": _cpu()}, "rows": rows_out}
    with open(a.out, "w") as f:
        json.dump(rep, f, indent=1)
    print("wrote", a.out)


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    main()
