"""Where a speculative window pass spends its time (docs/lab/benchmarks-log.md, "Where a window pass goes").

    python docs/scripts/profile_window.py [--model photos-gpt] [--batch-sizes 1 8] [--widths 1 2 4 8]

For each batch size and width, on the card's settings (CFG 3, top-k 100) and a half-filled cache: milliseconds
per pass of (a) the model's forward alone and (b) the whole SJD step (forward + verification + new drafts), eager
and compiled, widths interleaved, median of 20 after warm-up; then a torch.profiler table of the eager step by
op family. Run it on an idle machine.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

from vgen.kernels.decode import compiled
from vgen.pipeline import Pipeline
from vgen.samplers.speculative.jacobi import jacobi_step
from vgen.samplers.speculative.rules import TokenRule
from vgen.samplers.speculative.step import SlotState, StepConfig

FAMILIES = [("linear", ("mm", "addmm", "linear", "matmul", "bmm")), ("attention", ("attention", "sdpa", "_scaled")),
            ("sort/top-k", ("topk", "sort", "cumsum", "searchsorted")), ("softmax", ("softmax",)),
            ("gather/scatter/index", ("gather", "scatter", "index", "where", "masked")),
            ("norm/rope/elementwise", ("rms", "mul", "add", "sub", "div", "cat", "stack", "silu", "exp", "log", "neg",
                                       "clamp", "pow", "mean", "rsqrt"))]


def decode_only(model, cache, tokens, n, W: int, L: int, cfg: bool):
    idx = n[:, None] - 1 + torch.arange(W, device=n.device)
    inp, pos = tokens.gather(1, idx), model.cond_len + idx.clamp_max(L - 1)
    if cfg:
        inp, pos = torch.cat([inp, inp]), torch.cat([pos, pos])
    return model.decode(inp, pos, cache)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="photos-gpt")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    pipe = Pipeline.from_pretrained(a.model)
    model, L, V = pipe.model, pipe.model.seq_len, pipe.model.vocab_size
    D = max(a.widths) - 1
    config = StepConfig(L=L, D=D, grid=tuple(model.token_shape), cfg=True, cfg_scale=3.0, cfg_interval=-1,
                        temperature=1.0, top_k=100, top_p=1.0)
    kw = dict(init="vertical", fresh_q="proposal")
    print(f"{a.model}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print("| batch | width | mode | forward ms | whole step ms | verification ms | step x width-1 step |")
    print("|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for S in a.batch_sizes:
            cache = model.new_cache(2 * S)
            model.prefill(torch.zeros(2 * S, dtype=torch.long), cache)
            n = torch.full((S,), L // 2)
            state = SlotState.empty(S, config, V, "cpu", n=n)
            state.tokens.copy_(torch.randint(0, V, state.tokens.shape))
            state.qwin.fill_(1.0 / V)
            state.u.copy_(torch.rand(state.u.shape))
            pristine = [t.clone() for t in state]  # every timed pass starts here (the step updates it in place)
            tokens = state.tokens.clone()
            it = torch.tensor(0)
            cache.limit(cache.bucket(model.cond_len + L // 2 + max(a.widths)))
            for mode in ("eager", "compiled"):
                fwd = compiled(decode_only) if mode == "compiled" else decode_only
                step = compiled(jacobi_step) if mode == "compiled" else jacobi_step
                times = defaultdict(list)
                for r in range(a.repeats + 2):
                    for w in a.widths:
                        wv = torch.full((S,), w)
                        for t, t0 in zip(state, pristine):
                            t.copy_(t0)
                        t0 = time.perf_counter()
                        fwd(model, cache, tokens, n, w, L, True)
                        t1 = time.perf_counter()
                        step(model, cache, state, wv, it, w, config, TokenRule(), **kw)
                        t2 = time.perf_counter()
                        if r >= 2:
                            times[w, "f"].append(t1 - t0)
                            times[w, "s"].append(t2 - t1)
                base = statistics.median(times[a.widths[0], "s"])
                for w in a.widths:
                    f, s_ = statistics.median(times[w, "f"]), statistics.median(times[w, "s"])
                    print(f"| {S} | {w} | {mode} | {1e3 * f:.2f} | {1e3 * s_:.2f} | {1e3 * (s_ - f):.2f} | "
                          f"{s_ / base:.2f} |")
            w = max(a.widths)  # eager op families at the widest width (self time: no op counted twice)
            wv = torch.full((S,), w)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(10):
                    jacobi_step(model, cache, state, wv, it, w, config, TokenRule(), **kw)
            fam, total, ops = defaultdict(float), 0.0, 0
            for e in prof.key_averages():
                name = e.key.lower()
                if not name.startswith("aten::"):
                    continue
                t = e.self_cpu_time_total / 10 / 1e3
                total, ops = total + t, ops + e.count // 10
                label = next((lab for lab, keys in FAMILIES if any(k in name for k in keys)), "other")
                fam[label] += t
            print(f"\neager step, batch {S}, width {w}: {ops} aten ops per pass; self CPU ms per pass by family "
                  f"(total {total:.2f})")
            for label, t in sorted(fam.items(), key=lambda x: -x[1]):
                print(f"  {label}: {t:.2f} ({t / total:.0%})")
            print()


if __name__ == "__main__":
    main()
