"""Grouped Speculative Decoding (So et al., ICCV 2025): accept a draft when its *group* of interchangeable
tokens is likely enough. Not lossless: the drift is reported (``nll`` against AR, TV distance in tests).

For a draft x at a window position, the group is the ``group_size`` tokens around x in the target's
probability ranking, kept when |p(y) - p(x)| < ``p_threshold`` and the squared distance between their codebook
vectors is < ``d_threshold``; a(x) = min(1, sum_G p / sum_G q). Defaults follow the paper (the official code
hard-codes a group of 14). vgen never accepts a draft the target gives zero probability.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec
from vgen.samplers.base import option, register_sampler
from vgen.samplers.speculative import SpeculativeOptions, SpeculativeSampler


@dataclass
class GSDOptions(SpeculativeOptions):
    group_size: int = option(25, "tokens around the draft in the target's ranking (1 = plain SJD)")
    p_threshold: float = option(0.15, "keep group members with |p(y) - p(x)| below this")
    d_threshold: float = option(0.5, "... and squared codebook distance to the draft below this")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.group_size < 1:
            raise VGenError(f"group_size must be >= 1 (1 = plain SJD), got {self.group_size}")
        if self.p_threshold < 0 or self.d_threshold < 0:
            raise VGenError("p_threshold and d_threshold must be >= 0")


def gsd_rule(p, q, x, px, qx, emb, *, group_size: int, p_threshold: float, d_threshold: float):
    V = p.shape[-1]
    G = min(group_size, V)
    rank = (p > px[..., None]).sum(-1)  # 0 = the most likely token
    order = torch.sort(p, dim=-1, descending=True).indices
    start = (rank - G // 2).clamp(0, V - G)
    group = order.gather(-1, start[..., None] + torch.arange(G, device=p.device))  # (B, W-1, G) token ids
    pg, qg = p.gather(-1, group), q.gather(-1, group)
    d = (emb[group] - emb[x][..., None, :]).pow(2).sum(-1)
    keep = ((pg - px[..., None]).abs() < p_threshold) & (d < d_threshold) & (group != x[..., None])
    num = px + (pg * keep).sum(-1)  # x itself always counts, once
    den = qx + (qg * keep).sum(-1)
    return (num / den.clamp_min(1e-30)).clamp_max(1.0)


@register_sampler
class GSDSampler(SpeculativeSampler):
    name = "gsd"
    Options = GSDOptions
    needs_codebook = True
    rule = staticmethod(gsd_rule)

    def rule_inputs(self, model, codebook):
        o = self.options
        return (codebook.float(),), dict(group_size=o.group_size, p_threshold=o.p_threshold,
                                         d_threshold=o.d_threshold)
