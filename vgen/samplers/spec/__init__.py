"""The parts every speculative sampler is made of (:mod:`vgen.samplers.speculative` puts them together):

* :mod:`~vgen.samplers.spec.rules`: acceptance rules (exact token by token, block, LANTERN, GSD), each with its own
  options and validation, on the one vectorised verification core (:func:`vgen.kernels.verify.verify`);
* :mod:`~vgen.samplers.spec.jacobi`: the model drafting for itself (Jacobi iteration: its inits and couplings);
  a trained draft head's chain and tree live with their sampler (:mod:`vgen.samplers.eagle`);
* :mod:`~vgen.samplers.spec.scheduler`: the slots (continuous batching, prefixes, progress, step maps) that run a
  draft source's passes;
* :mod:`~vgen.samplers.spec.widths`: ``window=auto`` (pass costs, timed widths, calibrations cached on disk).

A draft source and a rule meet only through :class:`~vgen.samplers.spec.scheduler.DraftSource`,
:class:`~vgen.samplers.spec.rules.AcceptanceRule` and the frozen :class:`~vgen.samplers.spec.scheduler.StepConfig`.
"""
