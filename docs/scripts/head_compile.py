"""Evidence for docs/compile.md (continuous tokens): one token's diffusion-head reverse process, eager against
compiled, on the zoo's continuous models.

    python docs/scripts/head_compile.py [--models photos-car photos-car-draft] [--rows 1 8] [--repeats 20]

For each model and row count (samples per head call; guided as the cards sample: rows [cond; uncond], the linear
schedule's per-row scale), with the card's 100 steps and clip_x0: the first compiled call (the warm-up: compiling
on an empty cache, or loading from vgen's inductor cache when a run before filled it) and the min / median of
``repeats`` timed calls each way, plus the largest difference between the two tokens. Prints a markdown table and
writes docs/metrics/head_compile.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from vgen import load_pipeline
from vgen.io import atomic_write_json

OUT = Path(__file__).resolve().parent.parent / "metrics" / "head_compile.json"


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["photos-car", "photos-car-draft"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    rows = []
    for name in a.models:
        pipe = load_pipeline(name)
        m, opts = pipe.model, pipe.card.sampling
        clip = float(opts.get("clip_x0", 0.0))
        D, C = m.diffloss.net.cond_embed.in_features, m.token_channels
        for R in a.rows:
            g = torch.Generator().manual_seed(R)
            z = torch.randn((2 * R, D), generator=g)
            noise, steps = torch.randn((R, C), generator=g), torch.randn((m.num_sampling_steps, R, C), generator=g)
            cfg = torch.linspace(1.0, 3.0, R)
            call = {c: (lambda c=c: m.sample_head(z, noise, steps, 1.0, cfg, None, True, 0.0, clip, compiled=c))
                    for c in (False, True)}
            with torch.inference_mode():
                call[False]()
                t0 = time.perf_counter()
                call[True]()
                warm = time.perf_counter() - t0
                te, tc = [], []
                for _ in range(a.repeats):  # interleaved: the machine's drift hits both alike
                    te += timed(call[False], 1)
                    tc += timed(call[True], 1)
                diff = float((call[False]().token - call[True]().token).abs().max())
            r = {"model": name, "rows": R, "eager_ms": [1e3 * min(te), 1e3 * statistics.median(te)],
                 "compiled_ms": [1e3 * min(tc), 1e3 * statistics.median(tc)], "first_compiled_call_s": warm,
                 "max_token_diff": diff, "threads": torch.get_num_threads()}
            rows.append(r)
            print(json.dumps(r), flush=True)
    atomic_write_json(OUT, {"rows": rows, "torch": torch.__version__})
    print("| model | rows | eager ms (min / median) | compiled ms (min / median) | x | first compiled call s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['rows']} | {r['eager_ms'][0]:.1f} / {r['eager_ms'][1]:.1f} | "
              f"{r['compiled_ms'][0]:.1f} / {r['compiled_ms'][1]:.1f} | {r['eager_ms'][1] / r['compiled_ms'][1]:.1f} | "
              f"{r['first_compiled_call_s']:.1f} |")


if __name__ == "__main__":
    main()
