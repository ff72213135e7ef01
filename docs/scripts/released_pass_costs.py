"""What a speculative pass costs at a released model's shape on this machine: one forward pass of W = 1, 2, 4, 8 and
16 tokens per sample (batch 1, guidance: 2 rows) against a 1-token pass, at Janus-Pro-1B's shape (random weights:
speed depends on shapes only), in float32 and with int8 (and int4) weights (vgen.kernels.quant).

    python docs/scripts/released_pass_costs.py [--model janus-pro-1b] [--weights float32 int8 int4] [--out ...]

Median of 5 passes per width (widths interleaved, after a warm-up round) on a cache filled to the middle of a
24 x 24 image. The zoo models are too small to show it: a 16-token pass there costs what a 1-token pass costs in
overhead. Records the machine and commit."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vgen.conditions import kind_of
from vgen.eval.bench.reporting import machine
from vgen.eval.hf_speed import build
from vgen.kernels.quant import quantize_linears, weight_bytes

WIDTHS = (1, 2, 4, 8, 16)


@torch.inference_mode()
def costs(model, ids, repeats: int = 5) -> dict[int, float]:
    view, cond = kind_of(model).bind(model, ids)
    cache = view.new_cache(2)
    cache.limit(None)
    view.prefill(torch.cat([cond, view.null_cond(cond)]), cache)
    start = view.cond_len + 288  # half of a 24 x 24 grid decided
    times: dict[int, list[float]] = {w: [] for w in WIDTHS}
    for r in range(repeats + 1):
        for w in WIDTHS:
            x = torch.randint(0, view.vocab_size, (2, w))
            pos = torch.arange(start, start + w)[None].expand(2, -1)
            t0 = time.perf_counter()
            view.decode(x, pos, cache)
            if r:
                times[w].append(time.perf_counter() - t0)
    return {w: statistics.median(t) for w, t in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="janus-pro-1b")
    ap.add_argument("--out", default=None)
    ap.add_argument("--weights", nargs="+", default=["float32", "int8"], choices=["float32", "int8", "int4"])
    a = ap.parse_args()
    out = a.out or f"docs/bench/pass-costs-{a.model}.json"
    rows = []
    for weights in a.weights:
        m, model, ids, _, _ = build(a.model, torch.float32, torch.device("cpu"), grid=24)  # the same random weights
        if weights != "float32":
            quantize_linears(model.family.decoder, weights)
        c = costs(model, ids)
        rows.append({"weights": weights, "weight_bytes": weight_bytes(m), "seconds": {str(w): s for w, s in c.items()},
                     "x_one_token": {str(w): s / c[1] for w, s in c.items()}})
        print(weights, {w: f"{1e3 * s:.0f} ms ({s / c[1]:.2f}x)" for w, s in c.items()}, flush=True)
        del m, model
    rep = {"what": "one forward pass of W tokens per sample (batch 1, 2 rows with guidance), released shape, random "
           "weights", "model": a.model, "machine": machine(), "rows": rows}
    with open(out, "w") as f:
        json.dump(rep, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
