"""Evidence for docs/continuous.md and docs/lab/benchmarks-log.md: CSpD keeps the target's distribution and quality.

    python docs/scripts/cspd_quality.py [--n 128] [--seeds 0 1] [--options stop_sigma=0.1]

FID-photo (and KID) against photos-test of n samples (labels i % 16) for: the target alone (photos-car, `ar`),
CSpD with photos-car-draft (rule=path, k=4; rule=exact draws the same distribution and is slower, see
docs/lab/benchmarks-log.md) and the draft alone (photos-car-draft, `ar`), each with
two sampling seeds to show the noise; plus the real held-out images (photos-test, other crops) as the floor.
Sampling options come from the cards, overridden by --options. Writes docs/metrics/cspd_quality.json and prints a
markdown table.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

import vgen.eval as ev
from vgen import load_pipeline
from vgen.data import photos
from vgen.io import atomic_write_json

OUT = Path(__file__).resolve().parent.parent / "metrics" / "cspd_quality.json"
SETTINGS = [("photos-car", "ar", {}), ("photos-car", "cspd", {"num_draft": 4, "rule": "path"}),
            ("photos-car-draft", "ar", {})]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--options", nargs="*", default=[], help="key=value sampling options for every setting")
    a = ap.parse_args()
    extra = {k: yaml.safe_load(v) for k, v in (x.split("=", 1) for x in a.options)}
    rows = []
    real = photos("test", a.n, seed=7).images
    r = ev.fid(real, "photos-test", isc=False, kid_subset_size=min(a.n, 100))
    rows.append({"set": "real held-out crops", "fid_photo": r["fid"], "kid_photo": r["kid_mean"]})
    pipes = {}
    for model, sampler, opts in SETTINGS:
        pipe = pipes.setdefault(model, load_pipeline(model))
        for seed in a.seeds:
            t0 = time.perf_counter()
            gen = pipe.generate([i % pipe.num_classes for i in range(a.n)], sampler=sampler, seed=seed * 100_000,
                                batch_size=a.batch, **opts, **extra)
            r = ev.fid(gen.images, "photos-test", isc=False, kid_subset_size=min(a.n, 100))
            name = f"{model} {sampler}" + "".join(f" {k}={v}" for k, v in opts.items())
            rows.append({"set": name, "seed": seed, "fid_photo": r["fid"], "kid_photo": r["kid_mean"],
                         "acceptance_rate": gen.stats.get("acceptance_rate"),
                         "forward_passes": gen.stats["forward_passes"], "seconds": time.perf_counter() - t0})
            print(json.dumps(rows[-1]), flush=True)
    atomic_write_json(OUT, {"n": a.n, "options": extra, "rows": rows})
    print("| set | seed | FID-photo | KID-photo | acceptance |\n|---|---|---|---|---|")
    for r in rows:
        acc = r.get("acceptance_rate")
        print(f"| {r['set']} | {r.get('seed', '')} | {r['fid_photo']:.2f} | {r['kid_photo']:.4f} | "
              f"{'' if acc is None else f'{acc:.2f}'} |")


if __name__ == "__main__":
    main()
