"""The embedded photo dataset: class-conditional crops of real photographs bundled with
scikit-image and scikit-learn.

Every class is one photograph. The right-most quarter of each photo is reserved for the test split;
training crops never touch it. Crops are square, of random side (random scale), resized to
``size`` x ``size`` with antialiasing and randomly flipped left-right. Grey photos become 3 channels.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from vgen.errors import VGenError

# (class name, loader) in a fixed order: the class id is the index.
_SKIMAGE = [
    ("astronaut", "astronaut"),
    ("brick", "brick"),
    ("camera", "camera"),
    ("cat", "chelsea"),
    ("coffee", "coffee"),
    ("coins", "coins"),
    ("grass", "grass"),
    ("gravel", "gravel"),
    ("hubble", "hubble_deep_field"),
    ("tissue", "immunohistochemistry"),
    ("moon", "moon"),
    ("motorcycle", "stereo_motorcycle"),
    ("retina", "retina"),
    ("rocket", "rocket"),
]
_SKLEARN = [("china", "china.jpg"), ("flower", "flower.jpg")]

CLASS_NAMES: tuple[str, ...] = tuple(n for n, _ in _SKIMAGE) + tuple(n for n, _ in _SKLEARN)
NUM_CLASSES = len(CLASS_NAMES)
TEST_FRACTION = 0.25  # right-most part of each photo, never used for training


class Photos(NamedTuple):
    images: torch.Tensor  # uint8 (N, 3, size, size)
    labels: torch.Tensor  # int64 (N,)


@functools.lru_cache(maxsize=1)
def load_photographs() -> tuple[np.ndarray, ...]:
    """The full photographs as uint8 (H, W, 3) arrays, in class order."""
    import skimage.data
    from sklearn.datasets import load_sample_image

    out = []
    for _, name in _SKIMAGE:
        img = getattr(skimage.data, name)()
        if isinstance(img, tuple):  # stereo_motorcycle -> (left, right, disparity)
            img = img[0]
        out.append(_to_rgb(img))
    for _, name in _SKLEARN:
        out.append(_to_rgb(load_sample_image(name)))
    return tuple(out)


def _to_rgb(img: np.ndarray) -> np.ndarray:
    img = np.asarray(img)
    if img.dtype != np.uint8:
        img = (255 * (img.astype(np.float64) / max(float(img.max()), 1e-8))).astype(np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=-1)
    return np.ascontiguousarray(img[..., :3])


def region(img: np.ndarray, split: str) -> np.ndarray:
    """The part of a photograph a split may use: the left three quarters (train) or the right quarter (test)."""
    w = img.shape[1]
    cut = int(round(w * (1 - TEST_FRACTION)))
    return img[:, :cut] if split == "train" else img[:, cut:]


class CropBox(NamedTuple):
    """Where one crop of :func:`photos` came from, in the split's region of its photograph (:func:`region`):
    the square rows ``[y, y + side)`` and columns ``[x, x + side)`` before any flip, the region's size, and
    whether the crop was then flipped left-right."""
    label: int
    y: int
    x: int
    side: int
    flipped: bool
    region_h: int
    region_w: int


def photos(split: str = "train", n: int = 64, seed: int = 0, size: int = 64,
           classes: list[int] | None = None, min_side: int | None = None,
           max_side: int = 192) -> Photos:
    """Sample ``n`` crops. Sample i has class ``classes[i % len(classes)]`` (all classes by default).

    Deterministic in (split, n, seed, size): the same call always returns the same bytes.
    """
    return photos_with_boxes(split, n, seed, size, classes, min_side, max_side)[0]


def photos_with_boxes(split: str = "train", n: int = 64, seed: int = 0, size: int = 64,
                      classes: list[int] | None = None, min_side: int | None = None,
                      max_side: int = 192) -> tuple[Photos, tuple[CropBox, ...]]:
    """:func:`photos` (the same bytes for the same arguments) and, per crop, the :class:`CropBox` it was cut from."""
    if split not in ("train", "test"):
        raise VGenError(f"unknown split {split!r}: use 'train' or 'test'")
    if n < 0:
        raise VGenError(f"n must be >= 0, got {n}")
    classes = list(range(NUM_CLASSES)) if classes is None else list(classes)
    for c in classes:
        if not 0 <= c < NUM_CLASSES:
            raise VGenError(f"class id {c} out of range: the photo dataset has classes 0..{NUM_CLASSES - 1}")
    min_side = size if min_side is None else min_side
    regions = [region(p, split) for p in load_photographs()]
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    images = torch.empty((n, 3, size, size), dtype=torch.uint8)
    labels = torch.empty((n,), dtype=torch.int64)
    boxes = []
    for i in range(n):
        c = classes[i % len(classes)]
        reg = regions[c]
        h, w = reg.shape[:2]
        hi = max(min(max_side, h, w), min_side)
        side = int(rng.integers(min(min_side, h, w), min(hi, h, w) + 1))
        y = int(rng.integers(0, h - side + 1))
        x = int(rng.integers(0, w - side + 1))
        crop = torch.from_numpy(np.ascontiguousarray(reg[y:y + side, x:x + side])).permute(2, 0, 1)
        if side != size:
            crop = F.interpolate(crop[None].float(), size=(size, size), mode="bilinear",
                                 antialias=True, align_corners=False)[0]
            crop = crop.round().clamp(0, 255).to(torch.uint8)
        flipped = bool(rng.random() < 0.5)
        if flipped:
            crop = crop.flip(-1)
        images[i] = crop
        labels[i] = c
        boxes.append(CropBox(c, y, x, side, flipped, h, w))
    return Photos(images, labels), tuple(boxes)


def to_model_range(images: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float [-1, 1]."""
    return images.float().div(127.5).sub(1.0)


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """float [-1, 1] (unclamped) -> uint8, the LlamaGen FID sampler's mapping."""
    return torch.clamp(127.5 * x + 128.0, 0, 255).to(torch.uint8)
