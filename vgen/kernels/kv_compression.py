"""KV-cache compression for models whose cache grows stage by stage (ScaleKV and its uniform baseline), and
the calibration that picks each layer's budget.

Budget: after stage s the full cache holds T_s tokens per layer (all stages so far). A policy with budget b
keeps, for later stages, about ``w[s][l] * b * T_s`` tokens in layer l (per head), where the layer weights
``w[s]`` average 1: the kept cache is b of the full one at every stage. ``uniform`` sets every weight to 1;
``scalekv`` uses calibrated weights (drafter layers, whose attention spreads over earlier stages, get more;
refiner layers, which look at the current map, get less).

Which tokens: after a stage has attended to the whole cache, an observation window (a uniform grid of at most
4x4 query positions on the current map) scores every cached key by the attention it receives (softmax
probabilities summed over the window's queries); the scores are max-pooled along the sequence (kernel 5) and
each head keeps its top tokens, the window positions themselves always included when the budget allows.

Calibration (the ScaleKV authors did not publish theirs; this is vgen's): run the model on a few samples with
the full cache and measure, per layer and stage, the attention mass the stage's queries put on earlier stages
(``prefix_mass``) and how spread that mass is (``spread``: the perplexity of the attention over earlier tokens
divided by their number). A layer's demand is prefix_mass * spread. Per stage the layers are split in two by
1-D 2-means on log-demand: drafters (high) and refiners (low); drafters get ``ratio`` times the refiners'
budget, ratio = the groups' demand ratio clipped to [1, min(max_ratio, 1/b)], with the average fixed at 1.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from vgen.errors import VGenError
from vgen.kernels.staged_cache import CachePolicy

FORMAT = "vgen-scalekv/1"


def window_positions(h: int, w: int, grid: int = 4) -> torch.Tensor:
    """Flat indices of a uniform grid of at most grid x grid query positions on an h x w map (all positions
    of maps smaller than the grid)."""
    gy, gx = min(grid, h), min(grid, w)
    ys = [int((i + 0.5) * h / gy) for i in range(gy)]
    xs = [int((j + 0.5) * w / gx) for j in range(gx)]
    return torch.tensor([y * w + x for y in ys for x in xs], dtype=torch.long)


class WindowCompression(CachePolicy):
    """Keep, per layer and head, the cached tokens the observation window attends to most."""

    def __init__(self, budget: float, weights: list[list[float]] | None = None, n_layer: int = 0,
                 kernel: int = 5, grid: int = 4, name: str = "window"):
        self.budget, self.kernel, self.grid, self.name = budget, kernel, grid, name
        self.weights = weights  # weights[s][l]: layer l's share after stage s (None: all 1)
        self.n_layer = n_layer
        self._caps: dict[tuple[int, int], list[float]] = {}

    def capacity(self, stage: int, layer: int, total: int) -> int:
        if self.weights is None:
            return max(1, min(total, round(self.budget * total)))
        key = (stage, total)
        if key not in self._caps:
            w = self.weights[min(stage, len(self.weights) - 1)]
            self._caps[key] = [max(1, round(c)) for c in water_fill(w, self.budget * total, total)]
        return self._caps[key][layer]

    def keep(self, layer, stage, hw, q, k, v, scale, full_len):
        T = k.shape[2]
        cap = self.capacity(stage, layer, full_len)
        if cap >= T:
            return k, v
        S = hw[0] * hw[1]
        win = window_positions(hw[0], hw[1], self.grid).to(q.device)
        att = torch.softmax((q[:, :, win] @ k.transpose(-1, -2)).float() * scale, dim=-1)  # (B, H, nw, T)
        score = att.sum(2)
        pooled = F.max_pool1d(score, self.kernel, stride=1, padding=self.kernel // 2) if self.kernel > 1 else score
        if cap > win.numel():
            pooled = pooled.index_fill(-1, T - S + win, float("inf"))  # the window itself is always kept
        idx = pooled.topk(cap, dim=-1).indices.sort(-1).values  # keep the original order
        gi = idx[..., None].expand(-1, -1, -1, k.shape[-1])
        return k.gather(2, gi), v.gather(2, gi)


def water_fill(weights: list[float], mean: float, cap: float) -> list[float]:
    """Per-layer capacities proportional to ``weights`` with the given mean, none above ``cap``: what a clipped
    layer cannot hold goes to the others in proportion to their weights, so the total budget is kept (a
    calibration made for one budget serves another)."""
    n = len(weights)
    total = min(mean * n, cap * n)
    out = [0.0] * n
    free = list(range(n))
    while free:
        wsum = sum(weights[i] for i in free)
        left = total - sum(out[i] for i in range(n) if i not in free)
        share = {i: left * weights[i] / wsum if wsum > 0 else left / len(free) for i in free}
        over = [i for i in free if share[i] > cap]
        if not over:
            for i in free:
                out[i] = share[i]
            break
        for i in over:
            out[i] = cap
        free = [i for i in free if i not in over]
    return out


def make_policy(kind: str, budget: float, patch_nums, n_layer: int, calibration: str | None = None):
    if kind == "none":
        return None
    if kind == "uniform":
        return WindowCompression(budget, None, n_layer, name="uniform")
    if kind == "scalekv":
        cal = load_calibration(calibration, patch_nums, n_layer)
        return WindowCompression(budget, cal["weights"], n_layer, name="scalekv")
    raise VGenError(f"unknown kv_compression {kind!r}: use none, scalekv or uniform")


def load_calibration(path, patch_nums=None, n_layer: int | None = None) -> dict:
    p = Path(path)
    if not p.exists():
        raise VGenError(f"ScaleKV calibration {p} not found: write one with `vgen scalekv calibrate model=<model> "
                        "budget=0.1 out=<file>`")
    from vgen.io import read_json
    cal = read_json(p, "ScaleKV calibration", "write one with `vgen scalekv calibrate model=<model> budget=0.1 "
                    "out=<file>`")
    if cal.get("format") != FORMAT:
        raise VGenError(f"{p} is not a vgen ScaleKV calibration (format {cal.get('format')!r}, expected {FORMAT!r})")
    if patch_nums is not None and list(cal["patch_nums"]) != list(patch_nums):
        raise VGenError(f"{p} was calibrated for scales {cal['patch_nums']}, this model has {list(patch_nums)}: "
                        "calibrate it for this model")
    if n_layer is not None and cal["depth"] != n_layer:
        raise VGenError(f"{p} was calibrated for {cal['depth']} layers, this model has {n_layer}")
    return cal


class AttentionRecorder(CachePolicy):
    """Keeps everything and records, per stage and layer, the prefix mass and spread of the attention."""

    name = "record"

    def __init__(self):
        self.sums: dict[tuple[int, int], list[float]] = {}

    def keep(self, layer, stage, hw, q, k, v, scale, full_len):
        T, S = k.shape[2], hw[0] * hw[1]
        P = T - S
        if P > 0:
            att = torch.softmax((q @ k.transpose(-1, -2)).float() * scale, dim=-1)  # (B, H, S, T)
            pre = att[..., :P]
            mass = pre.sum(-1)  # (B, H, S)
            pn = pre / mass.clamp_min(1e-12)[..., None]
            ent = -(pn * pn.clamp_min(1e-12).log()).sum(-1)
            spread = ent.exp() / P
            acc = self.sums.setdefault((stage, layer), [0.0, 0.0, 0])
            acc[0] += float(mass.sum())
            acc[1] += float(spread.sum())
            acc[2] += mass.numel()
        return k, v

    def table(self, n_stages: int, n_layer: int) -> tuple[list[list[float]], list[list[float]]]:
        mass = [[0.0] * n_layer for _ in range(n_stages)]
        spread = [[0.0] * n_layer for _ in range(n_stages)]
        for (s, l), (m, sp, n) in self.sums.items():
            mass[s][l], spread[s][l] = m / n, sp / n
        return mass, spread


def two_means(x: list[float]) -> list[bool]:
    """1-D 2-means (exhaustive over sorted splits): True for the members of the high cluster."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    best, cut = math.inf, len(x)
    for c in range(1, len(x)):
        lo, hi = [x[i] for i in order[:c]], [x[i] for i in order[c:]]
        cost = sum((a - sum(lo) / len(lo)) ** 2 for a in lo) + sum((a - sum(hi) / len(hi)) ** 2 for a in hi)
        if cost < best:
            best, cut = cost, c
    high = set(order[cut:])
    return [i in high for i in range(len(x))]


