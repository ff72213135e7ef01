"""Do the held-out (subject, treatment) combinations survive photos-t2i's tokenizer? 256 held-out crops (32 per
combination, test split, seed 3) through the pipeline's VQ round trip, read by the same pixel judges as the prompt
accuracy: the count per combination whose held-out attribute reads back right (docs/lab/benchmarks-log.md).

    python docs/scripts/t2i_heldout_roundtrip.py [pipeline folder, default photos-t2i]
"""
import collections
import json
import sys

import vgen
from vgen.data.captions import HELDOUT_COMBOS, captioned_photos, measure_brightness, measure_colour
from vgen.train.photo import round_trip

pipe = vgen.load_pipeline(sys.argv[1] if len(sys.argv) > 1 else "photos-t2i")
d = captioned_photos("test", 256, seed=3, heldout=True)
out = {}
for name, images in (("real", d.images), ("round_trip", round_trip(pipe.tokenizer, d.images))):
    read = {"colour": measure_colour(images), "brightness": measure_brightness(images)}
    hits, n = collections.Counter(), collections.Counter()
    for i, f in enumerate(d.facts):
        for subject, attr, value in HELDOUT_COMBOS:
            if f.subject == subject and getattr(f, attr) == value:
                n[f"{subject} {value}"] += 1
                hits[f"{subject} {value}"] += read[attr][i] == value
    out[name] = {k: f"{hits[k]}/{n[k]}" for k in n}
print(json.dumps(out, indent=2))
