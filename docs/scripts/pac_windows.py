"""Tokens per pass of sjd, scd (coupling=maximal) and pac at windows 16 and 32 (8 samples in one batch, eager):
`python docs/scripts/pac_windows.py photos-gpt`."""
import sys

import torch

import vgen
from vgen.conditions import examples

pipe = vgen.load_pipeline(sys.argv[1]); n = 8
cond = pipe.encode(examples(pipe.card, n))
for w in (16, 32):
    for name, o in (("sjd", {}), ("scd", {"coupling": "maximal"}), ("pac", {}), ("pac", {"tree_width": 4})):
        s = pipe.make_sampler(name, compile=False, window=w, **o)
        with torch.inference_mode():
            _, st = pipe.sample_tokens(s, cond, list(range(n)), batch_size=n)
        h = st["pass_histogram"]
        print(f"w{w} {name} {o} tok/pass {st['accepted_per_step']:.2f} one-token {h[0]/max(sum(h),1):.2f}", flush=True)
