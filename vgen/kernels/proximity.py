"""Next-neighbour order (NAR): the anti-diagonals of a token grid and the proximity attention mask.

A token grid has a shape: ``(h, w)`` for an image, ``(t, h, w)`` for a video. Token (r, c) sits on
anti-diagonal r + c (its Manhattan distance from the first token; t + r + c for video). Next-neighbour
decoding generates one anti-diagonal per forward pass, so an h x w grid takes h + w - 1 passes and a
t x h x w grid t + h + w - 2. During training and decoding a token attends to the condition and to every
token on its own or an earlier anti-diagonal (never to a later one), which is what makes all tokens of
one diagonal predictable from the diagonals before it.

Each head of a NAR model predicts one neighbour: the head at token ``p`` predicts token ``p + offset``
(right ``(0, 1)``, down ``(1, 0)``, next frame ``(1, 0, 0)``). A token that several heads reach gets the
mean of their logits.

Tokens are stored in raster (C) order everywhere (index r * w + c, or (t * h + r) * w + c); these helpers
only say which raster indices form each diagonal, who may see whom, and which head reaches which token.
Every function takes the grid shape as a tuple.
"""
from __future__ import annotations

import functools
import math

import torch


def _shape(shape) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"a token grid shape is a tuple of positive sizes, like (16, 16), got {shape}")
    return shape


def coordinates(shape) -> torch.Tensor:
    """(n, len(shape)) grid coordinates of every raster position."""
    shape = _shape(shape)
    axes = torch.meshgrid(*[torch.arange(s) for s in shape], indexing="ij")
    return torch.stack([a.reshape(-1) for a in axes], dim=1)


def diagonal_index(shape) -> torch.Tensor:
    """(n,) anti-diagonal (sum of coordinates) of every raster position."""
    return coordinates(shape).sum(1)


def num_diagonals(shape) -> int:
    """How many anti-diagonals (= NAR forward passes): sum(shape) - len(shape) + 1."""
    shape = _shape(shape)
    return sum(shape) - len(shape) + 1


@functools.cache
def anti_diagonals(shape) -> tuple[torch.Tensor, ...]:
    """One LongTensor per anti-diagonal: its raster indices in ascending raster order (for an image: top row
    first), the order NAR feeds them to the model."""
    d = diagonal_index(shape)
    return tuple(torch.nonzero(d == k).view(-1) for k in range(num_diagonals(shape)))


def proximity_mask(shape, cond_len: int = 1) -> torch.Tensor:
    """(cond_len + n)^2 bool, True = may attend. Condition positions are causal among themselves; every
    grid token sees all condition positions and the tokens on its own and earlier anti-diagonals."""
    shape = _shape(shape)
    n = math.prod(shape)
    m = torch.ones(cond_len + n, cond_len + n, dtype=torch.bool).tril()
    d = diagonal_index(shape)
    m[cond_len:, cond_len:] = d[None, :] <= d[:, None]
    return m


def _check_offsets(shape, offsets) -> tuple[tuple[int, ...], ...]:
    offsets = tuple(tuple(int(x) for x in o) for o in offsets)
    for o in offsets:
        if len(o) != len(shape):
            raise ValueError(f"head offset {o} has {len(o)} dimensions but the token grid {shape} has {len(shape)}")
        if sorted(o) != [0] * (len(o) - 1) + [1]:
            raise ValueError(f"a next-neighbour head must reach the next anti-diagonal (one step along one axis), "
                             f"got offset {o}")
    return offsets


def _raster(coord, shape) -> int:
    idx = 0
    for c, s in zip(coord, shape):
        idx = idx * s + c
    return idx


@functools.cache
def neighbour_sources(shape, d: int, offsets) -> tuple[torch.Tensor, ...]:
    """For the tokens of diagonal ``d + 1`` (raster order): per head offset, the position within diagonal
    ``d`` of the token whose head reaches each target, or -1 where that source lies outside the grid.
    Cached: the sampler asks for the same (grid, diagonal) tables on every image."""
    shape = _shape(shape)
    offsets = _check_offsets(shape, offsets)
    diags = anti_diagonals(shape)
    where = {int(t): i for i, t in enumerate(diags[d])}
    coords = coordinates(shape)
    out = []
    for off in offsets:
        src = []
        for t in diags[d + 1].tolist():
            s = [c - o for c, o in zip(coords[t].tolist(), off)]
            inside = all(0 <= c < n for c, n in zip(s, shape))
            src.append(where[_raster(s, shape)] if inside else -1)
        out.append(torch.tensor(src, dtype=torch.long))
    return tuple(out)


@functools.cache
def grid_sources(shape, offsets) -> tuple[torch.Tensor, ...]:
    """For every grid token (raster order): per head offset, the raster index of the token whose head
    reaches it, or -1 where none does (the first token is reached by no head: it comes from the condition)."""
    shape = _shape(shape)
    offsets = _check_offsets(shape, offsets)
    coords = coordinates(shape)
    strides = torch.tensor([math.prod(shape[i + 1:]) for i in range(len(shape))])
    out = []
    for off in offsets:
        src = coords - torch.tensor(off)
        inside = (src >= 0).all(1)
        out.append(torch.where(inside, (src * strides).sum(1), torch.full_like(inside, -1, dtype=torch.long)))
    return tuple(out)


def average_heads(head_logits, sources) -> torch.Tensor:
    """Per head (B, S, V) logits at the source tokens and, per head, the source index of every target
    (T,) (-1 = that head does not reach it) -> (B, T, V): the mean over the heads that reach each target.
    Every target must be reached by at least one head."""
    total, count = None, None
    for logits, src in zip(head_logits, sources):
        ok = (src >= 0).to(logits.dtype)
        part = logits[:, src.clamp_min(0)] * ok[None, :, None]
        total = part if total is None else total + part
        count = ok if count is None else count + ok
    return total / count[None, :, None]