def layer_weights(demand: list[float], budget: float, max_ratio: float = 8.0) -> tuple[list[float], list[int], float]:
    """Two-level budget weights with mean 1 from per-layer demand: (weights, drafter layers, ratio)."""
    n = len(demand)
    logd = [math.log(max(d, 1e-9)) for d in demand]
    if n < 2 or max(logd) - min(logd) < 1e-6:
        return [1.0] * n, [], 1.0
    high = two_means(logd)
    nd = sum(high)
    md = sum(d for d, h in zip(demand, high) if h) / nd
    mr = sum(d for d, h in zip(demand, high) if not h) / (n - nd)
    ratio = min(max(md / max(mr, 1e-9), 1.0), max_ratio, 1.0 / budget)
    w_r = n / (nd * ratio + (n - nd))
    return [w_r * ratio if h else w_r for h in high], [i for i in range(n) if high[i]], ratio


def calibrate(mass: list[list[float]], spread: list[list[float]], budget: float, patch_nums, depth: int,
              max_ratio: float = 8.0, meta: dict | None = None) -> dict:
    """Budget weights for keeping after each stage s (used by stages > s), from the attention of stage s+1."""
    K = len(patch_nums)
    entries, weights = [], []
    for s in range(K - 1):
        demand = [mass[s + 1][l] * spread[s + 1][l] for l in range(depth)]
        w, drafters, ratio = layer_weights(demand, budget, max_ratio)
        weights.append(w)
        entries.append({"keep_after_scale": s, "used_by_scale": s + 1, "drafters": drafters,
                        "drafter_ratio": ratio, "weights": w, "demand": demand,
                        "prefix_mass": mass[s + 1], "spread": spread[s + 1]})
    return {"format": FORMAT, "budget": budget, "patch_nums": list(patch_nums), "depth": depth,
            "max_ratio": max_ratio, "weights": weights, "scales": entries, **(meta or {})}
