"""Sample grids of every token sampler next to AR for the same labels and seeds, and heatmaps of the forward
pass at which each token was decided. Writes docs/samplers/*.png (used by docs/samplers.md).

    python docs/scripts/sampler_grids.py [--model photos-gpt] [--n 8]
"""
from __future__ import annotations

import argparse
import io
from pathlib import Path

import torch

from vgen import load_pipeline
from vgen.io import atomic_write_bytes, atomic_write_json, make_grid, save_png

SETTINGS = [
    ("ar", {}),
    ("sjd", dict(window=4, init="vertical")),
    ("gsd", dict(window=4, init="vertical")),
    ("lantern", dict(window=4, init="vertical")),
    ("lantern", dict(window=8, init="vertical", delta=0.2)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="photos-gpt")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "samplers"))
    args = ap.parse_args()
    out = Path(args.out)
    pipe = load_pipeline(args.model)
    labels = [i % pipe.num_classes for i in range(args.n)]
    results = []
    for name, opts in SETTINGS:
        gen = pipe.generate(labels, sampler=name, seed=0, batch_size=args.n, **opts)
        tag = name + "".join(f"-{k}{v}" for k, v in opts.items())
        save_png(out / f"{tag}.png", make_grid(gen.images, nrow=args.n))
        results.append((tag, gen))
        print(tag, {k: round(v, 3) for k, v in gen.stats.items() if isinstance(v, float)})

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    spec = [(t, g) for t, g in results if not t.startswith("ar")]
    fig, axes = plt.subplots(len(spec), args.n, figsize=(1.6 * args.n, 1.7 * len(spec)))
    h, w = pipe.model.token_shape
    for r, (tag, gen) in enumerate(spec):
        for c in range(args.n):
            ax = axes[r, c]
            im = ax.imshow(gen.step_map[c].view(h, w).numpy(), cmap="viridis")
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(tag, fontsize=6)
            ax.set_title(f"{int(gen.step_map[c].max()) + 1} passes", fontsize=6)
    fig.colorbar(im, ax=axes, shrink=0.6, label="forward pass")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(out / "step_maps.png", buf.getvalue())
    summary = {tag: {k: v for k, v in g.stats.items() if isinstance(v, (int, float))} for tag, g in results}
    atomic_write_json(out / "stats.json", {"model": args.model, "labels": labels, "seed": 0, "samplers": summary})
    print(f"wrote {out}")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
