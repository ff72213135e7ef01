"""Is the head's draft distribution q best drawn with the target's own settings? (docs/lab/benchmarks-log.md "Glue ops")

Any q keeps the exact rule exact (drafts are verified against the q they were drawn from), so the draft's guidance
scale, temperature and top-k could differ from the target's. This script scores a grid of them by the one-step
acceptance sum_x min(p, q) at the head's chained depths 1..3 (p: the target at the card's settings, CFG 3.0,
temperature 1.0, top-k 100), on held-out sequences the target sampled itself (a drafter recipe run with
``recipe.self_samples``: its ``features_self_test.pt`` and ``self_test.pt``).

    python docs/scripts/draft_calibration.py --run runs/photos-gpt-drafter-self12k [--drafter FILE] [--n 48]
"""
import argparse

import torch

from vgen.kernels.verify import window_target
from vgen.models.drafter import load_drafter
from vgen.train.drafter import drafter_losses, load_target


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True, help="a drafter recipe run folder with self-sampled held-out features")
    ap.add_argument("--drafter", default="vgen/zoo/photos-gpt/drafter.safetensors")
    ap.add_argument("--n", type=int, default=48, help="held-out sequences scored")
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    pipe, target = load_target("photos-gpt", "cpu")
    s = pipe.card.sampling
    head = load_drafter(a.drafter)
    feats = torch.load(f"{a.run}/features_self_test.pt", weights_only=True)["features"][:a.n]
    codes = torch.load(f"{a.run}/self_test.pt", weights_only=True)["codes"][:a.n]
    depths, B = 3, 16
    logits = [drafter_losses(head, target, feats[i:i + B], codes[i:i + B], depths=depths)
              for i in range(0, a.n, B)]
    print(f"{a.n} held-out sequences, p at CFG {s['cfg_scale']}, temperature {s['temperature']}, top-k {s['top_k']}")
    print("| q: CFG | temperature | top-k | acceptance depth 1 / 2 / 3 |\n|---|---|---|---|")
    for cfg in (s["cfg_scale"], s["cfg_scale"] - 0.5, s["cfg_scale"] + 0.5):
        for temp in (0.9, 1.0, 1.1):
            for k in (s["top_k"], 60, 150):
                acc, n = [0.0] * depths, [0] * depths
                for r in logits:
                    for d in range(depths):
                        lq, lp = r["logits_q"][d], r["logits_p"][d]
                        rows, S = lq.shape[0] // 2, lq.shape[1]
                        idx = torch.arange(d + 1, S + d + 1).expand(rows, S)
                        p = window_target(lp, idx, True, s["cfg_scale"], -1, s["temperature"], s["top_k"], 1.0)
                        q = window_target(lq, idx, True, cfg, -1, temp, k, 1.0)
                        acc[d] += float(torch.minimum(p, q).sum())
                        n[d] += rows * S
                print(f"| {cfg} | {temp} | {k} | " + " / ".join(f"{x / m:.4f}" for x, m in zip(acc, n)) + " |")


if __name__ == "__main__":
    main()
