"""Where one eager call of photos-gpt's draft head goes (docs/lab/benchmarks-log.md "An attention-free head"): batch 1
with CFG (2 rows), the shipped head on a prefilled cache, 20 warm-up calls, then 50 calls under torch.profiler;
prints the ops by self CPU time.

    python docs/scripts/head_profile.py                      # the shipped (block) head
    python docs/scripts/head_profile.py --drafter FILE       # another drafter.safetensors
    python docs/scripts/head_profile.py --fewop              # the sampler's few-op path (Drafter.inference)
"""
import argparse

import torch
from eagle_costs import setup  # (docs/scripts: this script's folder)
from torch.profiler import ProfilerActivity, profile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", default="", help="a drafter.safetensors (default: the one photos-gpt's card names)")
    ap.add_argument("--fewop", action="store_true", help="profile the sampler's few-op path instead of forward")
    a = ap.parse_args()
    m, d, _, dc = setup(a.drafter)
    if a.fewop:
        d = d.inference(m)
    g, x = torch.randn(2, 1, m.config.dim), torch.randint(0, m.vocab_size, (2, 1))
    pos = torch.tensor([[m.cond_len + 100]] * 2)
    for _ in range(20):
        d(m, g, x, pos, dc)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50):
            d(m, g, x, pos, dc)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
