"""Where an eagle pass goes on photos-gpt (docs/lab/benchmarks-log.md "Trained draft head"): batch 1 with CFG (2 rows), the
zoo weights, medians of 200 calls (round-robin over the parts after 10 warm-up calls each, on a cache filled to
position 100) of AR's decode step, the target's pass over W query tokens (with guidance / top-k of its W
distributions), the draft head over W tokens, one draft (output head, guidance / top-k, draw: the sampler's draw
over the head's top-k, and the earlier one over the whole vocabulary beside it) and one chain step
(a draft, then the head on it); then a
cost model of a chain pass of width W: the target's W-token pass + the head's catch-up over W + (W - 2) chain
steps + one draft, against AR's step, with tokens per pass from ``--tokens`` (docs/lab/benchmarks-log.md's exact rows).

    python docs/scripts/eagle_costs.py                 # eager
    python docs/scripts/eagle_costs.py --compile       # each part compiled (cpp_wrapper, as vgen's steps)
    python docs/scripts/eagle_costs.py --drafter runs/photos-gpt-drafter-mlp/drafter.safetensors --tokens 3:1.91,4:2.04
                                                       # another head, e.g. the attention-free one (arch=mlp)

The head's parts (catch-up, draft, chain step) run through the sampler's few-op path (``Drafter.inference``, since
commit 071bec2); the table also times the head's ``nn.Module`` forward, the path the docs' earlier head numbers
(before "A few-op head") were measured on.

A head that does not attend catches up on the decided token alone (the sampler's ``catch_up``): its catch-up cost
is the head over 1 token whatever W.
"""
import argparse
import statistics
import time

import torch

import vgen
from vgen.kernels.decode import ar_decode_step, compiled
from vgen.kernels.sampling import sample_from_probs
from vgen.kernels.verify import window_target
from vgen.models.drafter import load_drafter
from vgen.samplers.speculative.head import dense, draft_dist, draw


def interleaved_ms(parts: dict, n=200) -> dict:
    """Median milliseconds per call of each part, the parts called round-robin (n rounds after 10 warm-up calls
    each), so a slow spell of the machine hits every part alike."""
    for f in parts.values():
        for _ in range(10):
            f()
    out = {k: [] for k in parts}
    for _ in range(n):
        for k, f in parts.items():
            t = time.perf_counter()
            f()
            out[k].append(time.perf_counter() - t)
    return {k: 1e3 * statistics.median(v) for k, v in out.items()}


