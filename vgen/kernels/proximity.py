"""Next-neighbour order (NAR): the anti-diagonals of a token grid and the proximity attention mask.

Token (r, c) of an h x w grid sits on anti-diagonal r + c (its Manhattan distance from the top-left
token). Next-neighbour decoding generates one anti-diagonal per forward pass, so an h x w grid takes
h + w - 1 passes. During training and decoding a token attends to the condition and to every token on
its own or an earlier anti-diagonal (never to a later one), which is what makes all tokens of one
diagonal predictable from the diagonals before it.

Tokens are stored in raster order (index r * w + c) everywhere; these helpers only say which raster
indices form each diagonal and who may see whom.
"""
from __future__ import annotations

import functools

import torch


def diagonal_index(h: int, w: int) -> torch.Tensor:
    """(h*w,) anti-diagonal of every raster position."""
    r = torch.arange(h).repeat_interleave(w)
    c = torch.arange(w).repeat(h)
    return r + c


@functools.cache
def anti_diagonals(h: int, w: int) -> tuple[torch.Tensor, ...]:
    """h + w - 1 LongTensors: the raster indices on each anti-diagonal, top row first (row ascending),
    the order NAR feeds them to the model."""
    out = []
    for d in range(h + w - 1):
        rows = range(max(0, d - w + 1), min(d, h - 1) + 1)
        out.append(torch.tensor([r * w + (d - r) for r in rows], dtype=torch.long))
    return tuple(out)


def proximity_mask(h: int, w: int, cond_len: int = 1) -> torch.Tensor:
    """(cond_len + h*w)^2 bool, True = may attend. Condition positions are causal among themselves; every
    image token sees all condition positions and the tokens on its own and earlier anti-diagonals."""
    n = h * w
    m = torch.ones(cond_len + n, cond_len + n, dtype=torch.bool).tril()
    d = diagonal_index(h, w)
    m[cond_len:, cond_len:] = d[None, :] <= d[:, None]
    return m


@functools.cache
def neighbour_sources(h: int, w: int, d: int, offsets: tuple[tuple[int, int], ...]) -> tuple[torch.Tensor, ...]:
    """For the tokens of diagonal ``d + 1`` (row ascending): per offset (dr, dc) of a head (the head at token
    (r, c) predicts token (r + dr, c + dc)), the position within diagonal ``d`` of the token whose head
    reaches each target, or -1 where that source lies outside the grid. Offsets must step one diagonal.
    Cached: the sampler asks for the same (grid, diagonal) tables on every image."""
    cur = anti_diagonals(h, w)[d]
    nxt = anti_diagonals(h, w)[d + 1]
    where = {int(t): i for i, t in enumerate(cur)}
    out = []
    for dr, dc in offsets:
        if dr + dc != 1:
            raise ValueError(f"a next-neighbour head must reach the next anti-diagonal, got offset {(dr, dc)}")
        src = []
        for t in nxt.tolist():
            r, c = divmod(t, w)
            sr, sc = r - dr, c - dc
            src.append(where[sr * w + sc] if 0 <= sr < h and 0 <= sc < w else -1)
        out.append(torch.tensor(src, dtype=torch.long))
    return tuple(out)
