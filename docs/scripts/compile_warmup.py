"""Compile warm-up and steady-state speed of the AR sampler on photos-gpt, every run in a fresh process
(docs/compile.md).

    OMP_NUM_THREADS=1 python docs/scripts/compile_warmup.py --repeats 3 --freezing both   # docs/compile.md
    OMP_NUM_THREADS=2 python docs/scripts/compile_warmup.py --repeats 3 --freezing both

Per repeat and batch size, interleaved: eager; compiled on an empty inductor cache folder (cold); compiled again on
that folder (warm); with ``--freezing both``, cold and warm with inductor's freezing on and off. Each process runs
the same job twice (``--samples`` images, labels i % 16, seeds i, the card's settings): the second run is the
steady state (ms/token counts every token of the batch), the first minus the second is the warm-up. Prints every
run as a JSON line, then the medians as a Markdown table.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def one(compile_: bool, batch: int, samples: int, freezing: bool) -> dict:
    """One process's measurement (run with ``--one``)."""
    t0 = time.perf_counter()
    import torch
    from torch._dynamo.utils import counters

    from vgen.kernels import decode
    from vgen.pipeline import Pipeline
    decode.COMPILE_OPTIONS = {**decode.COMPILE_OPTIONS, "freezing": freezing}
    pipe = Pipeline.from_pretrained("photos-gpt")
    load_s = time.perf_counter() - t0
    labels = [i % pipe.num_classes for i in range(samples)]
    runs = [pipe.generate(labels, sampler="ar", seed=0, batch_size=batch, compile=compile_) for _ in range(2)]
    first, steady = (g.stats["sample_seconds"] for g in runs)
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    return {"compile": compile_, "freezing": freezing, "batch": batch, "samples": samples, "load_s": load_s,
            "first_s": first, "steady_s": steady, "warmup_s": first - steady,
            "ms_per_token": 1000 * steady / runs[1].tokens.numel(),
            "tokens_sha": hashlib.sha256(runs[1].tokens.numpy().tobytes()).hexdigest()[:12],
            "counters": {k: dict(v) for k, v in counters.items() if k in ("inductor", "aot_autograd")}}


def spawn(compile_: bool, batch: int, samples: int, freezing: bool, cache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["VGEN_CACHE_DIR"] = cache
    cmd = [sys.executable, __file__, "--one", "--batch-sizes", str(batch), "--samples", str(samples),
           "--compile", str(compile_).lower(), "--freezing", str(freezing).lower()]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--freezing", choices=["true", "false", "both"], default="false",
                    help="inductor's freezing for the compiled runs (vgen's setting: false)")
    ap.add_argument("--compile", choices=["true", "false"], default="true")
    ap.add_argument("--one", action="store_true", help="measure in this process (used by the driver)")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.compile == "true", a.batch_sizes[0], a.samples, a.freezing == "true")))
        return
    freezings = [True, False] if a.freezing == "both" else [a.freezing == "true"]
    rows = []
    for _ in range(a.repeats):
        for b in a.batch_sizes:
            for fz in [None, *freezings]:  # None: eager
                with tempfile.TemporaryDirectory(prefix="vgen-inductor-") as cache:
                    for case in ("eager",) if fz is None else ("cold", "warm"):
                        rows.append({**spawn(fz is not None, b, a.samples, bool(fz), cache), "case": case})
                        print(json.dumps(rows[-1]), flush=True)
    print("\n| batch | run | freezing | warm-up s | ms/token | first job s (%d images) |" % a.samples)
    print("|---|---|---|---|---|---|")
    for b in a.batch_sizes:
        for case, fzs in (("eager", [False]), ("cold", freezings), ("warm", freezings)):
            for fz in fzs:
                sel = [x for x in rows if x["batch"] == b and x["case"] == case and x["freezing"] == fz]
                med = {k: statistics.median(x[k] for x in sel) for k in ("warmup_s", "ms_per_token", "first_s")}
                print(f"| {b} | {case} | {'-' if case == 'eager' else fz} | {med['warmup_s']:.1f} | "
                      f"{med['ms_per_token']:.2f} | {med['first_s']:.1f} |")


if __name__ == "__main__":
    main()
