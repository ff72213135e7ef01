"""Speculative decoding: a draft source proposes ``window - 1`` tokens per sample, the target checks them all in one
forward pass with an acceptance rule, and a slot scheduler keeps every sample moving at its own pace.

A :class:`SpeculativeSampler` is those three parts put together (:mod:`vgen.samplers.speculative`):

* a **draft source** (:class:`~vgen.samplers.speculative.scheduler.DraftSource`): the model itself by Jacobi iteration
  (:class:`~vgen.samplers.speculative.jacobi.JacobiDrafts`: ``sjd``, ``gsd``, ``lantern``, ``scd``) or a trained draft
  head's chain or tree (:mod:`vgen.samplers.speculative.head`, composed by :mod:`vgen.samplers.eagle`);
* an **acceptance rule** (:class:`~vgen.samplers.speculative.rules.AcceptanceRule`): exact token by token, block, LANTERN or
  GSD, all on the one vectorised verification core (:func:`vgen.kernels.verify.verify`);
* the **scheduler** (:class:`~vgen.samplers.speculative.scheduler.Scheduler`): continuous batching, prefixes, progress and
  step maps;

plus the width policy of ``window=auto`` (:mod:`vgen.samplers.speculative.widths`). A sampler names its source and rule
(:meth:`SpeculativeSampler.draft_source`, :meth:`SpeculativeSampler.acceptance`) and its options; nothing else.

Every decided token is drawn from the target's distribution p at its position (CFG-guided, temperature-scaled,
top-k / top-p truncated, exactly as the AR sampler's) by an exact rule, or within the rule's stated drift.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec
from vgen.kernels.decode import compiled
from vgen.samplers.base import Sampler, SamplingOptions, get_sampler, job_shape, option
from vgen.samplers.speculative.jacobi import JacobiDrafts, JacobiOptions
from vgen.samplers.speculative.prior import prior_width
from vgen.samplers.speculative.rules import TokenRule
from vgen.samplers.speculative.scheduler import Scheduler
from vgen.samplers.speculative.step import StepConfig
from vgen.samplers.speculative.tables import pass_costs, pass_tokens
from vgen.samplers.speculative.widths import (
    WIDTHS,
    WidthPolicy,
    best_job_width,
    can_pay,
    parse_costs,
    timed_width,
    worth_timing,
)


@dataclass
class SpeculativeOptions(SamplingOptions):
    """Options every speculative sampler shares: how wide its passes are."""
    window: int | str = option("auto", "tokens per forward pass: the last accepted one plus window-1 drafts; auto "
                               "(cost-aware): the width 2 / 4 / 8 (or AR's own loop) with the most tokens per "
                               "second in whole runs timed once per model, device, settings and the job's batch "
                               "size (cached on disk; a job too small to repay that timing decides from one pass's "
                               "cost per width and measured tokens per pass, or runs AR's loop); with costs "
                               "given, chosen for each sample before every pass "
                               "from those costs and the acceptance it observes (width 1 = a plain AR step)")
    max_window: int = option(8, "window=auto: the widest pass it may choose")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if isinstance(self.window, str) and self.window.strip().lower() == "auto":
            self.window = "auto"
        elif isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 2:
            raise VGenError(f"window must be auto or a whole number >= 2 (the last accepted token plus at least one "
                            f"draft), got {self.window!r}")
        if self.max_window < 2:
            raise VGenError(f"max_window must be >= 2, got {self.max_window}")
        tokens = math.prod(spec.token_shape) if spec is not None and spec.token_shape else None
        if tokens is not None:  # a pass never needs more than a sample's tokens: a wider window is this one
            if isinstance(self.window, int) and self.window > tokens:
                self.window = tokens
            self.max_window = max(2, min(self.max_window, tokens))


@dataclass
class JacobiSpecOptions(JacobiOptions, SpeculativeOptions):
    """A speculative sampler whose model drafts for itself (:mod:`vgen.samplers.speculative.jacobi`)."""


class SpeculativeSampler(Sampler):
    """Base class of the speculative samplers: subclasses name their options, their acceptance rule
    (:meth:`acceptance`) and, where it is not Jacobi iteration, their draft source (:meth:`draft_source`)."""

    Options = JacobiSpecOptions
    prefix = True
    # window=auto: "timed" runs the width (or AR's loop) with the most tokens per second in whole timed runs
    # (:func:`~vgen.samplers.speculative.widths.timed_width`; a Jacobi source with ``costs`` given chooses each sample's
    # width before every pass, :class:`~vgen.samplers.speculative.widths.WidthPolicy`); "job": one width for the whole job
    # from the pass costs and calibrated tokens per pass (:func:`~vgen.samplers.speculative.tables.pass_tokens`)
    width_rule = "timed"

    def acceptance(self, model, codebook):
        """The run's acceptance rule (``codebook``: the tokenizer's, for rules that measure token similarity)."""
        return TokenRule()

    def draft_source(self, model, config: StepConfig, slots: int, draft=None):
        """The run's draft source for ``slots`` slots (``draft``: the checked draft of a sampler that needs one)."""
        return JacobiDrafts(model, config, self.options, slots)

    def timed_widths(self) -> list[int]:
        """The fixed widths window=auto's timed rule tries (besides AR's loop)."""
        return [w for w in WIDTHS if 2 <= w <= self.options.max_window]

    def fixed(self, window: int) -> SpeculativeSampler:
        """This sampler with a fixed ``window``."""
        run = copy.copy(self)
        run.options = dataclasses.replace(self.options, window=window)
        return run

    def step_config(self, model, widest: int) -> StepConfig:
        o = self.options
        return StepConfig(L=model.seq_len, D=widest - 1, grid=tuple(model.token_shape), cfg=o.guided,
                          cfg_scale=o.cfg_scale, cfg_interval=o.cfg_interval, temperature=o.temperature,
                          top_k=o.top_k, top_p=o.top_p)

    def plain_ar(self, model, cond, seeds, progress, batch_size, prefix=None):
        """window=auto where speculation cannot pay: the plain AR sampler with these sampling options (the same
        distribution, exactly; for gsd / lantern, AR's instead of their relaxed one), at AR's speed."""
        o = self.options
        plain = {f.name: getattr(o, f.name) for f in dataclasses.fields(SamplingOptions)}
        if getattr(o, "coupling", None) == "gumbel":  # AR's Gumbel draw: the tokens the coupled sampler would give
            plain["draw"] = "gumbel"
        tokens, stats = get_sampler("ar", model=model, **plain)(model, cond, seeds, progress, batch_size=batch_size,
                                                                 prefix=prefix)
        return tokens, {**stats, "acceptance_rate": 0.0, "mean_window": 1.0}

    def run_width(self, window: int, model, cond, seeds, batch_size: int, progress: bool = False, codebook=None,
                  prefix=None, draft=None):
        """Sample at a fixed ``window`` (what window=auto's rules time and calibrate)."""
        return self.fixed(window).decode(model, cond, seeds, progress, batch_size, codebook, prefix, draft)

    def decode(self, model, cond, seeds, progress, batch_size, codebook=None, prefix=None, draft=None,
               width: WidthPolicy | None = None, max_seconds: float | None = None):
        """One run of the scheduler at this sampler's fixed window (or, with ``width``, per-sample widths up to
        ``max_window``); ``max_seconds``: cut short (:meth:`Scheduler.run`)."""
        o = self.options
        widest = o.max_window if width is not None else o.window
        config = self.step_config(model, widest)
        slots = min(batch_size, cond.shape[0])
        scheduler = Scheduler(model, self.draft_source(model, config, slots, draft), self.acceptance(model, codebook),
                              config, slots=slots, compile=o.compile, prefix_attention=o.prefix_attention,
                              name=self.name, width=width)
        return scheduler.run(cond, seeds, progress, prefix, max_seconds)

    def _run(self, model, cond, seeds, progress, batch_size, codebook=None, prefix=None, draft=None):
        o = self.options
        given = getattr(o, "costs", "")
        samples, job_batch = job_shape(cond.shape[0], batch_size)  # the job's batch: one choice for all its calls
        b = min(samples, job_batch)
        if o.window != "auto":
            w, rule = o.window, "fixed"
        elif given and self.width_rule == "timed":  # each sample's width before every pass, from the given costs
            return self.per_pass(model, cond, seeds, progress, batch_size, codebook, prefix, draft, given)
        elif self.width_rule == "job" and (given or worth_timing(self.timed_widths(), b, samples)):
            w, rule = self.job_width(model, b, codebook, given), "job"
            if w > 1 and not given:  # the guard: the chosen width against AR's own loop, timed whole
                w, rule = self.confirm_width(w, model, b, samples, codebook, draft)
        else:
            return self.run_auto(model, cond, seeds, progress, batch_size, codebook, prefix, draft)
        return self.run_chosen(w, rule, model, cond, seeds, progress, batch_size, codebook, prefix, draft)

    def run_auto(self, model, cond, seeds, progress, batch_size, codebook=None, prefix=None, draft=None):
        """window=auto's one width for the job (:meth:`auto_width`), then the run; the stats add the seconds the
        choice took (``window_seconds``: a timing, a prior's pass costs, or a cache read)."""
        samples, job_batch = job_shape(cond.shape[0], batch_size)
        t0 = time.perf_counter()
        w, rule = self.auto_width(model, min(samples, job_batch), samples, codebook, draft, progress)
        chose = time.perf_counter() - t0
        tokens, stats = self.run_chosen(w, rule, model, cond, seeds, progress, batch_size, codebook, prefix, draft)
        return tokens, {**stats, "window_seconds": chose}

    def run_chosen(self, w: int, rule: str, model, cond, seeds, progress, batch_size, codebook=None, prefix=None,
                   draft=None):
        """Sample at width ``w`` (1: AR's loop), the stats naming the width and how it was chosen (``rule``)."""
        if w == 1:
            tokens, stats = self.plain_ar(model, cond, seeds, progress, batch_size, prefix)
        else:
            tokens, stats = self.run_width(w, model, cond, seeds, batch_size, progress, codebook, prefix, draft)
        return tokens, {**stats, "window": w, "window_rule": rule}

    def auto_width(self, model, batch: int, samples: int, codebook=None, draft=None,
                   progress: bool = False) -> tuple[int, str]:
        """window=auto's one width for a job of ``samples`` samples, ``batch`` per pass (1: AR's loop), and how it
        was chosen: "timed" or "cached" (:func:`~vgen.samplers.speculative.widths.timed_width`), or for a job too small to
        repay the timing "prior" or "fallback" (:func:`~vgen.samplers.speculative.prior.prior_width`)."""
        timed = self.time_widths(self.timed_widths(), model, batch, samples, codebook, draft, progress)
        return timed if timed is not None else prior_width(self, model, batch, samples, codebook, draft)

    def time_widths(self, widths: list[int], model, batch: int, samples: int, codebook=None, draft=None,
                    progress: bool = False) -> tuple[int, str] | None:
        """The timed rule (:func:`~vgen.samplers.speculative.widths.timed_width`) over AR's loop and this sampler
        at each of ``widths``, ``batch`` samples per pass, for a job of ``samples``."""
        return timed_width(self, model, widths, batch, lambda w, c, s: self.run_width(
            w, model, c, s, batch, codebook=codebook, draft=draft), ident=self.timing_ident(draft), job=samples,
            progress=progress)

    def job_width(self, model, batch: int, codebook=None, given: str = "") -> int:
        """The job rule (``width_rule = "job"``): one width from pass costs (``given``, else measured for ``batch``)
        and calibrated tokens per pass; 1 where none beats a plain step."""
        costs = parse_costs(given) if given else self.measured_costs(model, 1 if given else batch, codebook)
        costs = {w: c for w, c in costs.items() if 1 <= w <= self.options.max_window}
        if not can_pay(costs, 1):  # no width pays even if every draft passes
            return 1
        return best_job_width(costs, pass_tokens(self, model, [w for w in costs if w > 1], codebook))

    def confirm_width(self, w: int, model, batch: int, samples: int, codebook=None, draft=None) -> tuple[int, str]:
        """The job rule's width ``w`` timed whole against AR's own loop in paired rounds (the timed rule's
        :func:`~vgen.samplers.speculative.widths.timed_width` with this one width; cached): ``w`` where it beat AR's
        loop, else 1. The pass-cost table times the step alone, against the sampler's own width-1 step; a compiled AR
        loop can be faster than either suggests (compiled ``scd`` chose width 16 at batch 1 on photos-gpt and ran
        0.75x compiled ``ar`` before this check, docs/lab/benchmarks-log.md#recompile-limit)."""
        timed = self.time_widths([w], model, batch, samples, codebook, draft)
        return (w, "job") if timed is None else (timed[0], "job, timed")

    def per_pass(self, model, cond, seeds, progress, batch_size, codebook, prefix, draft, given: str):
        """window=auto with given relative costs: each sample's width before every pass
        (:class:`~vgen.samplers.speculative.widths.WidthPolicy`; batch-invariant: the costs are one sample's)."""
        costs = {w: c for w, c in parse_costs(given).items() if w <= self.options.max_window}
        if not can_pay(costs, 1):  # no width pays even if every draft passes: AR's loop
            return self.run_chosen(1, "per-pass", model, cond, seeds, progress, batch_size, codebook, prefix, draft)
        tokens, stats = self.decode(model, cond, seeds, progress, batch_size, codebook, prefix, draft,
                                    width=lambda: WidthPolicy(costs, 1))
        return tokens, {**stats, "window_rule": "per-pass"}

    def pass_depth(self, window: int) -> int:
        """The most tokens one pass of ``window`` can decide (a chain: all of them)."""
        return window

    def timing_ident(self, draft) -> tuple:
        """What besides the model and options identifies a timed run (e.g. a draft head's digest)."""
        return ()

    def measured_costs(self, model, batch: int, codebook=None) -> dict[int, float]:
        """Seconds per pass at every width up to max_window for ``batch`` samples, measured once (cached)."""
        o = self.options
        config = self.step_config(model, o.max_window)
        source = self.draft_source(model, config, batch)
        step = compiled(source.step_fn, device=next(model.parameters()).device.type) if o.compile else source.step_fn
        return pass_costs(model, step, config, self.acceptance(model, codebook), source.step_args,
                          [w for w in WIDTHS if w <= o.max_window], batch=batch, key=self.cost_key(o.compile),
                          fill=source.fill)

    def cost_key(self, compile_: bool, draft=None) -> tuple:
        """What identifies this sampler's pass costs besides the model, machine and batch: its name, eager or
        compiled, every option but the width's, and :meth:`timing_ident`."""
        skip = ("window", "max_window", "costs", "compile")
        settings = {k: v for k, v in dataclasses.asdict(self.options).items() if k not in skip}
        return (self.name, "compiled" if compile_ else "eager", sorted(settings.items()), *self.timing_ident(draft))
