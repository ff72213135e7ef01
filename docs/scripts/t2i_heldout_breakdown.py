"""What the pixel judge reads, per (subject, attribute, value) a prompt set asks for: photos-t2i's held-out
combinations ("heldout", the default) or seen ones ("colour", "brightness"); 8 samples per prompt, the card's
sampling, AR, seed 0 (docs/zoo.md#photos-t2i-text-to-image, docs/lab/benchmarks-log.md).

    python docs/scripts/t2i_heldout_breakdown.py [pipeline folder, default photos-t2i] [heldout|colour|brightness]
"""
import collections
import sys

import vgen
from vgen.data.captions import measure_brightness, measure_colour, prompt_set

SAMPLES = 8
name = sys.argv[1] if len(sys.argv) > 1 else "photos-t2i"
kind = sys.argv[2] if len(sys.argv) > 2 else "heldout"
pipe = vgen.load_pipeline(name)
ps = prompt_set(kind, 16, 0)
prompts = [p for p, _ in ps for _ in range(SAMPLES)]
facts = [f for _, f in ps for _ in range(SAMPLES)]
images = pipe.generate(prompts=prompts, seed=0, batch_size=32).images
read = {"colour": measure_colour(images), "brightness": measure_brightness(images)}
per = collections.defaultdict(collections.Counter)
for i, f in enumerate(facts):
    for attr in ("colour", "brightness"):
        if attr in f:
            per[(f["subject"], attr, f[attr])][read[attr][i]] += 1
total = collections.defaultdict(collections.Counter)
for (subject, attr, value), counts in sorted(per.items()):
    print(f"{subject}, {attr} {value}: {dict(counts)}")
    total[(attr, value)].update(counts)
for (attr, value), counts in sorted(total.items()):
    print(f"all, {attr} {value}: {dict(counts)}")
