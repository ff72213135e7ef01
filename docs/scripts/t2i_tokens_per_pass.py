"""Tokens per forward pass of every speculative sampler on photos-t2i (the card's example prompts in turn) beside
photos-gpt (classes in turn): does text conditioning change acceptance? Acceptance does not depend on timing, so
this runs at fixed windows, eager, one thread (docs/benchmarks.md#text-to-image-photos-t2i).

    python docs/scripts/t2i_tokens_per_pass.py > docs/bench/t2i-tokens-per-pass.json
"""
import json
import sys
import time

import torch

import vgen
from vgen.conditions import examples

torch.set_num_threads(1)
N = 8
SETTINGS = [("sjd", {"window": 4}), ("scd", {"window": 4}), ("gsd", {"window": 4}), ("lantern", {"window": 4}),
            ("eagle", {"window": 4}), ("zipar", {})]
out = {}
for name in ("photos-t2i", "photos-gpt"):
    pipe = vgen.load_pipeline(name)
    cond = examples(pipe.card, N).record()
    for sampler, opts in SETTINGS:
        g = pipe.generate(**cond, sampler=sampler, seed=0, batch_size=1, compile=False, **opts)
        key = f"{sampler}" + "".join(f" {k}={v}" for k, v in opts.items())
        out.setdefault(key, {})[name] = {"tokens_per_pass": round(256 * N / g.stats["forward_passes"], 3),
                                         "forward_passes": int(g.stats["forward_passes"])}
        print(key, name, out[key][name], file=sys.stderr, flush=True)
from vgen.eval.bench import machine  # noqa: E402

print(json.dumps({"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": machine(), "images": N, "rows": out},
                 indent=2))
