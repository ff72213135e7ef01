"""Evidence for docs/metrics.md, the ADM suite: (1) on the photo domain, every metric orders held-out real crops
better than every zoo model's samples, and those better than noise images (a degraded real set is reported
beside them); (2) what the suite costs on this CPU per 1,000
images (features with the photo classifier and with the Inception port; sampling with LlamaGen GPT-B + VQ-16 at
256 px, the architecture of the ImageNet protocol, random weights: the speed is the weights' shapes').

    python docs/scripts/adm_suite_checks.py [--n 256] [--skip-timing]

Writes docs/metrics/adm_checks.json.
"""
from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import torch

import vgen
import vgen.eval as ev
from vgen import load_pipeline
from vgen.data import photos
from vgen.errors import VGenWarning
from vgen.io import atomic_write_json

METRICS = (("fid", "lower"), ("sfid", "lower"), ("kid", "lower"), ("is", "higher"), ("precision", "higher"),
           ("recall", "higher"))


def add_noise(x: torch.Tensor, sigma: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (x.float() + sigma * torch.randn(x.shape, generator=g)).round().clamp(0, 255).to(torch.uint8)


def ordering(n: int) -> dict:
    real = photos("test", n, seed=1).images  # held-out crops, not the reference's (seed 0)
    labels = [i % 16 for i in range(n)]
    sets = {"held-out real crops": ("real", real)}
    for model in ("photos-gpt", "photos-var", "photos-nar"):
        pipe = load_pipeline(model)
        sets[f"zoo samples ({model}, {pipe.card.order})"] = (
            "zoo", pipe.generate(labels, seed=0, batch_size=32).images)
    g = torch.Generator().manual_seed(0)
    sets["uniform noise"] = ("noise", torch.randint(0, 256, real.shape, generator=g, dtype=torch.uint8))
    blobs = torch.rand((n, 3, 8, 8), generator=g) * 255
    sets["smooth noise (8x8 uniform, upsampled)"] = (
        "noise", torch.nn.functional.interpolate(blobs, size=real.shape[-1], mode="bicubic").round().clamp(0, 255)
        .to(torch.uint8))
    sets["real, Gaussian noise sigma 25"] = ("degraded", add_noise(real, 25))  # reported, not in the ordering
    rows = []
    for name, (group, x) in sets.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", VGenWarning)
            r = ev.evaluate(x, "photos-test")
        rows.append({"set": name, "group": group, "n": len(x), **{k: r[k] for k, _ in METRICS},
                     "kid_std": r["kid_std"]})
        print(f"{name:42s} " + "  ".join(f"{k} {r[k]:.4g}" for k, _ in METRICS), flush=True)
    checks = {}
    for k, better in METRICS:
        def worst(g):
            vals = [r[k] for r in rows if r["group"] == g]
            return max(vals) if better == "lower" else min(vals)

        def best(g):
            vals = [r[k] for r in rows if r["group"] == g]
            return min(vals) if better == "lower" else max(vals)
        sign = 1 if better == "lower" else -1
        checks[k] = bool(sign * worst("real") < sign * best("zoo") and sign * worst("zoo") < sign * best("noise"))
    print("real < every zoo model < every noise set, per metric:", checks)
    return {"rows": rows, "ordered": checks}


def timing(n_feat: int = 128, n_gen: int = 8) -> dict:
    """Seconds per 1,000 images: suite features (photo, Inception port at 256 px input) and GPT-B sampling."""
    from vgen.eval.adm import features
    from vgen.eval.extractors import random_inception_weights
    from vgen.models import build
    out = {"threads": torch.get_num_threads()}
    x64 = photos("test", n_feat, seed=2).images
    t = time.perf_counter()
    features(x64, "photo")
    out["photo_features_per_1000_s"] = (time.perf_counter() - t) / n_feat * 1000
    x256 = torch.nn.functional.interpolate(x64[:32].float(), size=256, mode="bilinear").round().to(torch.uint8)
    with tempfile.TemporaryDirectory() as d:
        w = random_inception_weights(Path(d) / "inception.safetensors")
        features(x256[:4], "inception", weights=w)  # warm-up
        t = time.perf_counter()
        features(x256, "inception", weights=w, batch_size=32)
        out["inception_features_per_1000_s"] = (time.perf_counter() - t) / len(x256) * 1000
    torch.manual_seed(0)
    gpt = build("gpt", dim=768, n_layer=12, n_head=12, vocab_size=16384, block_size=256, num_classes=1000).eval()
    vq = build("vq").eval()
    labels = list(range(n_gen))
    vgen.sample(gpt, labels[:2], sampler="ar", seed=0, cfg_scale=2.0)  # warm-up
    t = time.perf_counter()
    tokens, _ = vgen.sample(gpt, labels, sampler="ar", seed=0, cfg_scale=2.0, top_k=0)
    t_gen = time.perf_counter() - t
    t = time.perf_counter()
    with torch.no_grad():
        for i in range(n_gen):
            vq.decode(tokens[i:i + 1].view(1, 16, 16))
    t_dec = time.perf_counter() - t
    out.update(gpt_b_ar_cfg_per_1000_s=t_gen / n_gen * 1000, vq16_decode_256px_per_1000_s=t_dec / n_gen * 1000,
               gen_batch=n_gen)
    print({k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--skip-ordering", action="store_true", help="rerun the timing only (keeps the ordering part)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "metrics" / "adm_checks.json"))
    args = ap.parse_args()
    import json
    old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    res = {"command": "python docs/scripts/adm_suite_checks.py" + (f" --n {args.n}" if args.n != 256 else ""),
           "ordering": old.get("ordering") if args.skip_ordering else ordering(args.n)}
    res["timing"] = old.get("timing") if args.skip_timing else timing()
    atomic_write_json(args.out, res)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
