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

import torch

from vgen.errors import VGenError
from vgen.kernels.neighbours import latent_neighbours
from vgen.interfaces import ModelSpec
from vgen.samplers.base import option, register_sampler
from vgen.samplers.speculative import SpeculativeOptions, SpeculativeSampler


@dataclass
class LanternOptions(SpeculativeOptions):
    k: int = option(1000, "latent neighbours per token (clipped to vocab_size - 1)")
    delta: float = option(0.1, "total-variation budget per token (0 = exact SJD)")
    lam: float = option(0.0, "LANTERN++ cap p~(x) <= lam * p(x) (0 = off)")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.k < 1:
            raise VGenError(f"k must be >= 1, got {self.k}")
        if not 0.0 <= self.delta <= 1.0:
            raise VGenError(f"delta must be in [0, 1] (0 = exact SJD), got {self.delta}")
        if self.lam != 0 and self.lam < 1:
            raise VGenError(f"lam must be 0 (off) or >= 1, got {self.lam}")


def lantern_rule(p, q, x, px, qx, nbr, *, delta: float, lam: float):
    cs = p.gather(-1, nbr[x].long()).cumsum(-1)  # (B, W-1, k): mass of the nearest 1, 2, ... neighbours
    ok = cs <= delta
    if lam > 0:
        ok = ok & (cs <= (lam - 1.0) * px[..., None])
    moved = (cs * ok).amax(-1)  # cs is non-decreasing, so ok is a prefix: its last value
    e = torch.minimum(moved, delta * qx)
    return ((px + e) / qx.clamp_min(1e-30)).clamp_max(1.0)


@register_sampler
class LanternSampler(SpeculativeSampler):
    name = "lantern"
    Options = LanternOptions
    needs_codebook = True
    rule = staticmethod(lantern_rule)

    def rule_inputs(self, model, codebook):
        o = self.options
        return (latent_neighbours(codebook, o.k),), dict(delta=o.delta, lam=o.lam)
