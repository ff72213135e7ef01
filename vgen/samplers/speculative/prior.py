"""``window=auto`` for a job too small to repay the timed rule: a prior from what a pass costs on this machine and
how many tokens the sampler's passes decide on this model.

The timed rule (:func:`~vgen.samplers.speculative.widths.timed_width`) runs AR's loop and every width whole, in paired
rounds; a job with fewer than ``TIMED_JOB_RATIO`` times the timing's samples would spend more on that timing than
any width can save it. Such a job decides from a prior instead, in a second or two the first time and a cache read
after:

* **costs** (:func:`prior_costs`): one eager step of AR's loop and one speculative pass at each width the sampler
  may choose, at the job's batch on a half-filled cache, interleaved, medians of repeats
  (:func:`~vgen.samplers.speculative.tables.pass_costs`; once per machine, model, dtype, settings and batch, cached in
  ``$VGEN_CACHE/pass_costs.json``);
* **tokens** (:func:`prior_tokens`): how many tokens a pass decides, from one batch of ``PRIOR_SAMPLES`` samples of
  fixed classes and seeds at the widest width that could pay (the passes that decided 1, 2, ... tokens), eager,
  for at most ``PRIOR_BUDGET`` of the job's time in AR's loop; a narrower width w is credited with those passes cut
  to w tokens each, and measured too before it runs. Acceptance hardly depends on the machine: cached in
  ``$VGEN_CACHE/prior_tokens.json`` per model and settings. Skipped where the costs alone rule every width out (no
  width would pay even if every draft passed); where the budget leaves fewer than ``PRIOR_MIN_PASSES`` passes of its samples, the job
  runs AR's loop (``fallback``);
* **decision** (:func:`prior_choice`): the width with the most tokens per unit of cost runs if it beats AR's step by
  ``PRIOR_MARGIN`` at batch 1 or ``PRIOR_BATCH_MARGIN`` above (one pass leaves out the scheduler's own work per pass
  and a batch's wait for its slowest sample, both larger at larger batches); else AR's loop.

The run's stats say ``window_rule: prior`` (or ``fallback``) and ``window_seconds``, what choosing cost. A compiled
job gets AR's loop (``fallback``): compiled passes cost in other proportions than eager ones (AR's compiled step
gains more from compilation than a speculative pass, whose scheduler work stays), and compiling every width only to
time it would cost a small job more than it can save.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from vgen.kernels.decode import ar_decode_step
from vgen.samplers.base import example_cond
from vgen.samplers.speculative.tables import fingerprint, pass_costs, width_table

PRIOR_MARGIN = 1.15        # the gain over AR's step a width must promise at batch 1
PRIOR_BATCH_MARGIN = 1.5   # ... at a larger batch
PRIOR_SAMPLES = 8          # samples of the tokens-per-pass calibration (one batch, eager)
PRIOR_BUDGET = 0.25        # the calibration may take at most this share of the job's time in AR's loop
PRIOR_MIN_PASSES = 128     # ... and must see this many of its samples' passes, else AR's loop (fallback)


def prior_choice(costs: dict[int, float], tokens: dict[int, float], batch: int) -> int:
    """The prior's width from pass costs ({0: AR's step, w: a speculative pass of width w}) and tokens per pass
    ``tokens[w]``, for passes of ``batch`` samples: the width with the best predicted speed over AR's loop,
    tokens[w] * costs[0] / costs[w], if that beats the margin, else 1 (AR's loop)."""
    margin = PRIOR_MARGIN if batch == 1 else PRIOR_BATCH_MARGIN
    widths = [w for w in sorted(tokens) if w > 1]
    if not widths:
        return 1
    best = max(widths, key=lambda w: tokens[w] / costs[w])
    return best if tokens[best] * costs[0] / costs[best] >= margin else 1


def tokens_at(histogram: dict[int, int], width: int) -> float:
    """Tokens per pass at ``width`` from the passes of a wider run that decided c tokens (``histogram[c]``): each such
    pass, at this width, takes ceil(c / width) passes."""
    tokens = sum(c * n for c, n in histogram.items())
    passes = sum(-(-c // width) * n for c, n in histogram.items())
    return tokens / passes if passes else 1.0


def ar_step(model, options, batch: int):
    """AR's own decode step for ``batch`` samples with ``options``' sampling settings, as a function of the cache
    (one token fed at the middle of the image): what the prior compares every width with."""
    o = options
    dev = next(model.parameters()).device
    tok = torch.zeros((batch, 1), dtype=torch.long, device=dev)
    pos = torch.tensor([model.cond_len + model.seq_len // 2], device=dev)
    u = torch.full((batch,), 0.5, device=dev)
    kw = dict(cfg=o.guided, apply_cfg=True, cfg_scale=o.cfg_scale, temperature=o.temperature, top_k=o.top_k,
              top_p=o.top_p)
    return lambda cache: ar_decode_step(model, cache, tok, pos, u, **kw)[0]


def prior_widths(sampler) -> list[int]:
    """The widths among ``sampler``'s timed ones; its other timed candidates (pac's narrower trees, ``'2x1'``) are
    the timed rule's only."""
    return [w for w in sampler.timed_widths() if isinstance(w, int)]


def prior_costs(sampler, model, batch: int, codebook=None, draft=None) -> dict[int, float]:
    """Eager seconds per pass of AR's step (key 0) and of ``sampler`` at each of its timed widths, for ``batch``
    samples (cached: :func:`~vgen.samplers.speculative.tables.pass_costs`)."""
    widths = prior_widths(sampler)
    config = sampler.step_config(model, max(widths))
    source = sampler.draft_source(model, config, batch, draft)
    with torch.inference_mode():
        return pass_costs(model, source.step_fn, config, sampler.acceptance(model, codebook), source.step_args,
                          widths, sampler.cost_key(False, draft), batch=batch,
                          ar_step=ar_step(model, sampler.options, batch),
                          new_cache=lambda rows: source.new_cache(model, rows), fill=source.fill)


def enough_passes(model) -> int:
    """The passes a tokens-per-pass table must count to be used: ``PRIOR_MIN_PASSES``, fewer on a short sequence."""
    return min(PRIOR_MIN_PASSES, PRIOR_SAMPLES * (model.seq_len // 4))


def prior_tokens(sampler, model, width: int, codebook=None, draft=None,
                 seconds: float | None = None) -> dict[int, int] | None:
    """The passes that decided 1, 2, ... tokens ({c: passes}) in one eager run of ``sampler`` at ``width`` on
    ``PRIOR_SAMPLES`` samples of ``model`` in one batch (classes spread over the model's, seeds 2^62 + i), cut short
    after ``seconds``; cached (a table cut short too). ``seconds=0``: the cached table, or None."""
    from vgen.io import atomic_write_json
    skip = ("window", "max_window", "costs", "compile")
    settings = {k: v for k, v in dataclasses.asdict(sampler.options).items() if k not in skip}
    w0 = next(model.parameters())
    path, table, name, known = width_table("prior_tokens.json", [
        sampler.name, model.config_dict(), str(w0.dtype), settings, width, PRIOR_SAMPLES, fingerprint(model),
        [str(i) for i in sampler.timing_ident(draft)]])
    if seconds == 0:
        return known or None
    if sum(known.values()) < enough_passes(model):  # none, or one cut too short
        run = sampler.fixed(width)
        run.options = dataclasses.replace(run.options, compile=False)
        cond = example_cond(model, PRIOR_SAMPLES, w0.device)
        with torch.inference_mode():
            _, st = run.decode(model, cond, [2 ** 62 + i for i in range(PRIOR_SAMPLES)], False, PRIOR_SAMPLES,
                               codebook, None, draft, max_seconds=seconds)
        new = {c: n for c, n in enumerate(st["pass_histogram"], 1) if n}
        if sum(new.values()) > sum(known.values()):
            known = new
            table[name] = {str(c): n for c, n in known.items()}
            atomic_write_json(path, table)
    return known


def prior_width(sampler, model, batch: int, samples: int, codebook=None, draft=None) -> tuple[int, str]:
    """window=auto's prior for a small job of ``samples`` samples at ``batch`` per pass: (width, "prior"), width 1
    being AR's loop, or (1, "fallback") for a compiled job or where measuring tokens per pass could cost more than
    ``PRIOR_BUDGET`` of the job. Tokens per pass are measured at the widest width that could pay; a narrower width
    credited from those passes (:func:`tokens_at`: an upper bound where drafts improve with the passes they stay in
    the window, as Jacobi drafts do) is measured too before it is chosen."""
    if sampler.options.compile:
        return 1, "fallback"
    costs = prior_costs(sampler, model, batch, codebook, draft)
    depth = {w: sampler.pass_depth(w) for w in prior_widths(sampler)}
    margin = PRIOR_MARGIN if batch == 1 else PRIOR_BATCH_MARGIN
    widths = [w for w, d in depth.items() if d * costs[0] / costs[w] >= margin]  # could pay if every draft passed
    if not widths:
        return 1, "prior"
    L = model.seq_len
    enough = enough_passes(model)
    budget = PRIOR_BUDGET * -(-samples // batch) * L * costs[0]  # the job's seconds in AR's loop, roughly

    def measured(w, share):  # {c: passes} at width w (cut short at ``share`` of what is left of the budget), or None
        nonlocal budget
        hist = prior_tokens(sampler, model, w, codebook, draft, seconds=0)
        if (hist is None or sum(hist.values()) < enough) and budget > 0:
            t0 = time.perf_counter()
            hist = prior_tokens(sampler, model, w, codebook, draft, seconds=share * budget)
            budget -= time.perf_counter() - t0
        return hist if hist is not None and sum(hist.values()) >= enough else None
    widest = max(widths)
    hist = measured(widest, 0.5)  # half the budget: the rest for a narrower width, if one is credited
    if hist is None:
        return 1, "fallback"
    tokens = {w: tokens_at(hist, depth[w]) for w in widths}
    w = prior_choice(costs, tokens, batch)
    if w not in (1, widest):  # measured, not credited from the widest run's passes: else the widest or AR's loop
        own = measured(w, 1.0)
        mine = {widest: tokens[widest]} if own is None else {widest: tokens[widest], w: tokens_at(own, depth[w])}
        w = prior_choice(costs, mine, batch)
    return w, "prior"
