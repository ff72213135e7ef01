"""Grouped Speculative Decoding (So et al., ICCV 2025): accept a draft when its *group* of interchangeable
tokens is likely enough. Not lossless: the drift is reported (``nll`` against AR, TV distance in tests).

For a draft x at a window position, the group is the ``group_size`` tokens around x in the target's
probability ranking, kept when |p(y) - p(x)| < ``p_threshold`` and the squared distance between their codebook
vectors is < ``d_threshold``; a(x) = min(1, sum_G p / sum_G q). Defaults follow the paper (the official code
hard-codes a group of 14). vgen never accepts a draft the target gives zero probability.
"""
from __future__ import annotations

from dataclasses import dataclass

from vgen.samplers.base import register_sampler
from vgen.samplers.speculative import JacobiSpecOptions, SpeculativeSampler
from vgen.samplers.speculative.rules import GSDRuleOptions


@dataclass
class GSDOptions(GSDRuleOptions, JacobiSpecOptions):
    """Jacobi drafts' options and GSD's rule's."""


@register_sampler
class GSDSampler(SpeculativeSampler):
    """Jacobi drafts checked by GSD's grouped rule (:class:`~vgen.samplers.speculative.rules.GSDRule`)."""
    name = "gsd"
    Options = GSDOptions
    needs_codebook = True

    def acceptance(self, model, codebook):
        return self.options.gsd_rule(codebook)
