"""The embedded video dataset: class-conditional clips made from the bundled photographs by camera motion.

Every class is one photograph (the classes of :mod:`vgen.data.photos`). A clip is a virtual camera moving over
its photograph: a still shot, a pan (one of 8 directions, 1 or 2 output pixels per frame), a zoom in or a zoom
out (the field of view shrinks or grows by a fixed factor per frame). The motion and its parameters are drawn at
random per clip, so a model conditioned on the class alone has to invent a coherent motion itself.

The test split is cut from the same right-most quarter of each photograph that ``photos`` keeps for testing:
training clips never see it. Frames are crops resized to ``size`` x ``size`` with antialiasing; a clip is
flipped left-right as a whole half of the time. uint8 ``(N, T, 3, size, size)``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from vgen.data.photos import NUM_CLASSES, load_photographs, region
from vgen.errors import VGenError

MOTIONS = ("still", "pan", "zoom-in", "zoom-out")
PAN_DIRECTIONS = tuple((dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0))
PAN_SPEEDS = (1, 2)      # output pixels per frame
ZOOM_RATE = 1.04         # field-of-view change per frame (zoom-in divides the side by it, zoom-out multiplies)


class Clips(NamedTuple):
    videos: torch.Tensor   # uint8 (N, T, 3, size, size)
    labels: torch.Tensor   # int64 (N,)
    motions: tuple[str, ...]  # per clip: still | pan | zoom-in | zoom-out


def _trajectory(rng: np.random.Generator, motion: str, frames: int, side: float, size: int):
    """Per-frame (dy, dx, side) of the crop relative to its start, in source pixels."""
    scale = side / size  # source pixels per output pixel
    t = np.arange(frames, dtype=np.float64)
    if motion == "pan":
        dy, dx = PAN_DIRECTIONS[int(rng.integers(len(PAN_DIRECTIONS)))]
        speed = PAN_SPEEDS[int(rng.integers(len(PAN_SPEEDS)))] * scale
        return t * dy * speed, t * dx * speed, np.full(frames, side)
    if motion in ("zoom-in", "zoom-out"):
        sides = side * ZOOM_RATE ** (-t if motion == "zoom-in" else t)
        off = (side - sides) / 2  # zoom about the centre of the first frame
        return off, off, sides
    return np.zeros(frames), np.zeros(frames), np.full(frames, side)


def _crop(region: np.ndarray, y: float, x: float, side: float, size: int) -> torch.Tensor:
    """An antialiased crop at a sub-pixel box: integer box covering it, then resize and shift by the remainder."""
    y0, x0 = int(math.floor(y)), int(math.floor(x))
    s = int(math.ceil(side + (y - y0))), int(math.ceil(side + (x - x0)))
    patch = torch.from_numpy(np.ascontiguousarray(region[y0:y0 + s[0], x0:x0 + s[1]])).permute(2, 0, 1)[None].float()
    # resize the covering patch so that `side` source pixels map to `size` output pixels, then cut at the offset
    k = size / side
    out_h, out_w = max(size, int(round(patch.shape[2] * k))), max(size, int(round(patch.shape[3] * k)))
    big = F.interpolate(patch, size=(out_h, out_w), mode="bilinear", antialias=True, align_corners=False)
    oy, ox = int(round((y - y0) * k)), int(round((x - x0) * k))
    oy, ox = min(oy, out_h - size), min(ox, out_w - size)
    return big[0, :, oy:oy + size, ox:ox + size].round().clamp(0, 255).to(torch.uint8)


def clips(split: str = "train", n: int = 64, seed: int = 0, frames: int = 8, size: int = 32,
          classes: list[int] | None = None, min_side: int = 40, max_side: int = 64,
          motions: tuple[str, ...] = MOTIONS) -> Clips:
    """Sample ``n`` clips; clip i has class ``classes[i % len(classes)]`` (all classes by default).

    Deterministic in the arguments: the same call always returns the same bytes. ``min_side``/``max_side``
    bound the first frame's field of view in source pixels (the photographs' test regions are at least 96
    pixels wide, which bounds how far a clip may travel)."""
    if split not in ("train", "test"):
        raise VGenError(f"unknown split {split!r}: use 'train' or 'test'")
    if n < 0:
        raise VGenError(f"n must be >= 0, got {n}")
    if frames < 1:
        raise VGenError(f"frames must be >= 1, got {frames}")
    if size < 8:
        raise VGenError(f"size must be >= 8 pixels, got {size}")
    if not 8 <= min_side <= max_side:
        raise VGenError(f"need 8 <= min_side <= max_side, got {min_side}, {max_side}")
    bad = [m for m in motions if m not in MOTIONS]
    if bad or not motions:
        what = f"unknown motion {bad[0]!r}" if bad else "no motion given"
        raise VGenError(f"{what}: choose from {', '.join(MOTIONS)}")
    classes = list(range(NUM_CLASSES)) if classes is None else list(classes)
    for c in classes:
        if not 0 <= c < NUM_CLASSES:
            raise VGenError(f"class id {c} out of range: the clip dataset has classes 0..{NUM_CLASSES - 1}")
    regions = [region(p, split) for p in load_photographs()]
    rng = np.random.default_rng([seed, 2 if split == "train" else 3])
    videos = torch.empty((n, frames, 3, size, size), dtype=torch.uint8)
    labels = torch.empty((n,), dtype=torch.int64)
    kinds = []
    for i in range(n):
        c = classes[i % len(classes)]
        reg = regions[c]
        h, w = reg.shape[:2]
        motion = motions[int(rng.integers(len(motions)))]
        for _ in range(100):  # draw a field of view and a motion whose whole path fits in the region
            side = float(rng.uniform(min_side, max_side))
            dy, dx, sides = _trajectory(rng, motion, frames, side, size)
            lo_y, hi_y = -dy.min(), h - (dy + sides).max() - 1
            lo_x, hi_x = -dx.min(), w - (dx + sides).max() - 1
            if hi_y >= lo_y and hi_x >= lo_x:
                break
        else:
            raise VGenError(f"clips of this motion do not fit the {split} region of photo {c}: lower max_side")
        y, x = float(rng.uniform(lo_y, hi_y)), float(rng.uniform(lo_x, hi_x))
        flip = rng.random() < 0.5
        for t in range(frames):
            frame = _crop(reg, y + dy[t], x + dx[t], sides[t], size)
            videos[i, t] = frame.flip(-1) if flip else frame
        labels[i] = c
        kinds.append(motion)
    return Clips(videos, labels, tuple(kinds))
