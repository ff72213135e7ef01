"""Acceptance rules: given the target p and draft distribution q at a window's positions and the drafts x, each
rule gives every draft an acceptance probability a(x) (:class:`AcceptanceRule`); :func:`vgen.kernels.verify.verify`
runs any of them, vectorised over the batch, and forces a = 0 where p(x) = 0 (a token outside the target's top-k /
top-p support is never emitted) and past the end of the image.

* :class:`TokenRule`: a = min(1, p(x) / q(x)), draft by draft (SJD's and speculative sampling's): lossless.
* :class:`BlockRule`: block verification (Sun et al., ICLR 2025) of a chain drawn draft by draft, each given the ones
  before it (a draft head's): lossless, never fewer drafts kept in expectation than :class:`TokenRule`.
* :class:`LanternRule`: p(x) plus nearby-token mass in the numerator, bounded so the per-token total-variation drift
  is at most ``delta`` (LANTERN, Jang et al., ICLR 2025; ``lam``: the LANTERN++ cap).
* :class:`GSDRule`: sums of p and q over a group of similar tokens (Grouped Speculative Decoding, So et al., ICCV
  2025): not lossless, drift reported.

A rule's options are a small dataclass mixin (:class:`LanternRuleOptions`, :class:`GSDRuleOptions`) that any
sampler's options can take in, with its own validation and a ``rule(codebook)`` builder.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec
from vgen.kernels.neighbours import latent_neighbours
from vgen.samplers.base import Options, option


class AcceptanceRule(Protocol):
    """``rule(p, q, x, px, qx) -> a`` on (B, W-1, V) targets p and draft distributions q, drafts x (B, W-1) with
    px = p(x), qx = q(x). ``block``: the verification core checks the chain jointly instead (the rule's ``__call__``
    is then not used)."""
    block: bool

    def __call__(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, px: torch.Tensor,
                 qx: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class TokenRule:
    """Speculative sampling's rule, a = min(1, p(x) / q(x)): every emitted token has the target's distribution."""
    block: ClassVar[bool] = False

    def __call__(self, p, q, x, px, qx):
        return (px / qx.clamp_min(1e-30)).clamp_max(1.0)


@dataclass(frozen=True)
class BlockRule(TokenRule):
    """Block verification (:func:`vgen.kernels.verify.block_accepts`): the exact rule for a chain of drafts."""
    block: ClassVar[bool] = True


@dataclass(frozen=True, eq=False)
class LanternRule:
    """a(x) = min(1, (p(x) + e(x)) / q(x)) with e(x) the target mass of x's nearest codebook neighbours (``nbr``
    (V, k), nearest first), taken while their total stays <= ``delta`` (and, with ``lam`` > 0, <= (lam - 1) p(x)),
    capped at delta * q(x). The cap bounds the drift for any draft distribution: the output distribution of every
    decided token is within total variation ``delta`` of the target's (sum_x q(x) e(x) / q(x) <= delta); a
    zero-probability token is never accepted."""
    nbr: torch.Tensor
    delta: float
    lam: float = 0.0
    block: ClassVar[bool] = False

    def __call__(self, p, q, x, px, qx):
        cs = p.gather(-1, self.nbr[x].long()).cumsum(-1)  # (B, W-1, k): mass of the nearest 1, 2, ... neighbours
        ok = cs <= self.delta
        if self.lam > 0:
            ok = ok & (cs <= (self.lam - 1.0) * px[..., None])
        moved = (cs * ok).amax(-1)  # cs is non-decreasing, so ok is a prefix: its last value
        e = torch.minimum(moved, self.delta * qx)
        return ((px + e) / qx.clamp_min(1e-30)).clamp_max(1.0)


@dataclass(frozen=True, eq=False)
class GSDRule:
    """For a draft x the group is the ``group_size`` tokens around x in the target's probability ranking, kept when
    |p(y) - p(x)| < ``p_threshold`` and the squared distance between their codebook vectors (``emb`` (V, d)) is <
    ``d_threshold``; a(x) = min(1, sum_G p / sum_G q), x itself always in its group."""
    emb: torch.Tensor
    group_size: int
    p_threshold: float
    d_threshold: float
    block: ClassVar[bool] = False

    def __call__(self, p, q, x, px, qx):
        V = p.shape[-1]
        G = min(self.group_size, V)
        rank = (p > px[..., None]).sum(-1)  # 0 = the most likely token
        order = torch.sort(p, dim=-1, descending=True).indices
        start = (rank - G // 2).clamp(0, V - G)
        group = order.gather(-1, start[..., None] + torch.arange(G, device=p.device))  # (B, W-1, G) token ids
        pg, qg = p.gather(-1, group), q.gather(-1, group)
        d = (self.emb[group] - self.emb[x][..., None, :]).pow(2).sum(-1)
        keep = ((pg - px[..., None]).abs() < self.p_threshold) & (d < self.d_threshold) & (group != x[..., None])
        num = px + (pg * keep).sum(-1)  # x itself always counts, once
        den = qx + (qg * keep).sum(-1)
        return (num / den.clamp_min(1e-30)).clamp_max(1.0)


@dataclass
class LanternRuleOptions(Options):
    """LANTERN's options (:class:`LanternRule`)."""
    k: int = option(1000, "latent neighbours per token (clipped to vocab_size - 1)")
    delta: float = option(0.1, "total-variation budget per token (0 = exact)")
    lam: float = option(0.0, "LANTERN++ cap p~(x) <= lam * p(x) (0 = off)")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.k < 1:
            raise VGenError(f"k must be >= 1, got {self.k}")
        if not 0.0 <= self.delta <= 1.0:
            raise VGenError(f"delta must be in [0, 1] (0 = exact), got {self.delta}")
        if self.lam != 0 and self.lam < 1:
            raise VGenError(f"lam must be 0 (off) or >= 1, got {self.lam}")

    def lantern_rule(self, codebook: torch.Tensor) -> LanternRule:
        """The rule, its neighbour table from ``codebook`` (V, d) (computed once per codebook and cached)."""
        return LanternRule(latent_neighbours(codebook, self.k), self.delta, self.lam)


@dataclass
class GSDRuleOptions(Options):
    """GSD's options (:class:`GSDRule`; the paper's defaults; the official code hard-codes a group of 14)."""
    group_size: int = option(25, "tokens around the draft in the target's ranking (1 = exact)")
    p_threshold: float = option(0.15, "keep group members with |p(y) - p(x)| below this")
    d_threshold: float = option(0.5, "... and squared codebook distance to the draft below this")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.group_size < 1:
            raise VGenError(f"group_size must be >= 1 (1 = exact), got {self.group_size}")
        if self.p_threshold < 0 or self.d_threshold < 0:
            raise VGenError("p_threshold and d_threshold must be >= 0")

    def gsd_rule(self, codebook: torch.Tensor) -> GSDRule:
        return GSDRule(codebook.float(), self.group_size, self.p_threshold, self.d_threshold)
