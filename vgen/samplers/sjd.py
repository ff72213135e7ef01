"""Speculative Jacobi Decoding (Teng et al., ICLR 2025): lossless, training-free parallel decoding.

Each pass verifies a window of drafts against the target with the standard speculative rule
a(x) = min(1, p(x) / q(x)); rejected positions are corrected from norm(max(0, p - q)), so every emitted
token has exactly the AR sampler's distribution. Differences from the official code: any batch size with
ragged per-sample progress, random drafts from the image vocabulary, working ``horizontal`` and the paper's
``vertical`` initialisation, and (by default) verification of random/sampled drafts against the
distribution they were really drawn from (``fresh_q=onehot`` gives the official behaviour).
"""
from __future__ import annotations

from vgen.samplers.base import register_sampler
from vgen.samplers.speculative import JacobiSpecOptions, SpeculativeSampler


@register_sampler
class SJDSampler(SpeculativeSampler):
    """Jacobi drafts (:class:`~vgen.samplers.speculative.jacobi.JacobiDrafts`), the exact token rule
    (:class:`~vgen.samplers.speculative.rules.TokenRule`)."""
    name = "sjd"
    Options = JacobiSpecOptions
