"""Evidence for docs/metrics.md and docs/video.md: FVD-photo measures motion as well as content, and where the zoo's
video samplers land.

    python docs/scripts/fvd_checks.py [--n 128] [--skip-samples]

Every set holds n clips and is compared with the registered reference clips-test (512 held-out clips, seed 0):
held-out real clips (other clips of the same test region, seed 1), the same clips with their frames shuffled or
with the first frame frozen (every frame still a real photo crop), training-region clips, and the zoo samplers
(photos-video-gpt: ar, sjd with temporal drafts; photos-video-nar: nar) with two sampling seeds each, to show the
noise. Writes docs/metrics/fvd_checks.json and prints a markdown table.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import vgen.eval as ev
from vgen import load_pipeline
from vgen.data import clips
from vgen.eval.video_extractors import load_video_classifier
from vgen.io import atomic_write_json

OUT = Path(__file__).resolve().parent.parent / "metrics" / "fvd_checks.json"


def shuffled(videos: torch.Tensor, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([v[torch.randperm(v.shape[0], generator=g)] for v in videos])


def frozen(videos: torch.Tensor) -> torch.Tensor:
    return videos[:, :1].expand_as(videos).contiguous()


@torch.no_grad()
def accuracy(n: int = 512) -> dict:
    from vgen.train.video_classifier import evaluate
    return evaluate(load_video_classifier(), n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--skip-samples", action="store_true", help="real-clip sets only")
    a = ap.parse_args()
    n = a.n
    rows = []

    def score(name, videos, **extra):
        t0 = time.perf_counter()
        r = ev.fvd(videos, "clips-test")
        rows.append({"set": name, "fvd_photo": r["fvd"], "n": len(videos), **extra})
        print(f"{name:45s} FVD-photo {r['fvd']:8.2f}  ({time.perf_counter() - t0:.0f} s)", flush=True)

    real = clips("test", n, seed=1).videos
    score("held-out real clips", real)
    score("real, frames shuffled", shuffled(real))
    score("real, first frame frozen", frozen(real))
    score("training-region clips", clips("train", n, seed=1).videos)
    if not a.skip_samples:
        for model, settings in (("photos-video-gpt", [("ar", {}), ("sjd", {"init": "temporal", "window": 16})]),
                                ("photos-video-nar", [("nar", {})])):
            pipe = load_pipeline(model)
            for sampler, opts in settings:
                for seed in (0, 1):
                    t0 = time.perf_counter()
                    labels = [i % pipe.num_classes for i in range(n)]
                    gen = pipe.generate(labels, sampler=sampler, seed=seed * 1_000_000, batch_size=16, **opts)
                    sec = time.perf_counter() - t0
                    score(f"{model} {sampler} (seed {seed})", gen.videos, sampling_seconds=sec,
                          forward_passes=gen.stats["forward_passes"])
    atomic_write_json(OUT, {"n": n, "reference": "clips-test", "rows": rows})
    print("\n| set | FVD-photo |\n|---|---|")
    for r in rows:
        print(f"| {r['set']} | {r['fvd_photo']:.2f} |")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
