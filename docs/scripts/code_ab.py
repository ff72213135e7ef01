"""Paired A/B of two vgen checkouts on photos-gpt (docs/lab/benchmarks-log.md "Fewer glue ops per pass"): each round runs
AR, eagle (window 4), eagle with LANTERN's rule, sjd (window 4) and scd (window 8) on the same 8 images (batch 1, eager, seed 0) in a fresh process
per checkout, the checkouts alternating, and prints each sampler's seconds and its speed-up over that process's own
AR run. A machine whose speed drifts between runs (this CPU's does, by tens of percent within an hour) shifts both
checkouts' AR and eagle alike; the per-round ratios are the comparison.

    git worktree add /tmp/old <commit>
    python docs/scripts/code_ab.py /tmp/old . --rounds 4
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ONE = """
import json, sys, time
sys.path.insert(0, {tree!r})
import vgen
assert vgen.__file__.startswith({tree!r}), vgen.__file__
pipe = vgen.load_pipeline("photos-gpt")
pipe.generate([0], sampler="eagle", window=4, seed=99, batch_size=1, compile=False)  # warm-up
out = {{}}
for name, kw in (("ar", dict(sampler="ar")), ("eagle", dict(sampler="eagle", window=4)),
                 ("lantern", dict(sampler="eagle", window=4, accept="lantern")),
                 ("sjd", dict(sampler="sjd", window=4)), ("scd", dict(sampler="scd", window=8))):
    t = time.perf_counter()
    pipe.generate(list(range({images})), seed=0, batch_size=1, compile=False, **kw)
    out[name] = time.perf_counter() - t
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs=2, help="two vgen checkouts (A, then B)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--images", type=int, default=8)
    a = ap.parse_args()
    trees = [str(Path(t).resolve()) for t in a.trees]
    names = ("eagle", "lantern", "sjd", "scd")
    ratios = {t: {k: [] for k in names + ("ar seconds",)} for t in trees}
    for r in range(a.rounds):
        for t in trees:
            res = subprocess.run([sys.executable, "-c", ONE.format(tree=t, images=a.images)], capture_output=True,
                                 text=True, check=True, cwd=t)
            s = json.loads(res.stdout.strip().splitlines()[-1])
            for k in names:
                ratios[t][k].append(s["ar"] / s[k])
            ratios[t]["ar seconds"].append(s["ar"])
            print(f"round {r + 1} {t}: " + ", ".join(f"{k} {v:.2f} s" for k, v in s.items())
                  + "; x AR " + ", ".join(f"{k} {s['ar'] / s[k]:.3f}" for k in names), flush=True)
    for t in trees:
        print(f"{t}: mean " + ", ".join(f"{k} {statistics.mean(v):.3f}" for k, v in ratios[t].items()))


if __name__ == "__main__":
    main()
