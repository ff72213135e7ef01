"""The speculative core shared by SJD, GSD, LANTERN and SCD: Jacobi-window decoding with a pluggable acceptance
rule and draft coupling.

Each forward pass feeds, for every sample, its last accepted token and ``window - 1`` draft tokens at that
sample's own positions (ragged batches: no sample waits for another). From the target distribution p at each
position (CFG-guided, temperature-scaled, top-k/top-p-truncated, exactly as the AR sampler's) the rule gives
each draft x an acceptance probability a(x); drafts pass left to right until the first rejection, which is
replaced by a draw from norm(max(0, p - q)) (or, when all pass, a bonus token is drawn from p). Positions after
the rejection keep a fresh Jacobi sample from p as their next draft, with that p as its draft distribution q;
new positions at the end of the window get drafts from ``init``. The KV cache needs no rollback work: slots
are positions, and the next pass overwrites the slots past the accepted prefix.

Rule contract: ``rule(p, q, x, px, qx, *args, **kw) -> a`` on (B, W-1, V) targets p and draft distributions
q, drafts x (B, W-1) with px = p(x), qx = q(x). The core forces a = 0 where p(x) = 0 (a token outside the
target's top-k/top-p support is never emitted) and past the end of the image.

* SJD: a = min(1, p(x) / q(x)): lossless.
* GSD: sums of p and q over a group of similar tokens: not lossless, drift reported.
* LANTERN: p(x) plus nearby-token mass in the numerator, bounded so the per-token total-variation drift is
  at most ``delta``.

``coupling`` says how the Jacobi drafts after a rejection are redrawn (independent draws, maximal coupling to the
old drafts, or Gumbel-max with noise fixed per position); :mod:`vgen.samplers.scd` explains the two couplings.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vgen.errors import VGenError
from vgen.kernels.decode import compiled
from vgen.kernels.gumbel import gumbel_draw, gumbel_keys
from vgen.kernels.sampling import per_sample_uniforms, sample_from_probs
from vgen.kernels.verify import (block_accepts, correction, gather_rows, leading_accepts, maximal_coupling,
                                window_target)
from vgen.interfaces import ModelSpec
from vgen.samplers.base import Sampler, SamplingOptions, job_shape, option

INITS = ("random", "horizontal", "vertical", "sample", "temporal")
FRESH_Q = ("proposal", "onehot")
COUPLINGS = ("independent", "maximal", "gumbel")


@dataclass
class SpeculativeOptions(SamplingOptions):
    """Options every speculative sampler shares. ``fresh_q=proposal`` verifies drafts against what they were really
    drawn from (uniform for random, the sampled distribution for sample; copies are deterministic, so one-hot);
    ``onehot`` is the official SJD code's choice. Both are lossless; the proposal accepts more."""
    window: int | str = option("auto", "tokens per forward pass: the last accepted one plus window-1 drafts; auto "
                               "(cost-aware): the width 2 / 4 / 8 (or AR's own loop) with the most tokens per "
                               "second in whole runs timed once per model, device, settings and the job's batch "
                               "size (cached on disk); with costs given, chosen for each sample before every pass "
                               "from those costs and the acceptance it observes (width 1 = a plain AR step)")
    max_window: int = option(8, "window=auto: the widest pass it may choose")
    costs: str = option("", "window=auto: one sample's relative pass costs per width, e.g. '1:1,2:1.3,4:1.8': "
                        "widths chosen per sample and pass from them (never dependent on the batch size or the "
                        "machine); empty: the timed rule")
    init: str = option("random", "drafts for new positions: random (uniform), horizontal (copy the left token), "
                       "vertical (copy the token above; left in the first row), sample (draw from the target), "
                       "temporal (video: copy the token at the same place in the previous frame; vertical in the "
                       "first frame)", choices=INITS)
    fresh_q: str = option("proposal", "draft distribution used to verify new drafts: proposal | onehot",
                          choices=FRESH_Q)
    coupling: str = option("independent", "how drafts after a rejection are redrawn: independent (a fresh draw "
                           "from the target), maximal (each old draft kept where the target still allows it, SCD-MC) "
                           "or gumbel (scd only: every draw at a position shares that position's Gumbel noise)",
                           choices=COUPLINGS)
    couplings = ("independent", "maximal")  # class attribute (not a field): the couplings this sampler's rule takes

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if isinstance(self.window, str) and self.window.strip().lower() == "auto":
            self.window = "auto"
        elif isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 2:
            raise VGenError(f"window must be auto or a whole number >= 2 (the last accepted token plus at least one "
                            f"draft), got {self.window!r}")
        if self.max_window < 2:
            raise VGenError(f"max_window must be >= 2, got {self.max_window}")
        if self.costs:
            parse_costs(self.costs)
        if self.coupling not in self.couplings:
            raise VGenError(f"coupling={self.coupling} does not fit this sampler (it takes "
                            f"{' or '.join(self.couplings)}): Gumbel coupling accepts a draft only when it equals the "
                            "target's own draw, which is sampler=scd")
        if self.init == "temporal" and spec is not None and spec.token_shape is not None and not spec.is_video:
            raise VGenError(f"init=temporal copies drafts from the previous frame, but {spec.name} makes images "
                            f"(token grid {spec.token_shape}): use init=vertical")


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


