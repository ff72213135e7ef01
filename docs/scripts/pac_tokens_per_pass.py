"""Tokens per pass and the share of single-token passes of sjd, scd and pac (SJD-PAC) at window 8, eager, 8 samples
in one batch: `python docs/scripts/pac_tokens_per_pass.py photos-gpt[,photos-t2i,...] [samples] [short]` (short: one
pac setting)."""
import sys
import time

import torch

import vgen
from vgen.conditions import examples

models = sys.argv[1].split(",")
n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
for name in models:
    pipe = vgen.load_pipeline(name)
    cond = pipe.encode(examples(pipe.card, n))
    for setting in [("sjd", dict(window=8)), ("scd", dict(window=8)), ("pac", dict(window=8))] if len(sys.argv) > 3 else [("sjd", dict(window=8)), ("scd", dict(window=8)),
                    ("pac", dict(window=8, tree_width=3, tree_depth=2)), ("pac", dict(window=8, tree_width=4, tree_depth=2)),
                    ("pac", dict(window=8, tree_width=3, tree_depth=2, continuation=False)),
                    ("pac", dict(window=8, tree_width=2, tree_depth=3))]:
        s = pipe.make_sampler(setting[0], compile=False, **setting[1])
        t0 = time.perf_counter()
        with torch.inference_mode():
            _, st = pipe.sample_tokens(s, cond, list(range(n)), batch_size=n)
        h = st["pass_histogram"]
        print(f"{name:12s} {setting[0]:4s} {str(setting[1]):60s} tok/pass {st['accepted_per_step']:.2f}  one-token share {h[0]/max(sum(h),1):.2f}  {time.perf_counter()-t0:.1f}s", flush=True)
