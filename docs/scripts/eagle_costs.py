"""Where an eagle pass goes on photos-gpt (docs/benchmarks.md "Trained draft head"): eager, batch 1 with CFG
(2 rows), the zoo weights; medians of 200 calls (after 10 warm-up calls) of the target's pass over 1 and 4 query
tokens, the draft head over 1 and 4, and one draft's output head, guidance / top-k and draw.

    python docs/scripts/eagle_costs.py
"""
import statistics
import time

import torch

import vgen
from vgen.kernels.sampling import sample_from_probs
from vgen.kernels.verify import window_target
from vgen.models.drafter import load_drafter


def ms(f, n=200):
    for _ in range(10):
        f()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return 1e3 * statistics.median(out)


def main():
    torch.set_grad_enabled(False)
    pipe = vgen.load_pipeline("photos-gpt")
    m = pipe.model
    d = load_drafter(pipe.card["_folder"] + "/" + pipe.card["drafter"])
    cache, dc = m.new_cache(2), d.new_cache(m, 2)
    m.prefill(torch.tensor([1, m.num_classes]), cache)
    for W in (1, 4):
        x = torch.randint(0, m.vocab_size, (2, W))
        pos = m.cond_len + 100 + torch.arange(W)
        cache.limit(cache.bucket(m.cond_len + 100 + W))
        h = torch.randn(2, W, m.config.dim)
        print(f"target pass, {W} token(s): {ms(lambda: m.decode_features(x, pos, cache)):.2f} ms")
        print(f"draft head, {W} token(s): {ms(lambda: d(m, h, x, pos[None].expand(2, -1), dc)):.2f} ms")
    kw = dict(cfg_scale=3.0, cfg_interval=-1, temperature=1.0, top_k=100, top_p=1.0)
    g = torch.randn(2, 1, m.config.dim)
    idx = torch.tensor([[5]])
    u = torch.rand(1)

    def one_draft():
        q = window_target(m.head(g), idx, True, **kw)[:, 0]
        return sample_from_probs(q, u)
    print(f"one draft (output head + guidance / top-k + draw): {ms(one_draft):.2f} ms")


if __name__ == "__main__":
    main()
