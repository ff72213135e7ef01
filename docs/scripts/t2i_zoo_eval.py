"""photos-t2i's goals, measured (docs/zoo.md#photos-t2i, docs/lab/benchmarks-log.md):

* subject accuracy of "a photo of the <subject>" prompts (every subject, SAMPLES each) by the captioned-photo
  classifier (chance 1/16);
* attribute accuracy on held-out (subject, treatment) combinations in held-out phrasings (colour and brightness
  measured from the pixels), and on seen combinations for comparison;
* FID-photo of 256 samples for the captions of 256 captioned test crops against the captioned test crops
  (photos-t2i's data), beside photos-gpt's AR FID-photo against photos-test (its data), both 256 samples.

    python docs/scripts/t2i_zoo_eval.py [pipeline folder, default photos-t2i] > result.json
"""
import json
import sys
import time

import torch

import vgen
import vgen.eval
from vgen.data.captions import captioned_photos, prompt_set

SAMPLES = 8
name = sys.argv[1] if len(sys.argv) > 1 else "photos-t2i"
pipe = vgen.load_pipeline(name)
out = {"model": name, "samples_per_prompt": SAMPLES}
t0 = time.time()


def run(prompts, seed=0):
    g = pipe.generate(prompts=prompts, seed=seed, batch_size=32)
    return g.images


for kind in ("subject", "heldout", "colour", "brightness"):
    ps = [p for p, _ in prompt_set(kind, 16, 0)]
    prompts = [p for p in ps for _ in range(SAMPLES)]
    acc = vgen.eval.prompt_accuracy(run(prompts), prompts)
    out[kind] = {"prompts": len(ps), **acc}
    print(kind, json.dumps(acc), file=sys.stderr)

test = captioned_photos("test", 256, seed=5)  # not the reference's crops (seed 0)
images = run(list(test.captions), seed=1000)
out["fid_photo_vs_captioned_test"] = vgen.eval.fid(images, "captioned-test", isc=False)["fid"]
out["fid_photo_vs_photos_test"] = vgen.eval.fid(images, "photos-test", isc=False)["fid"]
real = vgen.eval.fid(test.images, "captioned-test", isc=False)["fid"]  # 256 real crops: the floor at this count
out["fid_photo_real_captioned_256"] = real
out["seconds"] = time.time() - t0
print(json.dumps(out, indent=2))
