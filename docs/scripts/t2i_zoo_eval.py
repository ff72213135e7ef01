"""photos-t2i's goals, measured (docs/zoo.md#photos-t2i, docs/lab/benchmarks-log.md):

* subject accuracy of "a photo of the <subject>" prompts (every subject, SAMPLES each) by the captioned-photo
  classifier (chance 1/16);
* attribute accuracy on held-out (subject, treatment) combinations in held-out phrasings (colour and brightness
  measured from the pixels), and on seen combinations for comparison;
* the same subject samples scored against the next subject's prompt (a judge that is not lenient reads about 0);
* the subject judge's own ceiling: its accuracy on 512 unseen real crops of the training region (the generator's
  domain) and on their round trips through the pipeline's tokenizer (every sample the GPT can make is a decoded code
  grid, so a perfect generator scores about the latter);
* FID-photo of 256 samples for the captions of 256 captioned test crops against the captioned test crops
  (photos-t2i's data), beside photos-gpt's AR FID-photo against photos-test (its data), both 256 samples.

    python docs/scripts/t2i_zoo_eval.py [pipeline folder, default photos-t2i] [another judge's classifier.safetensors]
        > result.json

A second argument scores the subjects (and the judge's ceiling) again with that classifier too (``*_other_judge``):
how the 2026-11-27 judge compares with the one before it on the same samples. ``SAMPLES`` (default 8) and ``SEED``
(default 0) in the environment set the samples per prompt and the first seed of the prompt sets' samples: a second
look at a result with other seeds and more samples.
"""
import json
import os
import sys
import time

import vgen
import vgen.eval
from vgen.data.captions import captioned_photos, prompt_set

SAMPLES = int(os.environ.get("SAMPLES", "8"))
SEED = int(os.environ.get("SEED", "0"))
name = sys.argv[1] if len(sys.argv) > 1 else "photos-t2i"
other = sys.argv[2] if len(sys.argv) > 2 else None
pipe = vgen.load_pipeline(name)
out = {"model": name, "samples_per_prompt": SAMPLES, "seed": SEED}
t0 = time.time()


def run(prompts, seed=0):
    g = pipe.generate(prompts=prompts, seed=seed, batch_size=32)
    return g.images


for kind in ("subject", "heldout", "colour", "brightness"):
    ps = [p for p, _ in prompt_set(kind, 16, 0)]
    prompts = [p for p in ps for _ in range(SAMPLES)]
    images = run(prompts, seed=SEED)
    acc = vgen.eval.prompt_accuracy(images, prompts)
    out[kind] = {"prompts": len(ps), **acc}
    print(kind, json.dumps(acc), file=sys.stderr)
    if kind == "subject":  # the same images against the next subject's prompt: a judge that is not lenient reads ~0
        wrong = [prompts[(i + SAMPLES) % len(prompts)] for i in range(len(prompts))]
        out["subject_against_next_subject"] = vgen.eval.prompt_accuracy(images, wrong)["subject_accuracy"]
    if kind == "subject" and other:
        out["subject_other_judge"] = vgen.eval.prompt_accuracy(images, prompts, classifier=other)["subject_accuracy"]
        print("subject, other judge", out["subject_other_judge"], file=sys.stderr)

from vgen.eval.extractors import load_photo_classifier  # noqa: E402
from vgen.eval.t2i import T2I_CLASSIFIER  # noqa: E402
from vgen.train.photo import UNSEEN_SEED, predict, round_trip  # noqa: E402

real = captioned_photos("train", 512, seed=UNSEEN_SEED)
rt = round_trip(pipe.tokenizer, real.images)
for tag, path in (("", T2I_CLASSIFIER), ("_other_judge", other)):
    if path is not None:
        judge = load_photo_classifier(path)
        for key, x in (("real", real.images), ("roundtrip", rt)):
            out[f"judge_on_train_region_{key}{tag}"] = float((predict(judge, x) == real.labels).float().mean())
print("judge", {k: v for k, v in out.items() if k.startswith("judge")}, file=sys.stderr)

test = captioned_photos("test", 256, seed=5)  # not the reference's crops (seed 0)
images = run(list(test.captions), seed=1000)
out["fid_photo_vs_captioned_test"] = vgen.eval.fid(images, "captioned-test", isc=False)["fid"]
out["fid_photo_vs_photos_test"] = vgen.eval.fid(images, "photos-test", isc=False)["fid"]
real = vgen.eval.fid(test.images, "captioned-test", isc=False)["fid"]  # 256 real crops: the floor at this count
out["fid_photo_real_captioned_256"] = real
out["seconds"] = time.time() - t0
print(json.dumps(out, indent=2))
