"""Is SJD's FVD-photo gap on the video zoo a difference in distribution? (docs/video.md, issue 16)

SJD with temporal drafts proposes "copy the token one frame back". A bias towards accepting drafts would make its
clips more static than AR's. This script draws the same labels and seeds with `ar` and `sjd` (init=temporal,
window=16) on photos-video-gpt, measures per clip the share of tokens equal to the token one frame back (frames
1-7) and the clip's nll under the model's sampling distribution (gen.stats' per-sample values where present),
compares the two samplers with Welch's t-test, scores FVD-photo of both sets against clips-test, and tests
whether the sets' FVD-photo features come from one distribution (MMD, Gaussian kernel, permutation p-value). `scd` (Gumbel
coupling) is a third set: its tokens are AR's (`ar draw=gumbel`) by construction, other noise than `ar`'s; `ar` at
temperature 1.1 is a known small shift, to show the MMD test's power.

    python docs/scripts/sjd_video_check.py [--n 256] [--seed 0]

Writes docs/metrics/sjd_video_check.json.
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

import vgen.eval as ev
from vgen import load_pipeline
from vgen.io import atomic_write_json

OUT = Path(__file__).resolve().parent.parent / "metrics" / "sjd_video_check.json"


def copy_rate(tokens: torch.Tensor, shape) -> torch.Tensor:
    t, h, w = shape
    x = tokens.view(len(tokens), t, h * w)
    return (x[:, 1:] == x[:, :-1]).float().mean(dim=(1, 2))


def welch(a: torch.Tensor, b: torch.Tensor) -> dict:
    ma, mb = a.double().mean(), b.double().mean()
    va, vb = a.double().var() / len(a), b.double().var() / len(b)
    t = float((ma - mb) / (va + vb).sqrt())
    p = math.erfc(abs(t) / math.sqrt(2))  # normal approximation (n in the hundreds)
    return {"mean_a": float(ma), "mean_b": float(mb), "se_a": float(va.sqrt()), "se_b": float(vb.sqrt()), "t": t,
            "p_two_sided": p}


def features(videos: torch.Tensor) -> torch.Tensor:
    from vgen.eval.video_extractors import load_video_classifier
    net = load_video_classifier()
    return torch.cat([net(videos[i:i + 64])[0] for i in range(0, len(videos), 64)]).double()


def mmd_test(x: torch.Tensor, y: torch.Tensor, permutations: int = 500, seed: int = 0) -> dict:
    """Two-sample test on FVD-photo's clip features: unbiased MMD^2 with a Gaussian kernel (bandwidth: the median
    pairwise distance), p-value from permutations of the pooled sets."""
    z = torch.cat([x, y])
    d2 = torch.cdist(z, z) ** 2
    k = torch.exp(-d2 / d2[d2 > 0].median())
    n = len(x)

    def mmd2(idx):
        a, b = idx[:n], idx[n:]
        kxx, kyy, kxy = k[a][:, a], k[b][:, b], k[a][:, b]
        m = len(b)
        return float((kxx.sum() - kxx.diag().sum()) / (n * (n - 1)) + (kyy.sum() - kyy.diag().sum()) / (m * (m - 1))
                     - 2 * kxy.mean())
    obs = mmd2(torch.arange(len(z)))
    g = torch.Generator().manual_seed(seed)
    null = [mmd2(torch.randperm(len(z), generator=g)) for _ in range(permutations)]
    p = (1 + sum(v >= obs for v in null)) / (1 + permutations)
    return {"mmd2": obs, "p_permutation": p, "permutations": permutations}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    pipe = load_pipeline("photos-video-gpt")
    shape = tuple(pipe.model.token_shape)
    labels = [i % pipe.num_classes for i in range(a.n)]
    sets = {}
    for name, sampler, opts in (("ar", "ar", {}), ("sjd", "sjd", {"init": "temporal", "window": 16}),
                                ("scd", "scd", {"init": "temporal", "window": 16}),
                                ("ar_t1.1", "ar", {"temperature": 1.1})):  # a known small shift: the test's power
        t0 = time.perf_counter()
        gen = pipe.generate(labels, sampler=sampler, seed=a.seed * 1_000_000, batch_size=16, **opts)
        sec = time.perf_counter() - t0
        fvd = ev.fvd(gen.videos, "clips-test")["fvd"]
        sets[name] = {"videos": gen.videos, "copy": copy_rate(gen.tokens, shape), "fvd_photo": fvd,
                      "seconds": sec, "forward_passes": gen.stats["forward_passes"], "nll": gen.stats.get("nll")}
        print(f"{name}: FVD-photo {fvd:.2f}, copy rate {sets[name]['copy'].mean():.4f}, nll {gen.stats.get('nll')}, "
              f"{gen.stats['forward_passes']} passes, {sec:.0f} s", flush=True)
    res = {"command": "python docs/scripts/sjd_video_check.py" + (f" --n {a.n}" if a.n != 256 else "")
           + (f" --seed {a.seed}" if a.seed else ""), "n": a.n, "seed": a.seed,
           "sets": {k: {kk: vv for kk, vv in v.items() if kk not in ("videos", "copy")} | {
               "copy_rate_mean": float(v["copy"].mean())} for k, v in sets.items()},
           "copy_rate_sjd_vs_ar": welch(sets["sjd"]["copy"], sets["ar"]["copy"]),
           "copy_rate_scd_vs_ar": welch(sets["scd"]["copy"], sets["ar"]["copy"])}
    feats = {k: features(v["videos"]) for k, v in sets.items()}
    res["mmd_sjd_vs_ar"] = mmd_test(feats["sjd"], feats["ar"])
    res["mmd_scd_vs_ar"] = mmd_test(feats["scd"], feats["ar"])
    res["mmd_ar_t1.1_vs_ar"] = mmd_test(feats["ar_t1.1"], feats["ar"])
    res["copy_rate_ar_t1.1_vs_ar"] = welch(sets["ar_t1.1"]["copy"], sets["ar"]["copy"])
    print("power: ar at temperature 1.1 vs ar:", res["mmd_ar_t1.1_vs_ar"])
    print("MMD (FVD-photo features) sjd vs ar:", res["mmd_sjd_vs_ar"], " scd vs ar:", res["mmd_scd_vs_ar"])
    print(res["copy_rate_sjd_vs_ar"], res["copy_rate_scd_vs_ar"])
    atomic_write_json(OUT if a.n == 256 and a.seed == 0 else OUT.with_name(f"sjd_video_check_n{a.n}_s{a.seed}.json"),
                      res)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
