"""Tokens per pass of sjd, scd (coupling=maximal) and pac trees at several windows (8 samples in one batch, eager):
`python docs/scripts/pac_windows.py photos-gpt [windows, default 16,32] [pac trees, default 3x2,4x2]`."""
import sys

import torch

import vgen
from vgen.conditions import examples

pipe = vgen.load_pipeline(sys.argv[1]); n = 8
windows = [int(w) for w in (sys.argv[2] if len(sys.argv) > 2 else "16,32").split(",")]
trees = [t.split("x") for t in (sys.argv[3] if len(sys.argv) > 3 else "3x2,4x2").split(",")]
runs = [("sjd", {}), ("scd", {"coupling": "maximal"})]
runs += [("pac", {"tree_width": int(k), "tree_depth": int(d)}) for k, d in trees]
cond = pipe.encode(examples(pipe.card, n))
for w in windows:
    for name, o in runs:
        s = pipe.make_sampler(name, compile=False, window=w, **o)
        with torch.inference_mode():
            _, st = pipe.sample_tokens(s, cond, list(range(n)), batch_size=n)
        h = st["pass_histogram"]
        print(f"w{w} {name} {o} tok/pass {st['accepted_per_step']:.2f} one-token {h[0]/max(sum(h),1):.2f}", flush=True)
