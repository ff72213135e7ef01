"""Gumbel-max draws from counter-based noise: the noise of (sample, position, token) is a pure function of the
sample's seed and the two indices, computed where it is needed and never stored.

A draw at token position t is argmax_v(log p(v) + g(seed, t, v)) with g standard Gumbel: a sample from p. Because
g does not depend on when, in which batch or in which pass the draw is made, every draw at one position uses the
same noise: that is what couples the Jacobi drafts of SCD's Gumbel coupling to the AR sampler's own draws
(``ar`` with ``draw="gumbel"``), token for token.

The generator is a keyed integer hash (no state, no sequence). On the host, once per sample: a 64-bit key from
the seed (SplitMix64), then one 32-bit key per token position (:func:`gumbel_keys`, a (B, L) table of int64). Per
(position, token), inside the decode step: one round of a 32-bit mixer on ``key ^ (v * golden)``; the top 23 bits
give a float32 uniform u in (0, 1) (centred in 2^23 cells, so u is never 0 or 1 in float32) and g = -log(-log u).
All arithmetic is int64 holding 32-bit values, and no product reaches 2^63, so nothing overflows on any device or
compiler. Memory: one
(rows, positions, V) tensor for the positions of one pass, not the whole image. The draw itself is written
argmin(p / log u) (= argmax(log p + g), with one log fewer per token, and p = 0 never drawn).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

M32 = 0xFFFFFFFF
_STREAM = 0x47554D42  # separates this noise from every other use of a seed
_GOLDEN = 0x9E3779B1  # odd: v -> v * _GOLDEN mod 2^32 is a bijection (token ids stay distinct inputs)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Wellons' two-multiply mixer, multipliers < 2^31) on int64 tensors of 32-bit values."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & M32
    return x ^ (x >> 15)


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) % 2 ** 64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2 ** 64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2 ** 64
    return z ^ (z >> 31)


def gumbel_keys(seeds: Sequence[int], positions: int, device=None) -> torch.Tensor:
    """(len(seeds), positions) int64: the 32-bit key of every token position of every sample, a function of the
    sample's seed and the position only (batch- and shard-invariant). Made on the host, every sample's at once."""
    z = [_splitmix64((int(s) ^ _STREAM) % 2 ** 64) for s in seeds]
    lo = torch.tensor([k & M32 for k in z], dtype=torch.long).reshape(-1, 1)
    hi = torch.tensor([k >> 32 for k in z], dtype=torch.long).reshape(-1, 1)
    pos = torch.arange(positions, dtype=torch.long)
    return _mix((_mix(pos ^ lo) + hi) & M32).to(device)


def _log_uniforms(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """log u (*keys.shape, vocab) float32, u uniform in (0, 1), for position keys ``keys``."""
    v = torch.arange(vocab, device=keys.device, dtype=torch.long)
    if keys.device.type != "cpu":  # + 0 read from the keys: inductor's Triton code would otherwise fold v * _GOLDEN
        v = v + (keys[..., None] & 0)  # into an int32 index expression, where _GOLDEN (> 2^31) does not fit
    h = _mix(((v * _GOLDEN) & M32) ^ keys[..., None])
    return ((h >> 9).to(torch.float32) * (1.0 / 2 ** 23) + (0.5 / 2 ** 23)).log()  # u <= 1 - 2^-24 < 1 in fp32


def gumbel_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise (*keys.shape, vocab) float32 at the positions whose keys are ``keys``."""
    return -torch.log(-_log_uniforms(keys, vocab))


def gumbel_draw(probs: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """argmax(log p + g) = argmin(p / log u): probs (B, ..., V) at the positions whose keys are ``keys`` (B, ...)
    -> token ids (B, ...). A token with p = 0 (outside top-k / top-p) is never drawn."""
    return (probs / _log_uniforms(keys, probs.shape[-1])).argmin(-1)
