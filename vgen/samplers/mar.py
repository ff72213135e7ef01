"""MAR's own sampler for masked models: a random generation order per sample, ``num_iter`` transformer passes.

Pass ``step`` sees every token drawn so far (the rest masked) and returns a condition for every position; the
tokens of this step, the next ones in the sample's random order, are then drawn by the diffusion head, all from
this one pass. After ``step`` the number still unknown is MAR's cosine schedule
``floor(L * cos(pi/2 * (step + 1) / num_iter))``, kept in [1, unknown - 1] so every step draws at least one and
something is left for the last step, which draws all that remain. With guidance the rows are [cond; uncond] with
the same tokens, and the head's noise prediction is guided by ``cfg_scale`` or, under the ``linear`` schedule,
by MAR's ``1 + (cfg_scale - 1) * (L - unknown after the step) / L``. The head's last reverse step adds no noise
(MAR's rule) unless ``last_noise``.

Randomness comes from the seeds only: sample i's order from its own CPU generator and every token's head noise
from :func:`vgen.samplers.continuous.token_noise` (per position), so a sample is the same bytes in any batch.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec, Order
from vgen.samplers.base import option, register_sampler
from vgen.samplers.continuous import ContinuousOptions, ContinuousSampler, token_noise

ORDER_STREAM = 300  # the generation order's generator: seed * 1000 + 300 (token noise uses + 500, uniforms + 0)
# BLAS libraries compute matrix products of a few rows with other kernels (MKL: fewer than 4 rows), whose sums
# round differently: the head always gets at least this many rows (repeats of the first), so a token's bytes never
# depend on how many tokens its batch draws in a pass.
HEAD_MIN_ROWS = 8


@dataclass
class MAROptions(ContinuousOptions):
    """MAR's sampling: ``num_iter`` passes on a cosine schedule, the diffusion head's options."""
    num_iter: int = option(64, "transformer passes (MAR's autoregressive steps), 1..seq_len; tokens per pass "
                           "follow MAR's cosine schedule")
    last_noise: bool = option(False, "add noise at the head's last reverse step too (false: MAR's official "
                              "noiseless last step)")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        L = math.prod(spec.token_shape) if spec is not None and spec.token_shape else None
        if self.num_iter < 1 or (L is not None and self.num_iter > L):
            raise VGenError(f"num_iter must be in 1..{L if L is not None else 'seq_len'} (one transformer pass "
                            f"draws at least one token), got {self.num_iter}")


def generation_orders(seeds: list[int], length: int, device=None) -> torch.Tensor:
    """(N, L) a random permutation of the positions per sample, each from its own seed (drawn on the CPU)."""
    orders = [torch.randperm(length, generator=torch.Generator().manual_seed((int(s) * 1000 + ORDER_STREAM) % 2 ** 64))
              for s in seeds]
    return torch.stack(orders).to(device) if orders else torch.empty(0, length, dtype=torch.long, device=device)


def unknown_after(step: int, num_iter: int, length: int, unknown: int) -> int:
    """MAR's schedule: how many tokens stay unknown after pass ``step`` when ``unknown`` are before it (the
    last pass reports 1, as the official code does for its guidance scale, though it draws them all)."""
    target = math.floor(length * math.cos(math.pi / 2 * (step + 1) / num_iter))
    return max(1, min(unknown - 1, target))


@register_sampler
class MARSampler(ContinuousSampler):
    name = "mar"
    Options = MAROptions
    order = Order.MASKED
    plain = True

    def _sample(self, model, cond, seeds, progress, codebook=None):
        o = self.options
        t0 = time.perf_counter()
        B, L, C, dev = cond.shape[0], model.seq_len, model.token_channels, cond.device
        S = o.steps(model)
        noise = token_noise(seeds, L, S, C, dev)
        orders = generation_orders(seeds, L, dev)
        guided = o.guided
        cond_in = torch.cat([cond, model.null_cond(cond)]) if guided else cond
        timed = dev.type == "cpu"  # the transformer / head split needs no host sync on the CPU only

        tokens = torch.zeros(B, L, C, device=dev)
        mask = torch.ones(B, L, device=dev)  # 1 = unknown
        step_map = torch.zeros(B, L, dtype=torch.long, device=dev)
        rows = torch.arange(B, device=dev)[:, None]
        lefts, u = [], L  # the schedule, known in advance: every pass's guidance scale goes to the device at once
        for step in range(o.num_iter):
            lefts.append(unknown_after(step, o.num_iter, L, u))
            u = 0 if step == o.num_iter - 1 else lefts[-1]
        cfgs = torch.tensor([o.cfg_at(L - left, L) for left in lefts], device=dev) if guided else None
        known, passes = torch.zeros((), device=dev), torch.arange(o.num_iter, device=dev)  # values written per pass
        unknown, t_transformer, t_head = L, 0.0, 0.0
        for step in tqdm(range(o.num_iter), disable=not progress, desc="mar", leave=False):
            ta = time.perf_counter()
            x, m = (torch.cat([tokens, tokens]), torch.cat([mask, mask])) if guided else (tokens, mask)
            z = model.conditions(x, m, cond_in, unknown=unknown)  # the schedule's count: no host read of the mask
            tb = time.perf_counter()
            left = unknown_after(step, o.num_iter, L, unknown)
            keep = 0 if step == o.num_iter - 1 else left
            pos = orders[:, keep:unknown]                       # (B, k): this pass's tokens
            if pos.shape[1]:
                r, p = rows.expand_as(pos).reshape(-1), pos.reshape(-1)
                n = r.numel()
                pad = torch.zeros(max(0, HEAD_MIN_ROWS - n), dtype=torch.long, device=dev)
                hr, hp = torch.cat([r, r[pad]]), torch.cat([p, p[pad]])
                zs = torch.cat([z[hr, hp], z[hr + B, hp]]) if guided else z[hr, hp]
                start, steps = noise.at(hr, hp)
                out = model.sample_head(zs, start, steps, temperature=o.temperature,
                                        cfg=cfgs[step] if guided else 1.0, num_steps=S,
                                        last_noise=o.last_noise, stop_sigma=o.stop_sigma, clip_x0=o.clip_x0,
                                        compiled=o.compile is True)
                tokens[r, p] = out.token[:n].to(tokens.dtype)
                mask[r, p] = known
                step_map[r, p] = passes[step]
            unknown = keep
            t_transformer += tb - ta
            t_head += time.perf_counter() - tb
        stats = {"forward_passes": o.num_iter, "tokens": B * L, "seconds": time.perf_counter() - t0,
                 **({"transformer_seconds": t_transformer, "head_seconds": t_head} if timed else {}),
                 "accepted_per_step": L / o.num_iter, "step_map": step_map}
        return tokens, stats
