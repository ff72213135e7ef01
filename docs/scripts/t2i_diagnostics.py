"""The numbers behind photos-t2i's "why" (docs/zoo.md#photos-t2i-text-to-image, the lab log):

* subject accuracy by guidance scale ("a photo of the <subject>", every subject, 4 samples each);
* what the pipeline's VQ keeps of the treatments: a round trip of 600 real captioned crops, measured by the same
  pixel measures as the prompt accuracy (the first release's numbers in the docs were taken with photos-gpt's VQ and
  the pixel-exact thresholds of the time);
* the plain photo classifier on 400 captioned test crops, and photo-classifier-t2i on 512 unseen crops of the
  training region (`vgen.train.photo.UNSEEN_SEED`: never drawn in its training; before 2026-11-27 seed 777,
  which its first stage drew once, at step 777).

    python docs/scripts/t2i_diagnostics.py > diagnostics.json
"""
import json

import torch

import vgen
import vgen.eval
from vgen.data import to_model_range, to_uint8
from vgen.data.captions import captioned_photos, prompt_set
from vgen.eval.extractors import load_photo_classifier
from vgen.eval.t2i import T2I_CLASSIFIER
from vgen.train.photo import UNSEEN_SEED
from vgen.train.vq import treatments_kept

out = {}
pipe = vgen.load_pipeline("photos-t2i")
ps = [p for p, _ in prompt_set("subject", 16, 0)] * 4
for cfg in (3.0, 5.0, 8.0):
    g = pipe.generate(prompts=ps, seed=0, batch_size=32, cfg_scale=cfg)
    out[f"subject_accuracy_cfg{cfg:g}"] = vgen.eval.prompt_accuracy(g.images, ps)["subject_accuracy"]

d = captioned_photos("train", 600, seed=999)
with torch.inference_mode():
    rec = torch.cat([to_uint8(pipe.tokenizer.decode(pipe.tokenizer.encode(to_model_range(d.images[i:i + 100]))))
                     for i in range(0, 600, 100)])
kept = treatments_kept(rec, d.facts)
for key in ("colour", "brightness"):
    out[f"vq_round_trip_keeps_{key}"] = {k: round(v, 3) for k, v in kept[f"{key}_kept_by_value"].items()}


def accuracy(net, data):
    with torch.inference_mode():
        pred = torch.cat([net(data.images[i:i + 100])[1].argmax(-1) for i in range(0, len(data.labels), 100)])
    return pred == data.labels


t = captioned_photos("test", 400, seed=1)
hit = accuracy(load_photo_classifier(), t)
out["plain_classifier_on_captioned_test"] = round(hit.float().mean().item(), 3)
for colour in ("natural", "warm", "cool"):
    sel = torch.tensor([f.colour == colour for f in t.facts])
    out[f"plain_classifier_on_captioned_test_{colour}"] = round(hit[sel].float().mean().item(), 3)
unseen = captioned_photos("train", 512, seed=UNSEEN_SEED)
out["t2i_classifier_on_unseen_train_region"] = round(
    accuracy(load_photo_classifier(T2I_CLASSIFIER), unseen).float().mean().item(), 3)
print(json.dumps(out, indent=2))
