"""Next-scale sampling (VAR): one forward pass per scale, every token of a scale drawn at once.

Guidance follows VAR: rows [cond; uncond], ``logits = (1 + t) cond - t uncond`` with
``t = (cfg_scale - 1) * si / (K - 1)`` (grows from 0 at the first scale to ``cfg_scale - 1`` at the last, so
``cfg_scale`` means at the last scale what it means for every other sampler; VAR's own ``cfg`` is ``cfg_scale - 1``
and is accepted as an alias; ``cfg_schedule=constant`` uses the last scale's t throughout). Then temperature,
top-k (0 = off) and top-p (1 = off), as for every token sampler. The KV cache grows scale
by scale; ``kv_compression`` (``none``, ``scalekv``, ``uniform``) with ``kv_budget`` bounds what it keeps for
later scales (see ``vgen.kernels.kv_compression``). Sample i draws from its own seed whatever the batch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
from tqdm.auto import tqdm

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec, Order
from vgen.kernels.kv_compression import make_policy
from vgen.kernels.sampling import filter_probs, per_sample_uniforms, sample_from_probs
from vgen.samplers.base import Sampler, TokenOptions, option, register_sampler

COMPRESSIONS = ("none", "scalekv", "uniform")


@dataclass
class VAROptions(TokenOptions):
    """``cfg_scale`` is the guidance scale at the last scale in LlamaGen's form (1 = off); it grows linearly from 1
    at the first scale (``cfg_schedule=linear``, VAR's) or holds throughout (``constant``). VAR's official ``cfg``
    is accepted with its meaning: ``cfg=c`` is ``cfg_scale=1+c``."""
    aliases = {"cfg": ("cfg_scale", lambda c: 1.0 + c)}
    cfg_scale: float = option(2.5, "guidance scale at the last scale (1 = off; VAR's cfg=1.5 is 2.5)")
    cfg_schedule: str = option("linear", "guidance over the scales: linear (VAR) | constant",
                               choices=("linear", "constant"))
    kv_compression: str = option("none", "what the KV cache keeps for later scales: none | scalekv | uniform",
                                 choices=COMPRESSIONS)
    kv_budget: float = option(0.1, "fraction of the full KV cache kept for later scales (scalekv, uniform)")
    kv_calibration: Optional[str] = option(None, "ScaleKV layer budgets JSON (`vgen scalekv calibrate`)")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if not 0.0 < self.kv_budget <= 1.0:
            raise VGenError(f"kv_budget must be in (0, 1] (fraction of the full cache kept), got {self.kv_budget}")
        if self.kv_compression == "scalekv" and not self.kv_calibration:
            raise VGenError("kv_compression=scalekv needs per-layer budgets: pass sampler.kv_calibration=<json> "
                            "(write one with `vgen scalekv calibrate model=...`; zoo models ship theirs)")
        if self.kv_compression == "scalekv":
            from vgen.kernels.kv_compression import load_calibration
            load_calibration(self.kv_calibration)  # a missing or damaged file: one line, before any weights load


def guidance_weight(cfg_scale: float, si: int, n_scales: int, schedule: str) -> float:
    """VAR's t at scale ``si``: logits = (1 + t) cond - t uncond."""
    t = cfg_scale - 1.0
    if schedule == "constant":
        return t
    return t * si / max(1, n_scales - 1)


@register_sampler
class VARSampler(Sampler):
    name = "var"
    Options = VAROptions
    order = Order.NEXT_SCALE
    plain = True
    observer = None  # a CachePolicy that records attention (ScaleKV calibration); None in normal use

    def _sample(self, model, cond, seeds, progress, codebook=None):
        o = self.options
        t0 = time.perf_counter()
        B, dev, pn = cond.shape[0], cond.device, model.patch_nums
        K, L = len(pn), model.seq_len
        guided = o.guided
        cond_in = torch.cat([cond, model.null_cond(cond)]) if guided else cond
        if self.observer is not None:  # calibration: keep everything, let the observer see every stage
            cache = model.new_cache(cond_in.shape[0], policy=self.observer)
            cache.store_last = True
        else:
            policy = make_policy(o.kv_compression, o.kv_budget, pn, model.config.depth, o.kv_calibration)
            cache = model.new_cache(cond_in.shape[0], policy=policy)
        u = per_sample_uniforms(seeds, (L,), dev)
        f_hat = model.start_fhat(B)
        x = None
        tokens = torch.empty((B, L), dtype=torch.long, device=dev)
        logp = torch.empty((B, L), dtype=torch.float32, device=dev)
        step_map = torch.empty((B, L), dtype=torch.long, device=dev)
        b = 0
        for si in tqdm(range(K), disable=not progress, desc="var", leave=False):
            logits = model.scale_logits(si, cond_in, x, cache)
            if guided:
                t = guidance_weight(o.cfg_scale, si, K, o.cfg_schedule)
                c, uc = logits.chunk(2)
                logits = (1 + t) * c - t * uc
            probs = filter_probs(logits, o.temperature, o.top_k, o.top_p)
            e = b + pn[si] ** 2
            idx = sample_from_probs(probs, u[:, b:e])
            tokens[:, b:e] = idx
            logp[:, b:e] = probs.gather(-1, idx[..., None]).squeeze(-1).clamp_min(1e-30).log()
            step_map[:, b:e] = si
            f_hat, x = model.next_scale_input(si, f_hat, idx)
            if x is not None and guided:
                x = x.repeat(2, 1, 1)
            b = e
        full = _full_cache_bytes(model, cond_in.shape[0])
        per_tok = full // model.seq_len
        cum = [sum(p * p for p in pn[:i + 1]) for i in range(K - 1)]
        kept = cache.kept_bytes_per_stage[:K - 1]
        stats = {"forward_passes": K, "tokens": B * L, "seconds": time.perf_counter() - t0,
                 "kv_cache_bytes": cache.peak_bytes, "kv_full_bytes": full,
                 "kv_fraction": cache.peak_bytes / full if full else 1.0,
                 "kv_kept_bytes_per_scale": list(cache.kept_bytes_per_stage),
                 # what is kept for later scales, as a fraction of the full cache, summed over scales
                 "kv_kept_fraction": sum(kept) / (per_tok * sum(cum)) if K > 1 else 1.0,
                 "nll": float(-logp.mean()), "accepted_per_step": L / K, "step_map": step_map}
        return tokens, stats


def _full_cache_bytes(model, rows: int) -> int:
    """Peak bytes of the uncompressed cache for the same batch (all scales' keys and values, every layer)."""
    c = model.config
    el = model.class_emb.weight.element_size()  # the model's dtype (its head may be quantized)
    return 2 * c.depth * rows * model.seq_len * c.embed_dim * el


def calibrate_scalekv(pipe, budget: float = 0.1, num_samples: int = 16, seed: int = 0, batch_size: int = 8,
                      max_ratio: float = 8.0, progress: bool = True, **options) -> dict:
    """ScaleKV layer budgets for a next-scale pipeline: sample ``num_samples`` images (classes cycled) with the
    full cache and the card's settings, record per layer and scale where attention goes, and split layers into
    drafters and refiners (``vgen.kernels.kv_compression.calibrate``)."""
    from vgen.kernels.kv_compression import AttentionRecorder, calibrate
    if not 0 < budget <= 1:
        raise VGenError(f"budget must be in (0, 1] (fraction of the full cache kept), got {budget}")
    if num_samples < 1:
        raise VGenError(f"num_samples must be >= 1, got {num_samples}")
    sampler = pipe.make_sampler("var", **{**options, "kv_compression": "none"})
    rec = AttentionRecorder()
    sampler.observer = rec
    labels = [i % pipe.num_classes for i in range(num_samples)]
    cond = torch.tensor(labels, device=pipe.device)
    sampler(pipe.model, cond, [seed + i for i in range(num_samples)], progress=progress, batch_size=batch_size)
    m = pipe.model
    mass, spread = rec.table(len(m.patch_nums), m.config.depth)
    return calibrate(mass, spread, budget, m.patch_nums, m.config.depth, max_ratio,
                     meta={"num_samples": num_samples, "seed": seed, "model": pipe.card.name})
