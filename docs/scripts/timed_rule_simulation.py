"""window=auto's timed rule under simulated machine noise: the width it picks and what that width truly gives.

Each timed run takes (true time) x exp(N(0, sigma)) x (a slow spell of 1.15-1.45x with probability p_spell), the
kind of noise this 2-core CPU shows (docs/lab/benchmarks-log.md). For a few sets of true speed ratios against AR's
loop, many simulated timings go through the rule before the sequential rounds (3 rounds, best median >= 1.1, no
round below 1.0) and through vgen's rule (`vgen.samplers.speculative.widths.timed_choice`: mean log ratio >= log 1.05 and a lower
95% bound >= 0, more rounds for AR's loop and the two leading widths while open, up to 7).
Prints, per case and rule: the mean true ratio of the chosen width (AR's loop = 1), how often the choice is truly
slower than AR's loop, how often it is the truly best option, and the runs the timing spent.

    python docs/scripts/timed_rule_simulation.py [trials]
"""
import math
import statistics
import sys

import numpy as np

from vgen.samplers.speculative import widths as W

CASES = {
    "eagle-like (2: 1.06, 3: 1.12, 4: 1.18, 6: 1.12)": {2: 1.06, 3: 1.12, 4: 1.18, 6: 1.12},
    "marginal (2: 1.03, 4: 1.06)": {2: 1.03, 4: 1.06},
    "losing (2: 0.92, 4: 0.85)": {2: 0.92, 4: 0.85},
    "clear (2: 1.3, 4: 1.6, 6: 1.7)": {2: 1.3, 4: 1.6, 6: 1.7},
}


def old_rule(speeds):
    """The rule before 2026-11-27: best median paired ratio if >= 1.1 and no round below 1.0; 3 rounds."""
    ar = speeds[1]
    ratios = {w: [s / a for s, a in zip(v, ar)] for w, v in speeds.items() if w != 1}
    ratios = {w: r for w, r in ratios.items() if min(r) >= 1.0}
    if not ratios:
        return 1
    w = max(sorted(ratios), key=lambda w: statistics.median(ratios[w]))
    return w if statistics.median(ratios[w]) >= 1.1 else 1


def simulate(true, rule, rng, sigma=0.06, p_spell=0.15):
    def speed(w):
        spell = rng.uniform(1.15, 1.45) if rng.random() < p_spell else 1.0
        return true.get(w, 1.0) / (math.exp(rng.normal(0, sigma)) * spell)
    runs = []

    def time_one(w):
        runs.append(w)
        return speed(w)
    if rule == "new":  # vgen's own schedule and decision
        return W.timed_choice(W.timed_rounds(sorted(true), time_one)), len(runs)
    speeds = {w: [] for w in [1] + sorted(true)}
    for _ in range(3):  # three rounds, AR's loop and every width in turn
        for w in speeds:
            speeds[w].append(time_one(w))
    return old_rule(speeds), len(runs)


def trial(true, rule, trials, seed=0):
    """Summary of ``trials`` simulated timings of one case under one rule."""
    rng = np.random.default_rng(seed)
    picks = [simulate(true, rule, rng) for _ in range(trials)]
    got = [true.get(w, 1.0) for w, _ in picks]
    best = max([1.0] + list(true.values()))
    return {"mean_ratio": float(np.mean(got)), "slower_than_ar": float(np.mean([g < 1 for g in got])),
            "best_chosen": float(np.mean([g == best for g in got])), "runs": float(np.mean([r for _, r in picks]))}


def main(trials=4000):
    for name, true in CASES.items():
        print(name)
        for rule in ("old", "new"):
            r = trial(true, rule, trials)
            print(f"  {rule}: mean true ratio {r['mean_ratio']:.3f}, slower than AR {r['slower_than_ar']:.3f}, "
                  f"best chosen {r['best_chosen']:.3f}, runs {r['runs']:.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000)
