"""photos-t2i's prompt accuracy by guidance scale (docs/lab/benchmarks-log.md, "photos-t2i, third release"): the
prompt sets of t2i_zoo_eval.py (subject, held-out, seen colour, seen brightness), 8 samples per prompt, seed 0, one
json line per scale.

    python docs/scripts/t2i_cfg_sweep.py [pipeline, default photos-t2i] [scales, default 3,5,8]
"""
import json
import sys
import time

import vgen
import vgen.eval
from vgen.data.captions import prompt_set

SAMPLES = 8
pipe = vgen.load_pipeline(sys.argv[1] if len(sys.argv) > 1 else "photos-t2i")
cfgs = [float(c) for c in (sys.argv[2].split(",") if len(sys.argv) > 2 else ["3", "5", "8"])]
for cfg in cfgs:
    t0 = time.time(); row = {"cfg": cfg}
    for kind in ("subject", "heldout", "colour", "brightness"):
        ps = [p for p, _ in prompt_set(kind, 16, 0)]
        prompts = [p for p in ps for _ in range(SAMPLES)]
        g = pipe.generate(prompts=prompts, seed=0, batch_size=32, cfg_scale=cfg)
        row[kind] = vgen.eval.prompt_accuracy(g.images, prompts)
    row["s"] = round(time.time() - t0)
    print(json.dumps(row), flush=True)