def setup(drafter: str = ""):
    """photos-gpt and a draft head (``drafter``: a file, or the card's), a batch-1 CFG cache prefilled with a
    condition, and the head's own cache: (model, head, cache, head cache or None), gradients off."""
    torch.set_grad_enabled(False)
    pipe = vgen.load_pipeline("photos-gpt")
    m = pipe.model
    d = load_drafter(drafter or pipe.card.drafter_path())
    cache, dc = m.new_cache(2), d.new_cache(m, 2)
    m.prefill(torch.tensor([1, m.num_classes]), cache)
    if dc is not None:
        dc.limit(None)
    return m, d, cache, dc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="time each part through vgen's compiled()")
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--tokens", default="2:1.74,3:2.26,4:2.60", help="tokens per pass of the exact chain, per width")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's, this machine's cores)")
    ap.add_argument("--drafter", default="", help="a drafter.safetensors (default: the one photos-gpt's card names)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    m, d, cache, dc = setup(a.drafter)
    cache.limit(cache.bucket(m.cond_len + 100 + max(a.widths)))
    if dc is not None:  # the head reads the filled prefix and the window's slots past it, as the eager sampler's
        dc.limit(m.cond_len + 100 + 2 * max(a.widths))
    kw = dict(cfg_scale=3.0, cfg_interval=-1, temperature=1.0, top_k=100, top_p=1.0)

    def target(x, pos, widx):
        logits, h = m.decode_features(x, pos, cache)
        return window_target(logits, widx, True, **kw), h

    fh = d.inference(m)  # the sampler's few-op path of the head

    def head(h, x, pos):
        return fh(m, h, x, pos, dc)

    def module_head(h, x, pos):  # the head's nn.Module forward (training's path), for comparison
        return d(m, h, x, pos, dc)

    def draft(g, idx, u):  # the sampler's draw: over the head's top-k (eagle.draft_dist / draw / dense)
        probs, ids = draft_dist(fh.logits(m, g), idx, True, **kw)
        return draw(probs[:, 0], ids[:, 0], u), dense(probs[:, 0], ids[:, 0], m.vocab_size)

    def draft_vocab(g, idx, u):  # the draw over the whole vocabulary (window_target + sample_from_probs), before
        q = window_target(fh.logits(m, g), idx, True, **kw)[:, 0]
        return sample_from_probs(q, u), q

    def chain_step(g, idx, u, x, pos):
        t, q = draft(g, idx, u)
        return fh(m, g, x, pos, dc), t, q

    wrap = compiled if a.compile else (lambda f: f)
    step, target_c, head_c, module_c, draft_c, vocab_c, chain_c = map(wrap, (
        ar_decode_step, target, head, module_head, draft, draft_vocab, chain_step))
    tok, p1, u = torch.randint(0, m.vocab_size, (1, 1)), torch.tensor([m.cond_len + 100]), torch.rand(1)
    parts = {"ar": lambda: step(m, cache, tok, p1, u, True, True, 3.0, 1.0, 100, 1.0)}
    for W in a.widths:
        x = torch.randint(0, m.vocab_size, (2, W))
        pos = m.cond_len + 100 + torch.arange(W)
        widx = (100 + torch.arange(W))[None]
        h = torch.randn(2, W, m.config.dim)
        parts[f"target{W}"] = lambda x=x, pos=pos, widx=widx: target_c(x, pos, widx)
        parts[f"head{W}"] = lambda h=h, x=x, pos=pos: head_c(h, x, pos[None].expand(2, -1))
        parts[f"module{W}"] = lambda h=h, x=x, pos=pos: module_c(h, x, pos[None].expand(2, -1))
    g, idx = torch.randn(2, 1, m.config.dim), torch.tensor([[5]])
    x1, pp = torch.randint(0, m.vocab_size, (2, 1)), torch.tensor([[m.cond_len + 101]] * 2)
    parts["draft"] = lambda: draft_c(g, idx, u)
    parts["draft_vocab"] = lambda: vocab_c(g, idx, u)
    parts["chain"] = lambda: chain_c(g, idx, u, x1, pp)
    costs = interleaved_ms(parts)
    mode = "compiled" if a.compile else "eager"
    print(f"photos-gpt, batch 1 (CFG: 2 rows), {mode}, {torch.get_num_threads()} threads, head arch {d.arch}, "
          "ms per call (median of 200)")
    print(f"AR step (model + guidance / top-k + draw): {costs['ar']:.2f}")
    print("| W | target pass | head over W (the sampler's few-op path) | head over W (its nn.Module forward) |")
    print("|---|---|---|---|")
    for W in a.widths:
        print(f"| {W} | {costs[f'target{W}']:.2f} | {costs[f'head{W}']:.2f} | {costs[f'module{W}']:.2f} |")
    print(f"one draft: {costs['draft']:.2f} (drawn over the whole vocabulary: {costs['draft_vocab']:.2f}); "
          f"one chain step (draft + head on it): {costs['chain']:.2f}")
    tokens = {int(w): float(t) for w, t in (p.split(":") for p in a.tokens.split(","))}
    print("\n| W | tokens / pass | model ms / pass | x AR (model) | x AR if drafting were free | "
          "tokens / pass for 1.5x |")
    print("|---|---|---|---|---|---|")
    for W, t in sorted(tokens.items()):
        if f"target{W}" not in costs:
            continue
        catch_up = costs[f"head{W}" if d.attends else "head1"]
        p = costs[f"target{W}"] + catch_up + (W - 2) * costs["chain"] + costs["draft"]
        print(f"| {W} | {t:.2f} | {p:.2f} | {t * costs['ar'] / p:.2f} | {t * costs['ar'] / costs[f'target{W}']:.2f} | "
              f"{1.5 * p / costs['ar']:.2f} |")


if __name__ == "__main__":
    main()
