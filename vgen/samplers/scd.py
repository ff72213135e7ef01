"""Speculative Coupled Decoding (So et al., ICML 2026): SJD whose drafts, between Jacobi iterations, keep their
token unless the target's distribution really moved. Lossless; training-free.

Two couplings of a position's successive drafts (``coupling``):

* ``gumbel`` (SCD-GS, the default): every draw at token position t, in any pass, is argmax(log p + g_t) with one
  Gumbel vector g_t fixed per (seed, t) (:mod:`vgen.kernels.gumbel`). A draft passes when it equals the target's
  own draw there, so the emitted tokens are, by construction, the tokens of ``ar`` with ``draw="gumbel"`` for the
  same seed and settings: identical output (up to float rounding of the logits), at any window, init or batch.
* ``maximal`` (SCD-MC): SJD's verification (accept with min(1, p/q), correct from norm(max(0, p - q))); after a
  rejection each later draft x is kept with probability min(1, p_new(x) / p_old(x)), else redrawn from
  norm(max(0, p_new - p_old)). Exact in distribution (tests: ``pytest -k "scd and exact"``).

Everything else is the speculative core's (window, init, continuous batching, per-sample seeds, step maps), except
how ``window=auto`` chooses: a coupled draft's acceptance grows with the passes it has stayed in the window (it is
redrawn only where p moved), so the acceptance of narrow passes says little about wide ones, and a per-pass choice
from it stays narrow. ``scd`` therefore picks one width for the whole job: the most tokens per second from the
measured pass costs and tokens per pass at each fixed width, calibrated once per model and settings on samples of
its own (``pass_tokens``), then that width timed whole against AR's loop (the timed rule's paired rounds); where
none beats a plain step, or the timed width does not beat AR's loop, it runs AR's loop (with the Gumbel draw).

``sjd``, ``gsd`` and ``lantern`` take ``coupling=maximal`` too; Gumbel coupling needs equality checks, which their
relaxed rules are not.
"""
from __future__ import annotations

from dataclasses import dataclass

from vgen.samplers.base import option, register_sampler
from vgen.samplers.speculative import JacobiSpecOptions, SpeculativeSampler
from vgen.samplers.speculative.jacobi import COUPLINGS


@dataclass
class SCDOptions(JacobiSpecOptions):
    coupling: str = option("gumbel", "gumbel (drafts and target share each position's Gumbel noise: the output is "
                           "ar's with draw=gumbel) or maximal (SJD with maximally coupled redraws)", choices=COUPLINGS)
    couplings = ("gumbel", "maximal")
    max_window: int = option(16, "window=auto: the widest pass it may choose (coupled drafts keep converging at "
                             "wide windows)")


@register_sampler
class SCDSampler(SpeculativeSampler):
    """Jacobi drafts with coupled redraws; the exact token rule for ``coupling=maximal`` (``gumbel`` checks drafts
    by equality)."""
    name = "scd"
    Options = SCDOptions
    width_rule = "job"  # coupled drafts gain with the passes they stay in a wide window: one width per job
