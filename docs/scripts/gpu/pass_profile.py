"""Where a compiled speculative pass spends its time on a GPU, per sampler (photos-gpt, batch 1 by default).

For each cell: one warm-up image (the compile), then ``IMAGES`` timed images (ms per pass from the sampler's own
stats), then one image under ``torch.profiler``: per pass, the host's wall time, the GPU's busy time (the sum of
its kernels), CUDA-graph replays, kernels launched outside a graph, host waits (synchronize calls) and copies;
and inductor's counters (``cudagraph_skips``: a step that was not recorded as a CUDA graph). A pass whose GPU
busy time is far below its wall time waits on the host; one that launches kernels outside a graph was not
(wholly) recorded.

    DEVICE=cuda BATCH=1 python docs/scripts/gpu/pass_profile.py out.json   # DEVICE=cpu: the host side alone

``WXT=16``: linears of at most 16 rows run as W @ x^T on CUDA too (``vgen.kernels.linear.SMALL_ROWS``); ``TF32=1``:
float32 matmuls in TF32.
"""
from __future__ import annotations

import collections
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import vgen
from vgen.conditions import examples
from vgen.kernels import linear

if os.environ.get("WXT"):
    linear.SMALL_ROWS["cuda"] = int(os.environ["WXT"])
if os.environ.get("TF32") == "1":
    torch.backends.cuda.matmul.allow_tf32 = True

DEVICE = os.environ.get("DEVICE", "cuda")
BATCH = int(os.environ.get("BATCH", "1"))
IMAGES = int(os.environ.get("IMAGES", "4"))
MODEL = os.environ.get("MODEL", "photos-gpt")
CELLS = [("ar", {}), ("sjd", {"window": 4}), ("scd", {"window": 8}), ("scd", {"window": 4}),
         ("sjd", {"window": 4, "coupling": "maximal"}), ("sjd", {"window": 4, "init": "horizontal"}),
         ("zipar", {"window": 4})]
if os.environ.get("CELLS"):  # e.g. CELLS='ar;sjd:window=4'
    CELLS = [(c.split(":")[0], {k: (int(v) if v.isdigit() else v) for k, v in
                                (kv.split("=") for kv in c.split(":")[1].split(",") if kv)} if ":" in c else {})
             for c in os.environ["CELLS"].split(";")]


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def main(path: str) -> None:
    from torch._dynamo.utils import counters
    pipe = vgen.load_pipeline(MODEL, device=DEVICE)
    cond = examples(pipe.card, BATCH).record()  # the card's classes or example prompts in turn
    out = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
           "model": MODEL, "batch": BATCH, "small_rows": dict(linear.SMALL_ROWS),
           "tf32": torch.backends.cuda.matmul.allow_tf32, "cells": {}}
    for name, opts in CELLS:
        key = f"{name}:{','.join(f'{k}={v}' for k, v in opts.items())}"
        counters.clear()
        run = lambda n, seed=0: pipe.generate(**{k: v * n for k, v in cond.items()}, sampler=name, seed=seed,
                                              batch_size=BATCH, compile=True, **opts)
        t0 = time.perf_counter()
        run(1)
        sync()
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        g = run(IMAGES, seed=1)
        sync()
        secs = time.perf_counter() - t0
        cell = {"warmup_s": warm, "seconds": secs, "passes": g.stats["forward_passes"],
                "ms_per_pass": 1e3 * secs / g.stats["forward_passes"], "tokens_per_pass": g.stats["accepted_per_step"],
                "inductor": dict(counters["inductor"]), "dynamo_graphs": counters["stats"]["unique_graphs"]}
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            gp = run(1, seed=2)
            sync()
            wall = time.perf_counter() - t0
        passes = gp.stats["forward_passes"]
        ev = prof.key_averages()
        calls = collections.Counter({e.key: e.count for e in ev})
        gpu_us = sum(e.self_device_time_total for e in ev if e.device_type.name == "CUDA") if DEVICE == "cuda" else 0
        cell["profiled"] = {
            "passes": passes, "wall_ms_per_pass": 1e3 * wall / passes, "gpu_busy_ms_per_pass": gpu_us / 1e3 / passes,
            "per_pass": {k: calls[k] / passes for k in ("cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel",
                                                           "cuLaunchKernelEx", "cudaStreamSynchronize",
                                                           "cudaEventSynchronize", "cudaDeviceSynchronize",
                                                           "cudaMemcpyAsync", "aten::copy_", "aten::clone")},
            "top_cpu": [(e.key, round(e.self_cpu_time_total / passes, 1), e.count) for e in
                        sorted(ev, key=lambda e: -e.self_cpu_time_total)[:14]],
            "top_gpu": [(e.key[:90], round(e.self_device_time_total / passes, 1), e.count) for e in
                        sorted(ev, key=lambda e: -e.self_device_time_total)[:14]] if DEVICE == "cuda" else []}
        out["cells"][key] = cell
        p = cell["profiled"]
        print(f"{key:40s} {cell['ms_per_pass']:.3f} ms/pass, {cell['tokens_per_pass']:.2f} tok/pass | profiled: wall "
              f"{p['wall_ms_per_pass']:.3f}, gpu busy {p['gpu_busy_ms_per_pass']:.3f} ms/pass; per pass "
              + ", ".join(f"{k} {v:.1f}" for k, v in p["per_pass"].items() if v) + f" | inductor {cell['inductor']}",
              flush=True)
        json.dump(out, open(path, "w"), indent=1)  # after every cell: a timeout keeps what ran


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "pass_profile.json")
