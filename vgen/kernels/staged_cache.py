"""A KV cache that grows stage by stage (the scales of a next-scale model, the frames of a video model), with a
pluggable policy deciding what each layer keeps for later stages.

Every stage's queries attend to the kept cache plus the stage's own keys (``attend``); then the policy may
shrink that layer's cache. Compression therefore only ever affects later stages. The cache does not know the
model family: a model tells it where a stage begins (``begin_stage(index, (h, w), last)``) and hands it
per-layer q, k, v of shape (B, H, S, D).

Bytes are counted the way a cache that writes each stage's keys before compressing would hold them:
``peak_bytes`` is the largest (kept cache + current stage) over stages, summed over layers;
``kept_bytes_per_stage[s]`` is what all layers keep after stage s.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class CachePolicy:
    """Keep everything (the official behaviour)."""

    name = "none"

    def keep(self, layer: int, stage: int, hw: tuple[int, int], q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, scale: float, full_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (B, H, T, D): this layer's kept cache plus the stage just attended; q (B, H, S, D) the stage's
        queries; ``full_len``: tokens the uncompressed cache would hold now. Return what to keep."""
        return k, v


class StagedKVCache:
    def __init__(self, n_layer: int, policy: CachePolicy | None = None, store_last: bool = False):
        self.n_layer = n_layer
        self.policy = policy or CachePolicy()
        self.k: list[torch.Tensor | None] = [None] * n_layer
        self.v: list[torch.Tensor | None] = [None] * n_layer
        self.stage, self.hw, self.last = -1, (0, 0), False
        self.full_len = 0  # tokens of every stage so far (what the uncompressed cache holds)
        self.store_last = store_last  # keep the final stage's keys (nothing reads them; off saves memory)
        self.peak_bytes = 0
        self.kept_bytes_per_stage: list[int] = []
        self._stage_bytes = 0

    def begin_stage(self, stage: int, hw: tuple[int, int], last: bool = False) -> None:
        self.stage, self.hw, self.last = stage, tuple(hw), last
        self.full_len += hw[0] * hw[1]
        self._stage_bytes = 0

    def end_stage(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self._stage_bytes)
        self.kept_bytes_per_stage.append(self.nbytes)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q, k, v (B, H, S, D) of the current stage -> attention output (B, H, S, D) over kept cache + stage."""
        if self.k[layer] is not None:
            k = torch.cat([self.k[layer], k], dim=2)
            v = torch.cat([self.v[layer], v], dim=2)
        self._stage_bytes += 2 * k.numel() * k.element_size()
        out = F.scaled_dot_product_attention(q, k, v, scale=scale)
        if self.last and not self.store_last:
            self.k[layer] = self.v[layer] = None
        else:
            self.k[layer], self.v[layer] = self.policy.keep(layer, self.stage, self.hw, q, k, v, scale,
                                                                self.full_len)
        return out