def _copy_source(last: torch.Tensor, off: torch.Tensor, stride: int) -> torch.Tensor:
    """Raster index ``stride`` positions before each new position ``last + off`` -- or, for the positions after
    ``last`` whose source is itself new, the nearest multiple of ``stride`` back that is already placed. (B, D)."""
    t = last[:, None] + off
    return t - ((off + stride - 1) // stride) * stride


def fresh_drafts(tokens: torch.Tensor, last: torch.Tensor, p_last: torch.Tensor, u: torch.Tensor, *, init: str,
                 fresh_q: str, grid: tuple[int, ...], with_q: bool = True):
    """Drafts for the D = u.shape[1] positions after ``last`` (B,), and their draft distributions (B, D, V)
    (None with ``with_q=False``: a rule that checks drafts by equality needs none).

    ``tokens`` holds the current token (accepted or draft) at every position up to ``last``; ``p_last`` (B, V) is
    the target distribution at ``last``; ``grid`` is the model's token grid ((h, w) or (t, h, w))."""
    B, D = u.shape
    V = p_last.shape[-1]
    off = torch.arange(1, D + 1, device=u.device)
    if init == "random":
        f = (u * V).long().clamp_max(V - 1)
        if fresh_q == "proposal":
            return f, p_last.new_full((B, D, V), 1.0 / V) if with_q else None
    elif init == "sample":
        dist = p_last[:, None].expand(B, D, V)
        f = sample_from_probs(dist, u)
        if fresh_q == "proposal":
            return f, dist
    else:
        left = last[:, None].expand(B, D)
        if init == "horizontal":
            src = left
        else:  # vertical: the nearest token straight above that is already placed
            src = _copy_source(last, off, grid[-1])
            src = torch.where(src >= 0, src, left)  # first row: nothing above, copy the left neighbour
            if init == "temporal":  # the same (h, w) in the nearest earlier frame; vertical in the first frame
                back = _copy_source(last, off, grid[-1] * grid[-2] if len(grid) > 2 else grid[-1])
                src = torch.where(back >= 0, back, src)
        f = tokens.gather(1, src)
    return f, F.one_hot(f, V).to(p_last.dtype) if with_q else None


def verify(p, qwin, x, inside, mine, ua, ur, rule, rule_args: tuple = (), rule_kw: dict | None = None,
           block: bool = False):
    """The verification every speculative rule shares, vectorised over the batch: target distributions p
    (B, W, V) at a window's positions, drafts x (B, W-1) with their draft distributions qwin (B, >= W-1, V),
    ``inside`` (B, W-1): the draft's position is in the image, ``mine`` (B, W-1): the sample checks this draft (its
    own width; None: every one), uniforms ua (B, >= W-1) and ur (B,). The rule gives each draft an acceptance
    probability (forced to 0 where p(x) = 0 or outside); drafts pass left to right until the first rejection, whose
    token is drawn from norm(max(0, p - q)) (a bonus token from p when every checked draft passed). ``block``: the
    exact rule's block verification instead (:func:`block_accepts`; drafts drawn as a chain, each given the ones
    before it, as a draft head's are; ``rule`` unused). Returns (drafts accepted k (B,), the token decided at offset
    k (B,))."""
    W = p.shape[1]
    q = qwin[:, :W - 1]
    if mine is not None:
        q = torch.where(mine[..., None], q, 0.0)  # zero past them: the token there is a bonus from p
        inside = inside & mine
    if W == 1:  # a plain AR step: no drafts to check
        k = torch.zeros(p.shape[0], dtype=torch.long, device=p.device)
        return k, correction(p, q, k, ur)
    pd = p[:, :-1]
    px = pd.gather(-1, x[..., None]).squeeze(-1)
    qx = q.gather(-1, x[..., None]).squeeze(-1)
    if block:
        # a draft past the image (or the sample's width) ends the block: h = w at the one before it. Only where a
        # draft sits decides that, never which token it is (a draft-dependent end would bias the rule)
        q = torch.where(inside[..., None], q, 0.0)
        k, scale = block_accepts(p, q, px, qx, inside, ua[:, :W - 1])
        return k, correction(p, q, k, ur, scale)
    a = rule(pd, q, x, px, qx, *rule_args, **(rule_kw or {}))
    a = torch.where((px > 0) & inside, a, 0.0)
    k = leading_accepts(ua[:, :W - 1], a)  # drafts accepted (B,)
    return k, correction(p, q, k, ur)


def spec_step(model, cache, tokens, n, wv, qwin, logp, smap, counts, u, it, *, L: int, W: int, D: int,
              grid: tuple, cfg: bool, cfg_scale: float, cfg_interval: int, temperature: float, top_k: int, top_p: float,
              init: str, fresh_q: str, rule, rule_args: tuple, rule_kw: dict, coupling: str = "independent",
              gkeys: torch.Tensor | None = None):
    """One forward pass of width W + vectorised verification for every sample. State (per sample b):
    tokens[b, :n[b]] accepted, tokens[b, n[b]:n[b]+D] drafts with distributions qwin[b] (D, V), D >= W - 1 (the
    widest window's). Sample b uses its own width wv[b] <= W: it checks its first wv[b] - 1 drafts and drafts anew
    after them, exactly as a pass of width wv[b] would (the wider positions are computed and ignored). u: (B, 3D+2).

    ``coupling`` is how the drafts after the first rejection are redrawn (:mod:`vgen.samplers.scd`): independent
    (a fresh draw from p), maximal (the old draft kept with probability min(1, p(x) / q(x)), else a draw from
    norm(max(0, p - q))) or gumbel (every draw at a position is Gumbel-max with that position's fixed noise; a
    draft passes when it equals the target's own draw, and ``rule`` is not used). ``gkeys`` (B, buffer length):
    every position's Gumbel key, per sample (:func:`gumbel_keys`)."""
    ar = torch.arange(W, device=n.device)
    idx = n[:, None] - 1 + ar  # the last accepted token, then the drafts
    inp = tokens.gather(1, idx)
    pos = model.cond_len + idx.clamp_max(L - 1)  # past the end: junk rows, parked on a slot no real query reads
    if cfg:
        inp, pos = torch.cat([inp, inp]), torch.cat([pos, pos])
    logits = model.decode(inp, pos, cache)
    p = window_target(logits, n[:, None] + ar, cfg, cfg_scale, cfg_interval, temperature, top_k, top_p)  # (B, W, V)

    ua, ur, uj, uf = u.split([D, 1, D + 1, D], dim=1)
    didx = n[:, None] + ar[:-1]
    x = tokens.gather(1, didx)
    mine = ar[:-1] < (wv - 1)[:, None]  # the drafts each sample checks
    gumbel = coupling == "gumbel"
    if gumbel:  # the target's own draw at every position; drafts pass while they equal it
        t = gumbel_draw(p, gkeys.gather(1, n[:, None] + ar))
        k = (((x == t[:, :-1]) & (didx < L) & mine).long().cumprod(1).sum(1) if W > 1 else torch.zeros_like(n))
        cand = t  # accepted drafts (equal to t), t at the first mismatch, then the coupled Jacobi drafts
    else:
        k, tok_k = verify(p, qwin, x, didx < L, mine, ua, ur[:, 0], rule, rule_args, rule_kw)
        kk = k[:, None]
        if W > 1:
            y = sample_from_probs(p, uj[:, :W])  # Jacobi update at every position: next drafts after the rejection
            if coupling == "maximal":  # keep each old draft where p still allows it (ua past k is unused above)
                y = torch.cat([maximal_coupling(p[:, :-1], qwin[:, :W - 1], x, ua[:, :W - 1], uj[:, :W - 1]),
                               y[:, -1:]], 1)
            cand = torch.where(ar < kk, torch.cat([x, tok_k[:, None]], 1), torch.where(ar == kk, tok_k[:, None], y))
        else:
            cand = tok_k[:, None]
    kk = k[:, None]
    lp = p.gather(-1, cand[..., None]).squeeze(-1).clamp_min(1e-30).log()

    widx = n[:, None] + ar
    tokens = tokens.scatter(1, widx, cand)
    logp = logp.scatter(1, widx, lp)  # positions past n+k are rewritten when they are decided
    smap = smap.scatter(1, widx, it.expand_as(widx))
    last = n + wv - 1  # each sample's window end: new drafts after it (over what the wider pass wrote)
    p_last = p.gather(1, (wv - 1)[:, None, None].expand(-1, 1, p.shape[-1])).squeeze(1)
    dr = torch.arange(D, device=n.device)
    if gumbel and init == "sample":  # drafts drawn with their own positions' noise from the last distribution
        f = gumbel_draw(p_last[:, None].expand(-1, D, -1), gkeys.gather(1, last[:, None] + 1 + dr))
    else:
        f, fq = fresh_drafts(tokens, last, p_last, uf, init=init, fresh_q=fresh_q, grid=grid, with_q=not gumbel)
    tokens = tokens.scatter(1, last[:, None] + 1 + dr, f)
    if not gumbel:  # Gumbel drafts are checked by equality: no draft distributions to keep
        j = kk + 1 + dr  # offsets of the next drafts: Jacobi ones inside the sample's window, then the new ones
        qwin = gather_rows(torch.cat([p, fq], 1), torch.where(j < wv[:, None], j, j - wv[:, None] + W))

    n, counts = advance(n, k, wv, L, counts)
    return tokens, n, qwin, logp, smap, counts


def advance(n, k, wv, L: int, counts):
    """After a pass that accepted k drafts per sample: the new decided counts (k + 1 tokens, never past L, none for
    finished samples) and the running (passes, drafts checked, drafts accepted) per sample."""
    left = L - n  # n never passes L: a finished (or empty) slot has none left, so it emits, checks, accepts nothing
    emitted = torch.minimum(k + 1, left)
    checked = torch.minimum(emitted, wv - 1)
    accepted = torch.minimum(k, left)
    return n + emitted, counts + torch.stack([(left > 0).long(), checked, accepted], 1)


# The widths window=auto measures and chooses from: each is one compiled graph per attention-length bucket, so few
# (3 cost the same as 4 on this CPU: docs/benchmarks.md).
WIDTHS = (1, 2, 4, 8, 16)


def can_pay(costs: dict[int, float], batch: int = 1) -> bool:
    """Whether any width beats a plain step when every draft is accepted (W tokens for a sample's own cost of a
    width-W pass, :func:`best_width`'s rule): if none does, no acceptance ever makes speculation pay."""
    return best_width(costs, 1.0, max(costs) + 1, batch) > 1


def width_table(file: str, ident: list):
    """A per-width table cached in ``$VGEN_CACHE/<file>`` under the hash of ``ident``: (path, the whole file, this
    table's key, its known {width: value})."""
    import hashlib
    import json

    from vgen.io import cache_dir
    name = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = cache_dir() / file
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    return path, table, name, {int(w): v for w, v in table.get(name, {}).items()}


# A width must promise this much over a plain step before a job leaves AR's loop: the calibration is a few
# samples, and the cost table (the step alone) misses the loop's work per pass, which at batch 8 on this CPU made
# passes cost 16-30% more than the table said (docs/benchmarks.md, "Coupled drafts"); at batch 1 it was exact.
JOB_MARGIN = 1.3


def best_job_width(costs: dict[int, float], tokens: dict[int, float], margin: float = JOB_MARGIN) -> int:
    """One width for every sample and pass of a job: the most tokens per second, ``tokens[w] / costs[w]`` (tokens
    per pass of a sample at fixed width w, every sample of the batch advancing together), if it beats a plain
    step's 1 / costs[1] by ``margin``; else 1 (a plain step)."""
    w = max(sorted(costs), key=lambda w: (1.0 if w == 1 else tokens[w]) / costs[w])
    return w if w == 1 or tokens[w] / costs[w] >= margin / costs[1] else 1


CALIBRATION_SAMPLES = 8  # one batch, classes spread over the model's (i * classes // 8), seeds 2^62 + i


def pass_tokens(sampler, model, widths: list[int], codebook=None) -> dict[int, float]:
    """Tokens per pass of ``sampler`` at each fixed width in ``widths``, from ``CALIBRATION_SAMPLES`` samples of its
    own in one batch (fixed classes and seeds, so every job and call gets the same table): measured once per model
    and settings and cached in ``$VGEN_CACHE/pass_tokens.json``. Acceptance does not depend on timing, so the table
    is the same on every machine (up to float rounding)."""
    import dataclasses

    from vgen.io import atomic_write_json
    o = sampler.options
    settings = {k: v for k, v in dataclasses.asdict(o).items() if k not in ("window", "max_window", "costs")}
    w0 = next(model.parameters())
    path, table, name, known = width_table("pass_tokens.json", [sampler.name, model.config_dict(), str(w0.dtype),
                                                                 settings, CALIBRATION_SAMPLES, "spread"])
    missing = [w for w in widths if w not in known]
    if missing:
        k = CALIBRATION_SAMPLES
        cond = torch.tensor([i * model.num_classes // k for i in range(k)], device=w0.device)
        seeds = [2 ** 62 + i for i in range(k)]
        for w in missing:
            with torch.inference_mode():
                _, st = sampler.fixed(w)._run(model, cond, seeds, False, k, codebook=codebook)
            known[w] = float(st["accepted_per_step"])
        table[name] = {str(w): t for w, t in sorted(known.items())}
        atomic_write_json(path, table)
    return {w: known[w] for w in widths}


# window=auto (the timed rule) leaves AR's loop only for a width that beats it in paired timings: each round times
# AR's loop and every width back to back, so a slow spell of the machine hits both sides of a ratio. The width with
# the best median ratio runs if that median is at least ``TIMED_MARGIN`` and no round had it below ``TIMED_FLOOR``
# (compiled batch 1 on this 2-core VM: widths and AR's loop 10-20% apart, whole runs moving 10-45% between runs;
# best-of-two per side once picked a width that then ran 0.92x: docs/benchmarks.md "Timed widths")
TIMED_MARGIN = 1.1
TIMED_FLOOR = 1.0
TIMED_ROUNDS = 3
TIMED_SAMPLES = 8  # samples per timed run (at least the job's batch), classes spread over the model's, fixed seeds


def timed_choice(speeds: dict[int, list[float]]) -> int:
    """The timed rule's decision from tokens per second per round (``speeds[1]``: AR's loop; round r of every width
    was timed next to round r of AR's): among the widths whose ratio to AR's loop never fell below
    ``TIMED_FLOOR``, the one with the highest median ratio, if that median is >= ``TIMED_MARGIN``; else 1."""
    ar = speeds[1]
    ratios = {w: [s / a for s, a in zip(v, ar)] for w, v in speeds.items() if w != 1}
    ratios = {w: r for w, r in ratios.items() if min(r) >= TIMED_FLOOR}
    if not ratios:
        return 1
    w = max(sorted(ratios), key=lambda w: statistics.median(ratios[w]))
    return w if statistics.median(ratios[w]) >= TIMED_MARGIN else 1


def timed_width(sampler, model, widths: list[int], batch: int, run, ident: tuple = ()) -> int:
    """window=auto's timed rule: one width for the job, or 1 for AR's loop. AR's loop (``sampler._plain_ar``) and
    ``run(w, cond, seeds)`` (the sampler at fixed width w, ``batch`` samples per pass) for each of ``widths`` are
    timed whole -- target passes, verification, drafting and the loop's host work -- on ``max(TIMED_SAMPLES,
    batch)`` samples of fixed classes and seeds, in ``TIMED_ROUNDS`` interleaved rounds (compiled runs get one
    untimed run of ``batch`` samples first, so no compilation is timed). Tokens per second per round are cached in
    ``$VGEN_CACHE/spec_speed.json`` per sampler, model, ``ident`` (e.g. a draft head's digest), dtype, device,
    threads, torch version, settings and batch; :func:`timed_choice` decides."""
    import dataclasses

    from vgen.io import atomic_write_json
    o = sampler.options
    settings = {k: v for k, v in dataclasses.asdict(o).items() if k not in ("window", "max_window", "costs")}
    w0 = next(model.parameters())
    path, table, name, known = width_table("spec_speed.json", [
        sampler.name, model.config_dict(), [str(i) for i in ident], str(w0.dtype), w0.device.type,
        torch.get_num_threads(), torch.__version__, settings, batch, "rounds", TIMED_ROUNDS])
    if not all(w in known for w in [1] + widths):
        k = max(TIMED_SAMPLES, batch)
        cond = torch.tensor([i * model.num_classes // k % model.num_classes for i in range(k)], device=w0.device)
        seeds = [2 ** 62 + i for i in range(k)]
        runs = [(1, lambda c, s: sampler._plain_ar(model, c, s, False, batch, None))]
        runs += [(w, lambda c, s, w=w: run(w, c, s)) for w in widths]
        speeds = {w: [] for w, _ in runs}
        with torch.inference_mode():
            if o.compile:
                for _, go in runs:
                    go(cond[:batch], seeds[:batch])
            for _ in range(TIMED_ROUNDS):
                for w, go in runs:
                    t0 = time.perf_counter()
                    go(cond, seeds)
                    speeds[w].append(k * model.seq_len / (time.perf_counter() - t0))
        known.update(speeds)
        table[name] = {str(w): v for w, v in sorted(known.items())}
        atomic_write_json(path, table)
    return timed_choice({w: known[w] for w in [1] + widths})


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


def pass_costs(model, step, kw: dict, widths: list[int], key: tuple, batch: int = 1,
               repeats: int = 7) -> dict[int, float]:
    """Seconds per pass of ``step`` at each width for ``batch`` samples, for this model (architecture, dtype,
    device), thread count and settings ``key``: measured once (widths interleaved, median of ``repeats`` after a
    warm-up call, on a half-filled cache) and cached in ``$VGEN_CACHE/pass_costs.json``. A wide pass costs more
    against AR's step at batch 8 than at batch 1 (more rows, less per-op overhead to hide them), so the batch is
    the job's (:func:`job_shape`): every call and rank of one job uses one table and draws the same widths."""
    S = batch
    from vgen.io import atomic_write_json
    w0 = next(model.parameters())
    path, table, name, known = width_table("pass_costs.json", [
        model.config_dict(), str(w0.dtype), w0.device.type, S, torch.get_num_threads(), torch.__version__,
        [str(k) for k in key], kw["cfg"], kw["D"]])
    if all(w in known for w in widths):
        return known
    L, D, dev, V = kw["L"], kw["D"], w0.device, model.vocab_size
    rows = 2 * S if kw["cfg"] else S
    cache = model.new_cache(rows)
    cache.limit(None)
    model.prefill(torch.zeros(rows, dtype=torch.long, device=dev), cache)
    n = torch.full((S,), L // 2, dtype=torch.long, device=dev)
    state = (torch.zeros((S, L + 2 * D + 2), dtype=torch.long, device=dev), n,
             torch.full((S, D, V), 1.0 / V, device=dev), torch.zeros((S, L + 2 * D + 2), device=dev),
             torch.zeros((S, L + 2 * D + 2), dtype=torch.long, device=dev),
             torch.zeros((S, 3), dtype=torch.long, device=dev))
    u = torch.rand((S, 3 * D + 2), generator=torch.Generator().manual_seed(0)).to(dev)
    if kw.get("gkeys") is not None:  # Gumbel coupling: keys for this measurement's own batch
        kw = {**kw, "gkeys": gumbel_keys(range(S), L + 2 * D + 2, dev)}
    it = torch.tensor(1, device=dev)
    seen = model.cond_len + L // 2 + max(widths)
    times = {w: [] for w in widths}
    for r in range(repeats + 1):
        for w in widths:
            cache.limit(cache.bucket(seen))
            t0 = time.perf_counter()
            out = step(model, cache, *state[:2], torch.full_like(n, w), *state[2:], u, it, W=w, **kw)
            out[1].tolist()  # wait for the device
            if r:
                times[w].append(time.perf_counter() - t0)
    costs = {w: sorted(t)[len(t) // 2] for w, t in times.items()}
    table[name] = {**{str(w): c for w, c in known.items()}, **{str(w): c for w, c in costs.items()}}
    atomic_write_json(path, table)
    return {**known, **costs}


class SpeculativeSampler(Sampler):
    """Base class: subclasses give ``rule`` (a module-level function, see the module docstring) and
    ``rule_inputs`` (the tensors and constants it needs, e.g. tables built from the codebook)."""

    Options = SpeculativeOptions
    rule = None
    prefix = True
    # window=auto: "timed" runs the width (or AR's loop) with the most tokens per second in whole timed runs
    # (:func:`timed_width`; with ``costs`` given, each sample's width is chosen before every pass from those costs
    # and the acceptance it observes, :class:`WidthPolicy`); "job" one width for the whole job from the pass costs
    # and calibrated tokens per pass (:func:`pass_tokens`)
    width_rule = "timed"

    def timed_widths(self) -> list[int]:
        """The fixed widths window=auto's timed rule tries (besides AR's loop)."""
        return [w for w in WIDTHS if 2 <= w <= self.options.max_window]

    def fixed(self, window: int) -> SpeculativeSampler:
        """This sampler with a fixed ``window``."""
        import copy
        import dataclasses
        run = copy.copy(self)
        run.options = dataclasses.replace(self.options, window=window)
        return run

    def rule_inputs(self, model, codebook) -> tuple[tuple, dict]:
        return (), {}

    # Where the drafts come from. By default the model drafts for itself (Jacobi iteration, ``init`` for new
    # positions) and the pass is :func:`spec_step`; a sampler with another draft source (a trained draft head,
    # :mod:`vgen.samplers.eagle`) overrides these: ``step_fn`` (same signature and state as spec_step), the extra
    # keyword arguments it takes (``step_kwargs``), the prefill passes (which may also return the target's hidden
    # states) and the drafts after a prefill.
    step_fn = staticmethod(spec_step)

    def step_kwargs(self, model, rows: int) -> dict:
        """Extra keyword arguments of ``step_fn`` for a run with ``rows`` cache rows."""
        return {}

    def new_cache(self, model, rows: int):
        """The target's KV cache for ``rows`` rows (a tree pass needs scratch slots past the sequence)."""
        return model.new_cache(rows)

    def prefill_pass(self, model, cond_in, cache) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The condition's pass: (logits (rows, 1, V) for the first token, hidden states or None)."""
        return model.prefill(cond_in, cache)[:, None], None

    def decode_pass(self, model, x, pos, cache) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A prefix's pass: (logits (rows, P, V), hidden states or None)."""
        return model.decode(x, pos, cache), None

    def first_drafts(self, model, tokens, first, p0, uf, feats, refilled, kw) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts (S, D) and their distributions (S, D, V) after a prefill: ``tokens`` hold the first drawn token at
        ``first`` (S,), p0 (S, V) its distribution, uf (S, D) uniforms; ``feats``: the prefill passes' hidden
        states; only the ``refilled`` rows are kept."""
        o = self.options
        f, q = fresh_drafts(tokens, first, p0, uf, init=o.init, fresh_q=o.fresh_q, grid=tuple(model.token_shape))
        if o.coupling == "gumbel" and o.init == "sample":
            D = uf.shape[1]
            P = int(first[0])
            f = gumbel_draw(p0[:, None].expand(-1, D, -1), kw["gkeys"][:, P + 1:P + 1 + D])
        return f, q

    def _plain_ar(self, model, cond, seeds, progress, batch_size, prefix):
        """window=auto where speculation cannot pay: the plain AR sampler with these sampling options (the same
        distribution, exactly; for gsd / lantern, AR's instead of their relaxed one), at AR's speed."""
        import dataclasses

        from vgen.samplers.base import get_sampler
        o = self.options
        plain = {f.name: getattr(o, f.name) for f in dataclasses.fields(SamplingOptions)}
        if o.coupling == "gumbel":  # AR's Gumbel draw: the tokens the coupled sampler would give
            plain["draw"] = "gumbel"
        tokens, stats = get_sampler("ar", model=model, **plain)(model, cond, seeds, progress, batch_size=batch_size,
                                                                 prefix=prefix)
        return tokens, {**stats, "acceptance_rate": 0.0, "mean_window": 1.0}

    def _run(self, model, cond, seeds, progress, batch_size, codebook=None, prefix=None):
        """Continuous batching: ``batch_size`` slots; when a sample finishes, the next one is prefilled into its
        slot, so a long job never waits for the slowest sample of a batch (only the last ones do)."""
        o = self.options
        t0 = time.perf_counter()
        N, L, dev = cond.shape[0], model.seq_len, cond.device
        adaptive = o.window == "auto"
        Wmax = o.max_window if adaptive else o.window  # the widest pass; drafts are kept for it
        D = Wmax - 1
        S = min(batch_size, N)
        grid = tuple(model.token_shape)
        rule_args, rule_kw = self.rule_inputs(model, codebook)
        cfg = o.guided
        kw = dict(L=L, D=D, grid=grid, cfg=cfg, cfg_scale=o.cfg_scale, cfg_interval=o.cfg_interval,
                  temperature=o.temperature, top_k=o.top_k, top_p=o.top_p, init=o.init, fresh_q=o.fresh_q,
                  rule=self.rule, rule_args=rule_args, rule_kw=rule_kw, coupling=o.coupling)
        gumbel = o.coupling == "gumbel"
        if gumbel:  # each slot's sample's position keys (refilled with the slot)
            kw["gkeys"] = torch.zeros((S, L + 2 * Wmax), dtype=torch.long, device=dev)
        kw.update(self.step_kwargs(model, 2 * S if cfg else S))
        step_fn = self.step_fn
        step = compiled(step_fn) if o.compile else step_fn
        costs = None
        if adaptive and type(self).width_rule == "timed" and not o.costs:  # one timed width for the job, or AR's loop
            samples, job_batch = job_shape(N, batch_size)
            b = min(samples, job_batch)
            w = timed_width(self, model, self.timed_widths(), b, lambda w, c, s: self.fixed(w)._run(
                model, c, s, False, b, codebook=codebook))
            if w == 1:
                return self._plain_ar(model, cond, seeds, progress, batch_size, prefix)
            return self.fixed(w)._run(model, cond, seeds, progress, batch_size, codebook=codebook, prefix=prefix)
        if adaptive:  # per-pass widths from given costs, or scd's job rule
            samples, job_batch = job_shape(N, batch_size)  # the job's batch: one table for all its calls
            cost_batch = 1 if o.costs else min(samples, job_batch)  # given costs: one sample's (batch-invariant)
            costs = parse_costs(o.costs) if o.costs else pass_costs(
                model, step, kw, [w for w in WIDTHS if w <= Wmax], batch=cost_batch,
                key=(self.name, o.compile, o.top_k > 0, o.top_p < 1, o.init, o.fresh_q, o.coupling))
            costs = {w: c for w, c in costs.items() if w <= Wmax}
            job = type(self).width_rule == "job"  # one width for all: every sample widens with the others
            if not can_pay(costs, 1 if job else cost_batch):  # no width pays even if every draft passes: AR's loop
                return self._plain_ar(model, cond, seeds, progress, batch_size, prefix)
            if job:
                w = best_job_width(costs, pass_tokens(self, model, [w for w in costs if w > 1], codebook))
                if w == 1:
                    return self._plain_ar(model, cond, seeds, progress, batch_size, prefix)
                return self.fixed(w)._run(model, cond, seeds, progress, batch_size, codebook=codebook, prefix=prefix)
        cache = self.new_cache(model, 2 * S if cfg else S)  # (after the fallback: AR allocates its own)

        P = 0 if prefix is None else prefix.shape[1]  # given tokens: each sample starts at token P
        B = L + 2 * Wmax  # buffer length: drafts may run past the end of the image
        tokens = torch.zeros((S, B), dtype=torch.long, device=dev)
        logp = torch.zeros((S, B), dtype=torch.float32, device=dev)
        smap = torch.zeros((S, B), dtype=torch.long, device=dev)
        qwin = torch.zeros((S, D, model.vocab_size), device=dev)
        n = torch.full((S,), L, dtype=torch.long, device=dev)  # an empty slot counts as finished
        counts = torch.zeros((S, 3), dtype=torch.long, device=dev)
        u = torch.zeros((S, L, 3 * D + 2), device=dev)
        slot_cond = cond[:1].expand(S, *cond.shape[1:]).clone()
        owner = [-1] * S  # sample index held by each slot
        start = torch.zeros(S, dtype=torch.long, device=dev)  # iteration at which each slot was prefilled
        slot_rows = torch.arange(S, device=dev)
        out_tokens = torch.zeros((N, L), dtype=torch.long, device=dev)
        out_smap = torch.zeros((N, L), dtype=torch.long, device=dev)
        out_logp = torch.zeros((N, L), dtype=torch.float32, device=dev)
        passes = torch.zeros(N, dtype=torch.float64)
        checked = accepted = prefills = collected = 0
        next_sample, it = 0, 0

        def fill(slots: list[int]) -> None:
            """Prefill the next samples into ``slots`` (one prefill pass over every row: the other rows
            recompute their own condition's keys and values, unchanged)."""
            nonlocal next_sample, prefills
            idx = torch.tensor(slots, device=dev)
            start[idx] = it
            for b in slots:
                owner[b], policies[b] = next_sample, None
                slot_cond[b] = cond[next_sample]
                u[b] = per_sample_uniforms([seeds[next_sample]], (L, 3 * D + 2), dev, stream=1)[0]
                if gumbel:
                    kw["gkeys"][b] = gumbel_keys([seeds[next_sample]], L + 2 * Wmax, dev)[0]
                next_sample += 1
            cond_in = torch.cat([slot_cond, model.null_cond(slot_cond)]) if cfg else slot_cond
            first = torch.full((S,), P, dtype=torch.long, device=dev)  # the first token to draw
            cache.limit(model.cond_len if o.prefix_attention else None)
            logits, feats = self.prefill_pass(model, cond_in, cache)
            prefills += 1
            t_new = tokens.clone()
            if P:  # feed the given tokens in one more pass (every row: the others recompute their own)
                for b in slots:
                    t_new[b, :P] = prefix[owner[b]]
                x = torch.cat([t_new[:, :P], t_new[:, :P]]) if cfg else t_new[:, :P]
                cache.limit(model.cond_len + P if o.prefix_attention else None)
                logits, more = self.decode_pass(model, x, torch.arange(model.cond_len, model.cond_len + P, device=dev),
                                                cache)
                logits = logits[:, -1:]
                feats = None if feats is None else torch.cat([feats, more], 1)
                prefills += 1
            p0 = window_target(logits, first[:, None], cfg, o.cfg_scale, o.cfg_interval, o.temperature, o.top_k,
                               o.top_p)[:, 0]
            _, ur, _, uf = u[:, 0].split([D, 1, D + 1, D], dim=1)
            if gumbel:
                t_new[:, P] = gumbel_draw(p0, kw["gkeys"][:, P])
            else:
                t_new[:, P] = sample_from_probs(p0, ur[:, 0])
            refilled = torch.zeros(S, dtype=torch.bool, device=dev)
            refilled[idx] = True
            f, q_new = self.first_drafts(model, t_new, first, p0, uf, feats, refilled, kw)
            t_new[:, P + 1:P + 1 + D] = f
            tokens[idx] = t_new[idx]
            logp[idx, :P] = 0.0
            logp[idx, P] = p0[idx].gather(-1, t_new[idx, P:P + 1]).squeeze(-1).clamp_min(1e-30).log()
            smap[idx] = it
            qwin[idx] = q_new[idx].to(qwin.dtype)
            n[idx] = P + 1
            counts[idx] = 0

        policies = [None] * S  # window=auto: each slot's own width policy (from its own sample's passes only)
        widths = [Wmax] * S
        fill(list(range(S)))
        bar = tqdm(total=N * L, disable=not progress, desc=self.name, unit="tok", leave=False)
        shown, before, width_sum, width_n = 0, None, 0, 0
        wv = torch.full((S,), Wmax, dtype=torch.long, device=dev)
        while True:
            n_host = n.tolist()
            if costs is not None and before is not None:  # what each sample's last pass accepted
                for b in range(S):
                    if owner[b] >= 0 and before[b] < n_host[b] < L:
                        k = n_host[b] - before[b] - 1
                        policies[b].observe(k, min(k + 1, widths[b] - 1))
            finished = [b for b in range(S) if owner[b] >= 0 and n_host[b] >= L]
            for b in finished:  # collect
                i = owner[b]
                out_tokens[i], out_logp[i] = tokens[b, :L], logp[b, :L]
                out_smap[i] = smap[b, :L] - start[b]
                c = counts[b].tolist()
                passes[i] = c[0] + 1 + int(P > 0)  # its passes and its prefill (and prefix pass)
                checked += c[1]
                accepted += c[2]
                owner[b] = -1
            collected += len(finished)
            refill = finished[: N - next_sample]
            if refill:
                fill(refill)
                n_host = n.tolist()
            done = collected * L + sum(n_host[b] for b in range(S) if owner[b] >= 0)
            bar.update(done - shown)
            shown = done
            if all(ow < 0 for ow in owner):
                break
            it += 1
            # attention reads the filled prefix only: the furthest position an active sample feeds, plus one
            front = max(n_host[b] for b in range(S) if owner[b] >= 0)
            if costs is not None:
                for b in range(S):
                    if owner[b] >= 0:
                        if policies[b] is None:  # a new sample in this slot
                            policies[b] = WidthPolicy(costs, cost_batch)
                        widths[b] = policies[b].width(L - n_host[b])
                before = list(n_host)
            act = [widths[b] for b in range(S) if owner[b] >= 0 and n_host[b] < L]
            W = max(act)
            width_sum, width_n = width_sum + sum(act), width_n + len(act)
            seen = model.cond_len + min(L - 1, front + W - 2) + 1
            cache.limit((cache.bucket(seen) if o.compile else seen) if o.prefix_attention else None)
            ui = u[slot_rows, (it - start).clamp(0, L - 1)]  # each sample's own uniforms for its own step
            if costs is not None:  # fixed window: wv stays all Wmax, built once below
                wv = torch.tensor(widths, device=dev).clamp_max(W)
            tokens, n, qwin, logp, smap, counts = step(model, cache, tokens, n, wv, qwin, logp, smap, counts, ui,
                                                       torch.tensor(it, device=dev), W=W, **kw)
        bar.close()
        stats = {"forward_passes": it + prefills, "tokens": N * (L - P), "seconds": time.perf_counter() - t0,
                 "kv_cache_bytes": cache.nbytes, "nll": float(-out_logp[:, P:].mean()),
                 "accepted_per_step": float(((L - P) / passes).mean()),
                 "acceptance_rate": accepted / checked if checked else 0.0,
                 "mean_window": width_sum / max(width_n, 1), "step_map": out_smap}
        return out_tokens, stats
