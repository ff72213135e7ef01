"""The linears of a decode pass on CUDA, alone: microseconds per call of ``F.linear(x, W)`` (cuBLAS sees M = rows)
against ``(W @ x^T)^T`` (M = out features, N = rows), by rows, for photos-gpt's and GPT-XL's weight shapes, in
float32 (TF32 off and on) and bfloat16. Each cell is 20 calls recorded as one CUDA graph and replayed (launches
removed), median of 5 replays. Output: a JSON and one line per (shapes, dtype, rows) with the layer's summed time.

    python docs/scripts/gpu/small_gemm.py out.json
"""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SETS = {"photos-gpt": [(256, 768), (256, 256), (256, 768), (256, 768), (768, 256)],
        "XL": [(1280, 3840), (1280, 1280), (1280, 3584), (1280, 3584), (3584, 1280)]}  # (in, out): wqkv wo w1 w3 w2
ROWS = [1, 2, 4, 8, 16, 32, 64]
CALLS, REPLAYS = 20, 5


def time_op(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    ts = []
    for _ in range(REPLAYS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / CALLS * 1e6)
    return statistics.median(ts)


def main(path):
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": []}
    for name, shapes in SETS.items():
        for dtype, tf32 in ((torch.float32, False), (torch.float32, True), (torch.bfloat16, False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            ws = [torch.randn(o, i, device="cuda", dtype=dtype) * 0.02 for i, o in shapes]
            for m in ROWS:
                xs = [torch.randn(m, i, device="cuda", dtype=dtype) for i, _ in shapes]
                lin = sum(time_op(lambda w=w, x=x: F.linear(x, w)) for w, x in zip(ws, xs))
                wxt = sum(time_op(lambda w=w, x=x: torch.mm(w, x.t()).t()) for w, x in zip(ws, xs))
                cell = {"shapes": name, "dtype": str(dtype)[6:] + ("+tf32" if tf32 else ""), "rows": m,
                        "linear_us": lin, "wxt_us": wxt}
                out["cells"].append(cell)
                print(f"{name:10s} {cell['dtype']:14s} rows {m:3d}: linear {lin:7.1f} us, W x^T {wxt:7.1f} us "
                      f"({lin / wxt:.2f}x)", flush=True)
            json.dump(out, open(path, "w"), indent=1)
    torch.backends.cuda.matmul.allow_tf32 = False


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "small_gemm.json")
