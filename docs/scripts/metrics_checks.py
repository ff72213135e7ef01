"""Evidence for docs/metrics.md: the zoo photo classifier separates the classes on held-out data, and FID-photo
orders sets as it should (held-out real crops < zoo samples < degraded crops), on both backends.

    python docs/scripts/metrics_checks.py [--n 256]

Writes docs/metrics/checks.json, docs/metrics/classifier.png and docs/metrics/ordering.png.
"""
from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import vgen.eval as ev
from vgen import load_pipeline
from vgen.data import CLASS_NAMES, photos
from vgen.eval.extractors import load_photo_classifier
from vgen.io import atomic_write_bytes, atomic_write_json
from vgen.train.photo import evaluate


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    r = max(1, int(3 * sigma))
    k = torch.exp(-torch.arange(-r, r + 1, dtype=torch.float32) ** 2 / (2 * sigma ** 2))
    k = (k / k.sum()).to(torch.float32)
    y = F.pad(x.float(), (r, r, r, r), mode="replicate")
    y = F.conv2d(y, k.view(1, 1, 1, -1).expand(3, 1, 1, -1), groups=3)
    y = F.conv2d(y, k.view(1, 1, -1, 1).expand(3, 1, -1, 1), groups=3)
    return y.round().clamp(0, 255).to(torch.uint8)


def add_noise(x: torch.Tensor, sigma: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (x.float() + sigma * torch.randn(x.shape, generator=g)).round().clamp(0, 255).to(torch.uint8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "metrics"))
    args = ap.parse_args()
    out = Path(args.out)

    # 1. the classifier on held-out crops
    clf = load_photo_classifier()
    acc = evaluate(clf, n=1024, seed=0)
    test = photos("test", 1024, seed=0)
    with torch.no_grad():
        feats = torch.cat([clf(test.images[i:i + 128])[0] for i in range(0, 1024, 128)])

    # 2. FID-photo ordering
    real = photos("test", args.n, seed=1).images  # held-out crops, not the reference's (seed 0)
    t0 = time.perf_counter()
    zoo = load_pipeline("photos-gpt").generate([i % 16 for i in range(args.n)], seed=0, batch_size=32).images
    zoo_seconds = time.perf_counter() - t0
    sets = {"held-out real crops": real, "zoo samples (photos-gpt, ar)": zoo}
    for s in (1.0, 2.0):
        sets[f"real, Gaussian blur sigma {s:g}"] = gaussian_blur(real, s)
    for s in (10, 25):
        sets[f"real, Gaussian noise sigma {s}"] = add_noise(real, s)
    sets["zoo, Gaussian blur sigma 1"] = gaussian_blur(zoo, 1.0)
    rows = []
    for name, x in sets.items():
        row = {"set": name, "n": len(x)}
        for backend in ev.BACKENDS:
            r = ev.fid(x, "photos-test", backend=backend, isc=backend == "torch-fidelity", kid_subset_size=100)
            row[backend] = {k: r[k] for k in ("fid", "kid_mean", "kid_std") if k in r}
            if "isc_mean" in r:
                row["isc_photo"] = r["isc_mean"]
        rows.append(row)
        print(f"{name:40s} FID-photo {row['torch-fidelity']['fid']:8.2f} (clean-fid {row['clean-fid']['fid']:8.2f})"
              f"  KID {row['torch-fidelity']['kid_mean']:.4f}  IS {row.get('isc_photo', 0):.2f}")

    atomic_write_json(out / "checks.json", {
        "command": "python docs/scripts/metrics_checks.py" + (f" --n {args.n}" if args.n != 256 else ""),
        "classifier": {"test_accuracy": acc["test_accuracy"],
                       "per_class_accuracy": dict(zip(CLASS_NAMES, acc["per_class_accuracy"])),
                       "eval_n": acc["eval_n"]},
        "reference": "photos-test (1000 held-out crops, seed 0)", "zoo_sampling_seconds": zoo_seconds,
        "ordering": rows})
    _plots(out, acc, feats, test.labels, rows)


def _plots(out: Path, acc, feats, labels, rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5.5))
    conf = np.array(acc["confusion"], dtype=float)
    conf /= conf.sum(1, keepdims=True).clip(1)
    a1.imshow(conf, cmap="viridis", vmin=0, vmax=1)
    a1.set_xticks(range(len(CLASS_NAMES)), CLASS_NAMES, rotation=90, fontsize=7)
    a1.set_yticks(range(len(CLASS_NAMES)), CLASS_NAMES, fontsize=7)
    a1.set_xlabel("predicted")
    a1.set_ylabel("true")
    a1.set_title(f"held-out confusion (accuracy {acc['test_accuracy']:.3f}, {acc['eval_n']} crops)")
    f = feats - feats.mean(0)
    _, _, v = torch.pca_lowrank(f, q=2, center=False)
    p = (f @ v).numpy()
    cmap = plt.get_cmap("tab20")
    for c in range(len(CLASS_NAMES)):
        m = labels.numpy() == c
        a2.scatter(p[m, 0], p[m, 1], s=4, color=cmap(c), label=CLASS_NAMES[c])
    a2.legend(fontsize=6, markerscale=3, ncol=2)
    a2.set_title("held-out features (512-d), first two principal components")
    fig.tight_layout()
    _save(fig, out / "classifier.png")

    fig, ax = plt.subplots(figsize=(9, 4))
    names = [r["set"] for r in rows]
    y = np.arange(len(rows))
    ax.barh(y - 0.2, [r["torch-fidelity"]["fid"] for r in rows], 0.4, label="torch-fidelity")
    ax.barh(y + 0.2, [r["clean-fid"]["fid"] for r in rows], 0.4, label="clean-fid")
    ax.set_yticks(y, names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("FID-photo vs photos-test (lower is better)")
    ax.legend()
    fig.tight_layout()
    _save(fig, out / "ordering.png")


def _save(fig, path):
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


if __name__ == "__main__":
    main()
