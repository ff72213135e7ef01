"""Does a speculative sampler's AR's loop (window=auto's choice where no width pays) cost more than `ar` itself?
Alternates ``ar``, ``sjd``, ``eagle`` and ``ar`` again on photos-gpt, forward and backward over 7 rounds, in one
process (compiled by default; ``COMPILE=0`` eager; ``BATCH`` the batch size; 8 images). Run with the prior's tables
cached (a small job decides from them: ``VGEN_CACHE`` of a run that chose AR's loop), or compiled (always AR's loop).

    python docs/scripts/ar_loop_overhead.py
"""
import os
import statistics
import time

import torch

import vgen

torch.set_num_threads(2)
pipe = vgen.load_pipeline("photos-gpt")
cond = torch.tensor([i % 10 for i in range(8)])
compile_ = os.environ.get("COMPILE", "1") == "1"
batch = int(os.environ.get("BATCH", "1"))
names = ["ar", "sjd", "eagle", "ar"]
res = {i: [] for i in range(len(names))}
for rep in range(7):
    for i in (range(len(names)) if rep % 2 else reversed(range(len(names)))):
        s = pipe.make_sampler(names[i], compile=compile_)
        t0 = time.perf_counter()
        _, st = pipe.sample_tokens(s, cond, list(range(8)), batch_size=batch)
        res[i].append(time.perf_counter() - t0)
        if names[i] != "ar":
            assert st["window"] == 1, f"{names[i]} chose width {st['window']}: this measures AR's loop only"
for i, v in res.items():
    print(names[i], [round(x, 2) for x in v], "median after the first:", round(statistics.median(v[1:]), 3))
