"""How vgen.data.captions' read-back thresholds (DARK_MAX, BRIGHT_MIN, BW_CHROMA, TINT_EDGE) were chosen.

The thresholds judge generated images (prompt accuracy), and a generator draws through its tokenizer, so a fair
judge must read the treatments back both from the crops themselves and from their tokenizer round trips. On 2,000
training crops (seed 0) and their round trips through photos-t2i's VQ, a grid search picks the thresholds that
maximise the lower of the two recoveries (brightness first; colour with the brightness undone by its true value,
to judge colour alone). Then both the thresholds in the module and the pixel-exact ones used before are scored with
the real measure functions on 1,000 test crops (seed 1) and their round trips.

    python docs/scripts/calibrate_treatment_judge.py [pipeline] > judge.json
"""
import json
import sys

import numpy as np
import torch

import vgen
import vgen.data.captions as C
from vgen.data import to_model_range, to_uint8

pipe = vgen.load_pipeline(sys.argv[1] if len(sys.argv) > 1 else "photos-t2i")


def round_trip(images):
    with torch.inference_mode():
        return torch.cat([to_uint8(pipe.tokenizer.decode(pipe.tokenizer.encode(to_model_range(images[i:i + 200]))))
                          for i in range(0, len(images), 200)])


def quantiles(x, q, dim):
    return torch.quantile(x, q, dim=dim).numpy()


def light_features(images):
    x = images.double()
    return quantiles(x.amax(1).flatten(1), 0.99, 1), quantiles(x.amin(1).flatten(1), 0.01, 1)


def colour_features(images, lights):
    rows = []
    for img, light in zip(images.double(), lights):
        if light == "dark":
            img = img / C.DIM
        elif light == "bright":
            img = 255 - (255 - img) / C.DIM
        img = img.clamp(0, 255)
        q = torch.tensor([0.02, 0.98], dtype=img.dtype)
        r_lo, r_hi = torch.quantile(img[0].flatten(), q).tolist()
        b_lo, b_hi = torch.quantile(img[2].flatten(), q).tolist()
        rows.append(((img.amax(0) - img.amin(0)).mean().item(), r_lo, r_hi, b_lo, b_hi))
    return np.array(rows)


def judge_light(top, floor, dark_max, bright_min):
    return np.where(top <= dark_max, "dark", np.where(floor >= bright_min, "bright", "normal"))


def judge_colour(f, bw, edge):
    chroma, r_lo, r_hi, b_lo, b_hi = f.T
    warm, cool = (r_lo >= edge) & (b_hi <= 255 - edge), (b_lo >= edge) & (r_hi <= 255 - edge)
    return np.where(chroma < bw, "black and white", np.where(warm, "warm", np.where(cool, "cool", "natural")))


train = C.captioned_photos("train", 2000, seed=0)
lights = np.array([f.brightness for f in train.facts])
colours = np.array([f.colour for f in train.facts])
sets = {"crops": train.images, "round_trips": round_trip(train.images)}
lf = {k: light_features(v) for k, v in sets.items()}
grid = [(min((judge_light(*lf[k], d, b) == lights).mean() for k in sets), d, b)
        for d in range(100, 131, 5) for b in range(125, 151, 5)]
best_light = max(grid)
cf = {k: colour_features(v, lights) for k, v in sets.items()}
grid = [(min((judge_colour(cf[k], bw, e) == colours).mean() for k in sets), bw, e)
        for bw in (2, 8, 12, 16, 20, 24, 28, 32, 40) for e in range(90, 126, 5)]
best_colour = max(grid)
out = {"chosen_on_train": {"DARK_MAX": best_light[1], "BRIGHT_MIN": best_light[2], "BW_CHROMA": best_colour[1],
                           "TINT_EDGE": best_colour[2], "min_recovery_brightness": round(best_light[0], 4),
                           "min_recovery_colour": round(best_colour[0], 4)}}

test = C.captioned_photos("test", 1000, seed=1)
test_sets = {"crops": test.images, "round_trips": round_trip(test.images)}
truth = {"colour": np.array([f.colour for f in test.facts]), "brightness": np.array([f.brightness for f in test.facts])}
for name, th in (("module", dict(DARK_MAX=C.DARK_MAX, BRIGHT_MIN=C.BRIGHT_MIN, BW_CHROMA=C.BW_CHROMA,
                                  TINT_EDGE=C.TINT_EDGE)),
                 ("pixel_exact_before", dict(DARK_MAX=110.0, BRIGHT_MIN=145.0, BW_CHROMA=2.0, TINT_EDGE=120.0))):
    saved = {k: getattr(C, k) for k in th}
    for k, v in th.items():
        setattr(C, k, v)
    try:
        res = {"thresholds": th}
        for k, imgs in test_sets.items():
            got = {"colour": np.array(C.measure_colour(imgs)), "brightness": np.array(C.measure_brightness(imgs))}
            res[k] = {a: round(float((got[a] == truth[a]).mean()), 4) for a in got}
            res[k].update({f"{a}={v}": round(float((got[a] == truth[a])[truth[a] == v].mean()), 3)
                           for a in got for v in sorted(set(truth[a]))})
        out[f"test_{name}"] = res
    finally:
        for k, v in saved.items():
            setattr(C, k, v)
print(json.dumps(out, indent=1))
