"""Speculative decoding, one package: a draft source proposes tokens, the target checks them all in one forward pass
with an acceptance rule, and a slot scheduler keeps every sample moving at its own pace.

* :mod:`~vgen.samplers.speculative.sampler`: :class:`SpeculativeSampler`, the three parts put together, and the one
  ``window=auto`` path every speculative sampler takes;
* :mod:`~vgen.samplers.speculative.scheduler`: the slots (continuous batching, prefixes, progress, step maps,
  per-pass histograms) that run a draft source's passes;
* :mod:`~vgen.samplers.speculative.step`: the one step every pass runs (target pass, verify, write, draft, advance)
  and the hooks a draft source fills in (:class:`~vgen.samplers.speculative.step.PassHooks`; a chain's defaults in
  :class:`~vgen.samplers.speculative.step.Chain`);
* draft sources: :mod:`~vgen.samplers.speculative.jacobi` (the model drafting for itself: Jacobi iteration, its
  inits and couplings), :mod:`~vgen.samplers.speculative.head` (a trained draft head's chain and tree),
  :mod:`~vgen.samplers.speculative.pac` (proactive draft trees) and :mod:`~vgen.samplers.speculative.model` (a draft
  model's chain, e.g. the target's own int4 copy);
* :mod:`~vgen.samplers.speculative.rules`: acceptance rules (exact token by token, block, LANTERN, GSD), each with
  its own options and validation, on the one vectorised verification core (:func:`vgen.kernels.verify.verify`);
* ``window=auto``: :mod:`~vgen.samplers.speculative.widths` (timed widths, per-pass and per-job rules),
  :mod:`~vgen.samplers.speculative.prior` (small jobs) and :mod:`~vgen.samplers.speculative.tables` (pass costs and
  tokens per pass, measured and cached on disk).

A draft source and a rule meet only through :class:`~vgen.samplers.speculative.scheduler.DraftSource`,
:class:`~vgen.samplers.speculative.rules.AcceptanceRule` and the frozen
:class:`~vgen.samplers.speculative.step.StepConfig`. The samplers (``sjd``, ``scd``, ``gsd``, ``lantern``,
``eagle``, ``pac``, ``sps``) are compositions in their own files under :mod:`vgen.samplers`.
"""
from vgen.samplers.speculative.sampler import JacobiSpecOptions, SpeculativeOptions, SpeculativeSampler

__all__ = ["JacobiSpecOptions", "SpeculativeOptions", "SpeculativeSampler"]
