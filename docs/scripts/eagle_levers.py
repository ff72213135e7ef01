"""Levers tried for eagle's batch-1 speed on photos-gpt (docs/lab/benchmarks-log.md "A head trained on the acceptance
itself, and six more levers"; ``gemm``: "Wide windows under LANTERN's rule, and the GEMM at 16 rows";
``draft-temp`` / ``bf16``: "Block verification: the exact rule checks the chain jointly"), eager,
the shipped head, batch 1 with CFG. One subcommand per lever:

    python docs/scripts/eagle_levers.py parts      # wall time per part of a pass (no profiler), AR's step beside it
    ... parts --window 7 --accept lantern --delta 0.4   # another eagle setting than window 4, exact
    python docs/scripts/eagle_levers.py linear     # the target's linears: W @ x^T (vgen's) / F.linear / x @ W^T copy
    python docs/scripts/eagle_levers.py script     # the head's call as one TorchScript function against its eager call
    python docs/scripts/eagle_levers.py one-row    # chain steps on the conditional row only (stale unconditional)
    python docs/scripts/eagle_levers.py depth      # per-pass chain length from draft-side signals (simulated)
    python docs/scripts/eagle_levers.py gemm       # the target's products by row count, and its pass by window
    python docs/scripts/eagle_levers.py draft-temp # drafting at another temperature than the target's (64 images)
    python docs/scripts/eagle_levers.py bf16       # the head's products at 2 rows in fp32 / bf16
    python docs/scripts/eagle_levers.py pooled FILE.json:SAMPLER ...   # x AR pooled over bench runs' paired rounds
    ... --drafter FILE                            # another head than the card's (e.g. the one shipped before:
                                                  # git show f45aa6c:vgen/zoo/photos-gpt/drafter.safetensors > old.st)

``parts`` wraps the sampler's functions, the head's call, its output head and the target's pass in wall-clock
timers (exclusive of nested parts) over 2 images, 3 rounds. ``depth`` runs window 7 on 16 images (one per class,
seed 3), records per pass the head's probability of each drawn token, its top probability, the target's entropy
at the pass's last decided token and the number of drafts accepted, then replays chain lengths chosen from those
signals (a draft-side choice keeps the exact rule exact) under a cost model of a pass, ``c0 + c1 * drafts`` AR
steps, with c0 / c1 fitted to docs/lab/benchmarks-log.md's window 4 / 5 rows (11.24 / 13.02 ms at AR 5.56 ms).
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
import torch.nn.functional as F

import vgen
import vgen.kernels.linear as KL
import vgen.samplers.speculative.head as E
from vgen.models.drafter import InferenceHead, load_drafter

HEAD: dict = {}  # the eagle runs' drafter option (--drafter)
PARTS: dict = dict(window=4, accept="exact")  # parts' eagle setting (--window, --accept, --delta: eagle's own if unset)
C0, C1 = 1.05, 0.32  # a pass = C0 + C1 * drafts AR steps (window 4: 2.01, window 5: 2.34 = 11.24 / 5.56, 13.02 / 5.56)


def timed(f, label, acc, stack):
    def g(*a, **k):
        t = time.perf_counter()
        stack.append(0.0)
        r = f(*a, **k)
        dt = time.perf_counter() - t
        acc[label] += dt - stack.pop()
        if stack:
            stack[-1] += dt
        return r
    return g


def parts(pipe):
    acc, stack = collections.Counter(), []
    for name in ("draft_dist", "draw", "dense", "window_target", "verify", "catch_up", "draft_chain", "chain_step",
                 "advance"):
        setattr(E, name, timed(getattr(E, name), name, acc, stack))
    InferenceHead.__call__ = timed(InferenceHead.__call__, "head calls", acc, stack)
    InferenceHead.logits = timed(InferenceHead.logits, "output head", acc, stack)
    cls = type(pipe.model)
    cls.decode_features = timed(cls.decode_features, "target pass", acc, stack)
    cls.decode = timed(cls.decode, "target step", acc, stack)
    ekw = dict(PARTS, **HEAD)
    pipe.generate([0], sampler="eagle", seed=9, batch_size=1, compile=False, **ekw)  # warm-up
    for r in range(3):
        for s, kw in (("ar", {}), ("eagle", ekw)):
            acc.clear()
            t = time.perf_counter()
            out = pipe.generate([3, 5], sampler=s, seed=1, batch_size=1, compile=False, **kw)
            t = time.perf_counter() - t
            n = out.stats["forward_passes"]
            print(f"round {r} {s}: {t * 1e3 / n:.2f} ms per pass ({n} passes); "
                  + ", ".join(f"{k} {v * 1e3 / n:.2f}" for k, v in acc.most_common()))


def bench(fns: dict, n: int = 60, rounds: int = 6) -> dict:
    res = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            for _ in range(5):
                f()
            t = time.perf_counter()
            for _ in range(n):
                f()
            res[k].append((time.perf_counter() - t) / n * 1e3)
    return {k: statistics.median(v) for k, v in res.items()}


def linear(pipe):
    m, vgen_linear, copies = pipe.model, KL.linear, {}

    def x_wt(x, w, b=None):  # x @ W^T from a contiguous (in, out) copy
        wt = copies.get(id(w))
        if wt is None:
            wt = copies[id(w)] = w.t().contiguous()
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.mm(x2, wt) if b is None else torch.addmm(b, x2, wt)
        return y.reshape(*x.shape[:-1], w.shape[0])

    impls = {"W @ x^T (vgen)": vgen_linear, "F.linear": lambda x, w, b=None: F.linear(x, w, b), "x @ W^T copy": x_wt}
    cache = m.new_cache(2)
    steps = {}
    for name, f in impls.items():
        for W in (1, 4):
            def step(W=W, f=f):
                KL.linear = f
                pos = (m.cond_len + 100 + torch.arange(W)).expand(2, W)
                m.decode_features(torch.zeros(2, W, dtype=torch.long), pos, cache)
            steps[f"{name}, window {W}"] = step
    res = bench(steps)
    KL.linear = vgen_linear
    for k, v in res.items():
        print(f"{k}: {v:.2f} ms per target pass")


def gemm(pipe):
    """Per row count: the target's product shapes as ``W @ x^T`` (vgen.kernels.linear's small-row order) and
    ``F.linear``, interleaved, medians of 9 rounds of 200 calls; then the target's pass (batch 1, CFG: 2 x window
    rows) per window with each."""
    m, vgen_linear = pipe.model, KL.linear
    shapes = sorted({tuple(mod.weight.shape) for mod in m.modules() if isinstance(mod, torch.nn.Linear)})
    for o, i in shapes:
        w, cells = torch.randn(o, i), []
        for rows in (2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 32):
            x = torch.randn(rows, i)
            r = bench({"wx": lambda: torch.mm(w, x.t()).t(), "fl": lambda: F.linear(x, w)}, n=200, rounds=9)
            cells.append(f"{rows}: {r['wx'] * 1e3:.0f} / {r['fl'] * 1e3:.0f}")
        print(f"({o}, {i}) us per product, W @ x^T / F.linear, by rows: " + ", ".join(cells))
    cache = m.new_cache(2)
    for W in range(1, 10):
        def step(W=W):
            pos = (m.cond_len + 100 + torch.arange(W)).expand(2, W)
            cache.limit(m.cond_len + 110 + W)
            m.decode_features(torch.zeros(2, W, dtype=torch.long), pos, cache)
        r = {}
        for name, f in (("W @ x^T", vgen_linear), ("F.linear", lambda x, w, b=None: F.linear(x, w, b))):
            KL.linear = f
            r[name] = bench({name: step}, n=40, rounds=5)[name]
        KL.linear = vgen_linear
        print(f"window {W} ({2 * W} rows): target pass " + ", ".join(f"{k} {v:.2f} ms" for k, v in r.items()))


def draft_temp(pipe):
    """Tokens per pass (exact, block verification, window 8, 64 images at batch 8, seed 0) when the head drafts
    from its distribution at temperature T times the target's (T = 1: eagle's; any proposal keeps the rule exact,
    since every draft is verified against the distribution it was drawn from)."""
    orig = E.draft_dist
    labels = [i % pipe.model.num_classes for i in range(64)]
    for t in (1.0, 0.85, 1.15):
        def scaled(logits, token_index, cfg, cfg_scale, cfg_interval, temperature, top_k, top_p, t=t):
            return orig(logits, token_index, cfg, cfg_scale, cfg_interval, temperature * t, top_k, top_p)
        E.draft_dist = scaled
        out = pipe.generate(labels, sampler="eagle", seed=0, window=8, batch_size=8, compile=False, **HEAD)
        E.draft_dist = orig
        print(f"draft temperature x {t}: {out.stats['accepted_per_step']:.2f} tokens per pass")


def bf16(pipe):
    """The head's products at batch 1 with CFG (2 rows), as InferenceHead runs them (``x @ W``, W stored (in, out)):
    fp32 against bf16 weights with the casts in and out, medians of 5 rounds of 400 calls, microseconds."""
    head = load_drafter(pipe.card.drafter_path(HEAD.get("drafter", ""))).inference(pipe.model)
    for name in ("wg", "wqkv", "wo", "w13", "w2"):
        w = getattr(head, name, None)
        if w is None:
            continue
        x, wb = torch.randn(2, w.shape[0]), w.bfloat16()
        r = bench({"fp32": lambda: torch.mm(x, w), "bf16": lambda: torch.mm(x.bfloat16(), wb).float()}, n=400,
                  rounds=5)
        print(f"{name} {tuple(w.shape)}: fp32 {r['fp32'] * 1e3:.1f} us, bf16 {r['bf16'] * 1e3:.1f} us")


def pooled(cells: list[str]):
    """x AR pooled over the paired rounds of ``FILE.json:SAMPLER`` cells (batch 1) of ``vgen bench`` runs: the bench's
    own estimate (``paired_speedup``: geometric mean, 95% t-interval) over all their rounds together, and the median."""
    import json

    from vgen.eval.bench import paired_speedup
    ratios = []
    for cell in cells:
        path, sampler = cell.split(":", 1)
        rows = [r for r in json.load(open(path))["rows"] if r["sampler"] == sampler and r["batch_size"] == 1]
        ratios += rows[0]["speedup_vs_ar_rounds"]
    est = paired_speedup(ratios, [1.0] * len(ratios))  # round ratios as "reference seconds / 1 second"
    lo, hi = est["speedup_vs_ar_ci95"]
    print(f"{est['speedup_vs_ar_paired']:.2f}x ({lo:.2f}-{hi:.2f}), median {statistics.median(ratios):.2f}, "
          f"{len(ratios)} rounds")


def head_function(emb, wg, wqkv, w13, w2, wo, cos, sin, kc, vc, slots, feats, tokens, input_pos, attn_eps: float,
                  ffn_eps: float, H: int, Hk: int, hd: int):
    """InferenceHead.__call__ (attending head, RoPE, no additive positions, per-row positions) as one function."""
    B, S = tokens.shape[0], tokens.shape[1]
    d = wg.shape[0]
    x = torch.addmm(emb[tokens.reshape(-1)], feats.reshape(B * S, d), wg)
    qkv = torch.mm(F.rms_norm(x, [d], None, attn_eps), wqkv).view(B, S, H + 2 * Hk, hd)
    qk, v = qkv[:, :, :H + Hk], qkv[:, :, H + Hk:]
    cs, sn = cos[input_pos], sin[input_pos]
    qk = qk * cs.unsqueeze(-2) + qk.unflatten(-1, (hd // 2, 2)).flip(-1).flatten(-2) * sn.unsqueeze(-2)
    q, k, v = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2), v.transpose(1, 2)
    mask = (slots <= input_pos[..., None])[:, None]
    b = torch.arange(B)[:, None]
    kc[b, :, input_pos] = k.transpose(1, 2)
    vc[b, :, input_pos] = v.transpose(1, 2)
    y = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
    x = torch.addmm(x, y.transpose(1, 2).reshape(B * S, d), wo)
    a, g = torch.mm(F.rms_norm(x, [d], None, ffn_eps), w13).chunk(2, -1)
    return torch.addmm(x, F.silu(a) * g, w2).view(B, S, d)


def script(pipe):
    m = pipe.model
    head = load_drafter(pipe.card.drafter_path(HEAD.get("drafter", ""))).inference(m)
    scripted = torch.jit.script(head_function)
    for S in (1, 4):
        cache = head.new_cache(m, 2)
        cache.limit(None)
        feats = torch.randn(2, S, m.config.dim)
        tokens = torch.randint(0, m.vocab_size, (2, S))
        pos = (m.cond_len + 10 + torch.arange(S)).expand(2, S)
        args = (head.emb, head.wg, head.wqkv, head.w13, head.w2, head.wo, head.cos, head.sin, cache.k[0], cache.v[0],
                cache.slots[:cache.length], feats, tokens, pos, head.attn_eps, head.ffn_eps, head.n_head,
                head.n_kv_head, head.head_dim)
        err = (scripted(*args) - head(m, feats, tokens, pos, cache)).abs().max().item()
        res = bench({"eager (InferenceHead)": lambda: head(m, feats, tokens, pos, cache),
                     "TorchScript": lambda: scripted(*args)}, n=300, rounds=5)
        print(f"{S} token(s), 2 rows: " + ", ".join(f"{k} {v * 1e3:.0f} us" for k, v in res.items())
              + f" (max difference {err:.1e})")


def one_row_chain(model, drafter, dcache, g, nxt, uf, L, cfg, live, sampling):
    """draft_chain with the head's chain steps on the conditional rows only: guidance at depth > 1 reuses the
    unconditional logits of depth 1."""
    D, B = uf.shape[1], nxt.shape[0]
    t = nxt[:, None] + torch.arange(D, device=nxt.device)
    pos = torch.where(live[:, None] & (t < L), model.cond_len + t, model.cond_len + L - 1)
    drafts, ps, ids = [], [], []
    logits = drafter.logits(model, g)
    stale = logits[B:]
    for j in range(D):
        probs, top = E.draft_dist(logits, t[:, j:j + 1], cfg, **sampling)
        ps.append(probs[:, 0])
        ids.append(top[:, 0])
        drafts.append(E.draw(ps[-1], ids[-1], uf[:, j]))
        if j < D - 1:
            K, V = dcache.k, dcache.v
            dcache.k, dcache.v = [k[:B] for k in K], [v[:B] for v in V]  # the conditional rows' cache (views)
            g = drafter(model, g[:B], drafts[-1][:, None], pos[:, j:j + 1], dcache)
            dcache.k, dcache.v = K, V
            logits = torch.cat([drafter.logits(model, g), stale])
    return torch.stack(drafts, 1), E.dense(torch.stack(ps, 1), torch.stack(ids, 1), model.vocab_size)


def one_row(pipe):
    both = E.draft_chain
    for name, fn in (("both rows (vgen)", both), ("conditional row only", one_row_chain)):
        E.draft_chain = fn
        t = time.perf_counter()
        out = pipe.generate(list(range(16)), sampler="eagle", window=4, seed=1, batch_size=1, compile=False, **HEAD)
        t = time.perf_counter() - t
        s = out.stats
        print(f"{name}: {s['accepted_per_step']:.2f} tokens per pass, accepted to depth 1/2/3 "
              + " / ".join(f"{a:.2f}" for a in s["accepted_by_depth"]) + f", {t * 1e3 / s['forward_passes']:.2f} ms "
              "per pass")
    E.draft_chain = both


def depth(pipe):
    rec, verify = [], E.verify

    def recording(p, qwin, x, live, mine, ua, ur, *a, **kw):
        k, tok = verify(p, qwin, x, live, mine, ua, ur, *a, **kw)
        pk = p[0, int(k[0])]
        rec.append(dict(qx=qwin.gather(-1, x[..., None])[0, :, 0].tolist(), qmax=qwin[0].max(-1).values.tolist(),
                        k=int(k[0]), live=bool(live[0].all()),
                        entropy=float(-(pk * pk.clamp_min(1e-30).log()).sum())))
        return k, tok

    E.verify = recording
    out = pipe.generate(list(range(16)), sampler="eagle", window=7, seed=3, batch_size=1, compile=False, **HEAD)
    E.verify = verify
    print(f"window 7: {out.stats['accepted_per_step']:.2f} tokens per pass; accepted to depth 1..6 "
          + " / ".join(f"{a:.2f}" for a in out.stats["accepted_by_depth"]))
    passes = [r for r in rec if r["live"]]
    nxt = [(a, b) for a, b in zip(rec, rec[1:]) if a["live"] and b["live"]]  # (this pass, the next one)

    def ratio(choices):  # [(drafts, accepted)] -> (tokens per pass, AR steps per pass, x AR)
        tok = sum(min(k, d) + 1 for d, k in choices) / len(choices)
        cost = sum(C0 + C1 * d for d, _ in choices) / len(choices)
        return tok, cost, tok / cost

    def report(name, choices):
        tok, cost, r = ratio(choices)
        print(f"| {name} | {tok:.2f} | {cost:.2f} | {r:.3f} |")

    print(f"{len(passes)} passes; cost model: a pass = {C0} + {C1} x drafts AR steps\n"
          "| chain length | tokens / pass | AR steps / pass | x AR (model) |\n|---|---|---|---|")
    for d in range(1, 7):
        report(f"fixed, {d} drafts", [(d, r["k"]) for r in passes])

    def stop_rule(score, tau, dmax):  # draft on while the score of the drafts so far stays >= tau
        def n_drafts(r):
            d = 1
            while d < dmax and score(r, d) >= tau:
                d += 1
            return d
        return n_drafts

    best = {}
    cum = lambda r, d: torch.tensor(r["qx"][:d]).prod().item()  # noqa: E731
    scores = {"head's probability of the drafts so far (product)": cum,
              "head's probability of the last draft": lambda r, d: r["qx"][d - 1],
              "head's top probability at the last draft": lambda r, d: r["qmax"][d - 1]}
    for name, score in scores.items():
        for tau in (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5):
            for dmax in (3, 4, 5, 6):
                f = stop_rule(score, tau, dmax)
                res = ratio([(f(r), r["k"]) for r in passes])
                if res[2] > best.get(name, (0, 0, 0, None))[2]:
                    best[name] = res + (f"tau {tau}, at most {dmax}",)
    ent = sorted(a["entropy"] for a, _ in nxt)
    for q in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
        th = ent[int(q * len(ent))]
        for lo, hi in ((2, 3), (2, 4), (3, 4), (3, 5), (2, 5), (4, 6)):
            res = ratio([(hi if a["entropy"] < th else lo, b["k"]) for a, b in nxt])
            name = "target's entropy at the last decided token (the pass before)"
            if res[2] > best.get(name, (0, 0, 0, None))[2]:
                best[name] = res + (f"{hi} drafts below {th:.2f} nats, else {lo}",)
    for name, (tok, cost, r, how) in best.items():
        print(f"| best by {name}: {how} | {tok:.2f} | {cost:.2f} | {r:.3f} |")
    report("oracle (drafts = accepted, at least 1, at most 6)", [(min(max(r["k"], 1), 6), r["k"]) for r in passes])
    bins = (0.0, 0.02, 0.05, 0.1, 0.2, 1.01)
    print("first draft accepted, by the head's probability of it: " + ", ".join(
        f"[{lo}, {hi}) {statistics.mean([r['k'] >= 1 for r in passes if lo <= r['qx'][0] < hi]):.2f}"
        for lo, hi in zip(bins, bins[1:])))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lever", choices=["parts", "linear", "script", "one-row", "depth", "gemm", "draft-temp", "bf16",
                                      "pooled"])
    ap.add_argument("cells", nargs="*", help="pooled: FILE.json:SAMPLER ...")
    ap.add_argument("--drafter", default="", help="a drafter.safetensors ('' = the one the card names)")
    ap.add_argument("--window", type=int, default=4, help="parts: eagle's window")
    ap.add_argument("--accept", default="exact", help="parts: eagle's acceptance rule")
    ap.add_argument("--delta", type=float, default=None, help="parts: LANTERN's delta (accept=lantern; unset: "
                    "eagle's default)")
    a = ap.parse_args()
    if a.lever == "pooled":
        return pooled(a.cells)
    PARTS.update(window=a.window, accept=a.accept, **({} if a.delta is None else {"delta": a.delta}))
    if a.drafter:
        HEAD["drafter"] = a.drafter
    torch.set_grad_enabled(False)
    pipe = vgen.load_pipeline("photos-gpt")
    levers = {"parts": parts, "linear": linear, "script": script, "one-row": one_row, "depth": depth, "gemm": gemm,
              "draft-temp": draft_temp, "bf16": bf16}
    levers[a.lever](pipe)


if __name__ == "__main__":
    main()
