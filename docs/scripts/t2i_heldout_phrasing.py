"""photos-t2i's held-out (subject, treatment) combinations in the held-out phrasings and in training phrasings
(docs/lab/benchmarks-log.md, "photos-t2i, third release"): 32 prompts each, 8 samples per prompt, with the accuracy
of each combination: does the phrasing or the combination fail?

    python docs/scripts/t2i_heldout_phrasing.py [pipeline, default photos-t2i] [cfg_scale, default 3]
"""
import json
import sys

import numpy as np

import vgen
import vgen.eval
from vgen.data.captions import HELDOUT_COMBOS, HELDOUT_TEMPLATES, TEMPLATES, _random_facts, _say

pipe = vgen.load_pipeline(sys.argv[1] if len(sys.argv) > 1 else "photos-t2i")
cfg = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
S = 8
for name, temps in (("heldout-phrasing", HELDOUT_TEMPLATES), ("train-phrasing", TEMPLATES)):
    rng = np.random.default_rng([0, 3])
    res = {}
    prompts, combos = [], []
    for i in range(32):
        combo = HELDOUT_COMBOS[i % 8]
        f = _random_facts(rng, combo[0], combo)
        p = _say(f, temps[int(rng.integers(len(temps)))], {combo[1]})[0]
        prompts += [p] * S; combos += [combo] * S
    g = pipe.generate(prompts=prompts, seed=0, batch_size=32, cfg_scale=cfg)
    from vgen.data.captions import measure_brightness, measure_colour
    col, bri = measure_colour(g.images), measure_brightness(g.images)
    for c in HELDOUT_COMBOS:
        idx = [j for j, cc in enumerate(combos) if cc == c]
        got = [(col if c[1] == "colour" else bri)[j] for j in idx]
        res["/".join(c)] = round(sum(x == c[2] for x in got) / len(got), 3)
    acc = vgen.eval.prompt_accuracy(g.images, prompts)
    print(name, json.dumps(acc), json.dumps(res), flush=True)
