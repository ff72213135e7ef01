"""LANTERN relaxed acceptance (Jang et al., ICLR 2025) on SJD's drafts, training-free.

The numerator of the acceptance ratio gets the target mass of x's latent neighbours (its ``k`` nearest
codebook vectors, nearest first, taken while their total stays <= ``delta``; with ``lam`` > 0 also capped at
p~(x) <= lam * p(x), the LANTERN++ rule): a(x) = min(1, (p(x) + e(x)) / q(x)).

Guarantees that hold for any draft distribution q (one-hot fresh drafts as well as carried-over Jacobi
drafts), which the naive rule lacks:

* never a token outside the target's support: a(x) = 0 when p(x) = 0;
* per-token drift at most ``delta``: the added mass is capped, e(x) <= delta * q(x), so the output
  distribution of every decided token is within total variation ``delta`` of the target's
  (sum_x q(x) e(x)/q(x) <= delta). For a one-hot draft this is exactly LANTERN's rule.

Neighbour tables are computed once per codebook and cached (``vgen.kernels.neighbours``).
"""
from __future__ import annotations

from dataclasses import dataclass

from vgen.samplers.base import register_sampler
from vgen.samplers.speculative import JacobiSpecOptions, SpeculativeSampler
from vgen.samplers.speculative.rules import LanternRuleOptions


@dataclass
class LanternOptions(LanternRuleOptions, JacobiSpecOptions):
    """Jacobi drafts' options and LANTERN's rule's."""


@register_sampler
class LanternSampler(SpeculativeSampler):
    """Jacobi drafts checked by LANTERN's relaxed rule (:class:`~vgen.samplers.speculative.rules.LanternRule`)."""
    name = "lantern"
    Options = LanternOptions
    needs_codebook = True

    def acceptance(self, model, codebook):
        return self.options.lantern_rule(codebook)
