"""Eager timings of photos-gpt's samplers on one device: rounds interleave the samplers, so a slow spell hits every
cell of a round. Usage: python docs/scripts/gpu/speed.py out.json  (vgen from PYTHONPATH; DEVICE=cuda by default;
ROUNDS timed rounds after one warm-up round)."""
import json
import os
import sys
import time

import torch

import vgen

DEVICE = os.environ.get("DEVICE", "cuda")
ROUNDS = int(os.environ.get("ROUNDS", "2"))
CELLS = [("ar", {}), ("sjd", {"window": 4}), ("sjd", {"window": 8}), ("lantern", {"window": 8}),
         ("scd", {"window": 8}), ("eagle", {"window": 8}), ("eagle", {"window": 8, "accept": "lantern"}),
         ("zipar", {"window": 4})]
BATCHES = [(1, 2), (8, 8)]  # (batch size, samples)


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


pipe = vgen.load_pipeline("photos-gpt", device=DEVICE)
out = {"vgen": vgen.__file__, "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
       "torch": torch.__version__, "rounds": []}
for r in range(ROUNDS + 1):  # round 0: warm-up, not kept
    row = {}
    for b, n in BATCHES:
        labels = [i % 16 for i in range(n)]
        for name, opts in CELLS:
            sync()
            t0 = time.perf_counter()
            g = pipe.generate(labels, sampler=name, seed=0, batch_size=b, compile=False, **opts)
            sync()
            dt = time.perf_counter() - t0
            key = f"{name}:{','.join(f'{k}={v}' for k, v in opts.items())}|b{b}"
            row[key] = {"seconds": dt, "sample_seconds": g.stats.get("sample_seconds"),
                        "passes": g.stats.get("forward_passes"), "tokens_per_pass": g.stats.get("accepted_per_step")}
    if r:
        out["rounds"].append(row)
        json.dump(out, open(sys.argv[1], "w"), indent=1)  # after every round: a timeout keeps what ran
    print(f"round {r} done", file=sys.stderr, flush=True)
