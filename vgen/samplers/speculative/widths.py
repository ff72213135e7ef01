"""``window=auto``: how wide a speculative pass should be, from what passes cost on this machine and how many
tokens they decide.

Three rules (a sampler picks one):

* timed (the default): AR's loop and a few fixed widths are timed whole, in paired rounds, once per model, device,
  settings and batch (:func:`timed_width`); the width that beat AR's loop runs for the whole job, or AR's loop;
* per pass, from given relative pass costs (``costs=``): each sample's width before every pass from those costs
  and the acceptance it observes (:class:`WidthPolicy`): batch- and machine-invariant;
* per job (``scd``): one width from measured pass costs and calibrated tokens per pass
  (:func:`~vgen.samplers.speculative.tables.pass_costs`, :func:`~vgen.samplers.speculative.tables.pass_tokens`,
  :func:`best_job_width`).

Every measurement is cached on disk under ``$VGEN_CACHE`` (:mod:`~vgen.samplers.speculative.tables`).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import statistics
import time

import torch

from vgen.errors import VGenError
from vgen.samplers.base import example_cond
from vgen.samplers.speculative.tables import fingerprint, width_table


def parse_costs(text: str) -> dict[int, float]:
    """``'1:1,2:1.3,4:1.8'`` -> {1: 1.0, 2: 1.3, 4: 1.8} (width: relative cost of one pass); width 1 required."""
    try:
        out = {int(w): float(c) for w, c in (item.split(":") for item in text.split(",") if item.strip())}
    except ValueError:
        out = {}
    if 1 not in out or any(w < 1 or not 0 < c < float("inf") for w, c in out.items()):
        raise VGenError(f"costs must look like '1:1,2:1.3,4:1.8' (width:relative cost, positive, width 1 included), "
                        f"got {text!r}")
    return out


def expected_tokens(alpha: float, width: int, left: int) -> float:
    """Tokens one pass decides when each draft passes with probability ``alpha`` (the first rejection ends the
    run; the corrected or bonus token counts): 1 + alpha + ... + alpha^(w-1), at most ``left``."""
    w = max(1, min(width, left))
    return float(w) if alpha >= 1 else (1 - alpha ** w) / (1 - alpha)


def best_width(costs: dict[int, float], alpha: float, left: int, batch: int = 1) -> int:
    """The width with the most expected tokens per unit of one sample's cost. ``costs`` are those of a pass of
    ``batch`` samples; a pass is as wide as its widest sample, so a sample that widens alone pays the whole extra
    cost: its cost at width w is its share of a plain pass plus that extra, costs[1] / batch + costs[w] - costs[1]
    (at batch 1, the pass's cost). The rule never looks at the other samples: a sample's widths, and so its
    tokens, do not depend on which samples share its batch."""
    def own(w: int) -> float:
        return costs[1] / batch + costs[w] - costs[1]
    return max(sorted(costs), key=lambda w: expected_tokens(alpha, w, left) / own(w))



# The widths window=auto measures and chooses from with given pass costs: each is one compiled graph per
# attention-length bucket, so few.
WIDTHS = (1, 2, 4, 8, 16)


def can_pay(costs: dict[int, float], batch: int = 1) -> bool:
    """Whether any width beats a plain step when every draft is accepted (W tokens for a sample's own cost of a
    width-W pass, :func:`best_width`'s rule): if none does, no acceptance ever makes speculation pay."""
    return best_width(costs, 1.0, max(costs) + 1, batch) > 1


# A width must promise this much over a plain step before a job leaves AR's loop: the calibration is a few
# samples, and the cost table (the step alone) misses the loop's own work per pass, which grows with the batch
# (measured in docs/lab/benchmarks-log.md, "Coupled drafts").
JOB_MARGIN = 1.3


def best_job_width(costs: dict[int, float], tokens: dict[int, float], margin: float = JOB_MARGIN) -> int:
    """One width for every sample and pass of a job: the most tokens per second, ``tokens[w] / costs[w]`` (tokens
    per pass of a sample at fixed width w, every sample of the batch advancing together), if it beats a plain
    step's 1 / costs[1] by ``margin``; else 1 (a plain step)."""
    w = max(sorted(costs), key=lambda w: (1.0 if w == 1 else tokens[w]) / costs[w])
    return w if w == 1 or tokens[w] / costs[w] >= margin / costs[1] else 1


# window=auto (the timed rule) leaves AR's loop only for a width that beats it in paired timings: each round times
# AR's loop and every width back to back, so a slow spell of the machine hits both sides of a ratio. A width
# qualifies when the mean of its log ratios to AR's loop is at least log(TIMED_MARGIN) and its one-sided 95% lower
# confidence bound (Student's t over the rounds, a spread of at least TIMED_MIN_SPREAD) is at least log(TIMED_FLOOR):
# the qualified width with the best mean runs, else AR's loop. Every width gets TIMED_ROUNDS rounds; while the
# leading width neither qualifies nor is ruled out (its upper bound below the margin), AR's loop and the two leading
# widths get more rounds, up to TIMED_MAX_ROUNDS. Whole runs move more between runs than widths differ from AR's loop
# where speculation barely pays, so a fixed number of rounds either picks a width that then runs slower or drops the
# best width for one slow round (docs/lab/benchmarks-log.md, "Timed widths" and "window=auto under noise")
TIMED_MARGIN = 1.05
TIMED_FLOOR = 1.0
TIMED_ROUNDS = 3
TIMED_MAX_ROUNDS = 7
TIMED_MIN_SPREAD = 0.03  # the least standard deviation of a log ratio believed (three rounds can agree by chance)
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860}  # one-sided 95% t quantiles
TIMED_SAMPLES = 8  # samples per timed run (at least the job's batch), classes spread over the model's, fixed seeds
# A job times the widths only when it has TIMED_JOB_RATIO times the samples the timing draws (or the timing is cached):
# a smaller one would spend more on timing than any width can save it (minutes on a 2-core CPU for
# `vgen sample num_samples=1`); window=auto's prior decides for it instead (vgen.samplers.speculative.prior).
TIMED_JOB_RATIO = 4


_TIME_ANY_JOB: contextvars.ContextVar[bool] = contextvars.ContextVar("vgen_time_any_job", default=False)


@contextlib.contextmanager
def time_any_job():
    """Within this block window=auto times its widths whatever the job's size (``vgen bench``: a cell of a few samples
    stands for the large jobs whose speed it reports)."""
    token = _TIME_ANY_JOB.set(True)
    try:
        yield
    finally:
        _TIME_ANY_JOB.reset(token)


def timing_samples(widths: list[int], batch: int) -> int:
    """The samples the timed rule draws for AR's loop and ``widths`` at ``batch`` in its first rounds (each extra
    round, where the first leave the choice open, times AR's loop and two widths): its cost, in samples."""
    return TIMED_ROUNDS * (1 + len(widths)) * max(TIMED_SAMPLES, batch)


def worth_timing(widths: list[int], batch: int, job: int | None) -> bool:
    """Whether a job of ``job`` samples (None: unknown) repays timing AR's loop and ``widths`` at ``batch``
    (``TIMED_JOB_RATIO``), or runs inside :func:`time_any_job`."""
    return job is None or _TIME_ANY_JOB.get() or job >= TIMED_JOB_RATIO * timing_samples(widths, batch)


def ratio_bounds(ar: list[float], speeds: list[float]) -> tuple[float, float, float]:
    """Mean, lower and upper one-sided 95% bound of log(speed / AR's speed) over the paired rounds (round r of a
    width against round r of AR's loop)."""
    logs = [math.log(s / a) for s, a in zip(speeds, ar)]
    n = len(logs)
    mean = statistics.fmean(logs)
    spread = max(statistics.stdev(logs) if n > 1 else 0.0, TIMED_MIN_SPREAD)
    half = _T95[min(max(n - 1, 1), max(_T95))] * spread / math.sqrt(n)
    return mean, mean - half, mean + half


def timed_choice(speeds: dict[int | str, list[float]], final: bool = True) -> int | str | None:
    """The timed rule's decision from tokens per second per round (``speeds[1]``: AR's loop; round r of every width
    was timed next to round r of AR's). A width qualifies when its mean log ratio to AR's loop is at least
    log(``TIMED_MARGIN``) and its lower 95% bound at least log(``TIMED_FLOOR``) (:func:`ratio_bounds`); the
    qualified width with the best mean wins, else 1 (AR's loop). ``final=False``: None while the rounds leave it
    open -- the leading width (best mean) does not qualify, yet its upper bound reaches the margin."""
    ar = speeds[1]
    bounds = {w: ratio_bounds(ar, v) for w, v in speeds.items() if w != 1}
    if not bounds:
        return 1
    margin, floor = math.log(TIMED_MARGIN), math.log(TIMED_FLOOR)
    qualified = [w for w, (m, lo, _) in bounds.items() if m >= margin and lo >= floor]  # in the speeds' order
    lead = max(bounds, key=lambda w: bounds[w][0])
    if not final and lead not in qualified and bounds[lead][2] >= margin:
        return None
    return max(qualified, key=lambda w: bounds[w][0]) if qualified else 1


def timed_rounds(widths: list[int], time_one, more=None) -> dict[int, list[float]]:
    """The timed rule's schedule: ``TIMED_ROUNDS`` rounds of AR's loop (width 1) and every width in turn
    (``time_one(w)`` -> tokens per second), then, while :func:`timed_choice` leaves the choice open, rounds of AR's
    loop and the two widths with the best mean ratio, up to ``TIMED_MAX_ROUNDS``. ``more(n)``: told before each
    extra round of n runs. Returns the speeds per width, round by round."""
    speeds = {w: [] for w in [1] + list(widths)}
    for _ in range(TIMED_ROUNDS):
        for w in speeds:
            speeds[w].append(time_one(w))
    lead = sorted(widths, key=lambda w: -ratio_bounds(speeds[1], speeds[w])[0])[:2]
    for _ in range(TIMED_ROUNDS, TIMED_MAX_ROUNDS):
        if timed_choice(speeds, final=False) is not None:
            break
        if more is not None:
            more(1 + len(lead))
        for w in [1] + lead:
            speeds[w].append(time_one(w))
    return speeds


def timed_width(sampler, model, widths: list[int], batch: int, run, ident: tuple = (), job: int | None = None,
                progress: bool = False) -> tuple[int, str] | None:
    """window=auto's timed rule: one width for the job, or 1 for AR's loop, and "timed" (timed now) or "cached". AR's loop (``sampler.plain_ar``) and
    ``run(w, cond, seeds)`` (the sampler at fixed width w, ``batch`` samples per pass) for each of ``widths`` are
    timed whole -- target passes, verification, drafting and the loop's host work -- on ``max(TIMED_SAMPLES,
    batch)`` samples of fixed classes and seeds, in ``TIMED_ROUNDS`` interleaved rounds, and AR's loop and the two
    leading widths in up to ``TIMED_MAX_ROUNDS`` while :func:`timed_choice` leaves the choice open (compiled runs
    get one untimed run of ``batch`` samples first, so no compilation is timed). Tokens per second per round are cached in
    ``$VGEN_CACHE/spec_speed.json`` per sampler, model, ``ident`` (e.g. a draft head's digest), dtype, device,
    threads, torch version, settings and batch; :func:`timed_choice` decides. ``job``: the job's samples; a job too
    small to repay an uncached timing (``TIMED_JOB_RATIO``) gets None (no timing: :mod:`~vgen.samplers.speculative.prior`). ``progress``: a bar that says
    what is being timed."""
    import dataclasses

    from vgen.io import atomic_write_json
    o = sampler.options
    settings = {k: v for k, v in dataclasses.asdict(o).items() if k not in ("window", "max_window", "costs")}
    w0 = next(model.parameters())
    path, table, name, known = width_table("spec_speed.json", [
        sampler.name, model.config_dict(), [str(i) for i in ident], str(w0.dtype), w0.device.type,
        torch.get_num_threads(), torch.__version__, settings, batch, "rounds", TIMED_ROUNDS, TIMED_MAX_ROUNDS,
        fingerprint(model)])
    how = "cached"
    if not all(w in known for w in [1] + widths):
        how = "timed"
        if not worth_timing(widths, batch, job):
            return None
        k = max(TIMED_SAMPLES, batch)
        cond = example_cond(model, k, w0.device)
        seeds = [2 ** 62 + i for i in range(k)]
        runs = {1: lambda c, s: sampler.plain_ar(model, c, s, False, batch)}
        runs.update({w: lambda c, s, w=w: run(w, c, s) for w in widths})
        with torch.inference_mode():
            if o.compile:
                for go in runs.values():
                    go(cond[:batch], seeds[:batch])
            from tqdm.auto import tqdm
            bar = tqdm(total=TIMED_ROUNDS * len(runs), disable=not progress, leave=False, unit="run",
                       desc=f"{sampler.name} window=auto: timing AR and widths {'/'.join(map(str, widths))} on {k} "
                            "samples (once per model, settings and machine; cached)")

            def time_one(w):
                t0 = time.perf_counter()
                runs[w](cond, seeds)
                speed = k * model.seq_len / (time.perf_counter() - t0)
                bar.update()
                return speed

            def more_rounds(n):
                bar.total += n

            speeds = timed_rounds(widths, time_one, more_rounds)
            bar.close()
        known.update(speeds)
        table[name] = {str(w): v for w, v in known.items()}
        atomic_write_json(path, table)
    return timed_choice({w: known[w] for w in [1] + widths}), how


class WidthPolicy:
    """Cost-aware window: before each pass, the width with the most expected tokens per unit of cost, from the
    pass costs and a running estimate of the per-draft acceptance (decayed sums of accepted and checked drafts
    plus a prior worth ``WEIGHT`` drafts; with nothing observed, e.g. at width 1, the estimate drifts back to the
    prior, so the sampler probes speculation again). The width depends only on past passes, so every pass is an
    exact speculative step and the sampler stays exact. One policy per sample, fed by that sample's passes only."""
    PRIOR, WEIGHT, DECAY = 0.4, 2.0, 0.9

    def __init__(self, costs: dict[int, float], batch: int = 1):
        self.costs, self.batch, self.accepted, self.checked = costs, batch, 0.0, 0.0

    @property
    def alpha(self) -> float:
        return (self.accepted + self.PRIOR * self.WEIGHT) / (self.checked + self.WEIGHT)

    def observe(self, accepted: int, checked: int) -> None:
        self.accepted = self.DECAY * self.accepted + accepted
        self.checked = self.DECAY * self.checked + checked

    def width(self, left: int) -> int:
        return best_width(self.costs, self.alpha, left, self.batch)
