"""Plain autoregressive sampling of continuous tokens (``ar`` for a :class:`ContinuousNextTokenModel`): one
transformer pass per token over a static KV cache, then the diffusion head draws the token from its own
position's noise (:mod:`vgen.samplers.continuous`). The reference ``cspd`` is compared against (the target
alone). Stats split the time between the transformer and the head (``transformer_seconds``, ``head_seconds``;
measured on the CPU only: on CUDA they would need a host sync per token)."""
from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm

from vgen.interfaces import Order
from vgen.samplers.base import register_sampler
from vgen.samplers.continuous import Clock, ContinuousSampler, draw_tokens, token_noise


@register_sampler
class ContinuousARSampler(ContinuousSampler):
    name = "ar"
    order = Order.CONTINUOUS_NEXT_TOKEN
    plain = True

    def _sample(self, model, cond, seeds, progress, codebook=None):
        o = self.options
        t0 = time.perf_counter()
        B, L, C, dev = cond.shape[0], model.seq_len, model.token_channels, cond.device
        guided = o.guided
        noise = token_noise(seeds, L, o.steps(model), C, dev)
        cond_in = torch.cat([cond, model.null_cond(cond)]) if guided else cond
        cache = model.new_cache(cond_in.shape[0])
        rows = torch.arange(B, device=dev)
        tokens = torch.empty((B, L, C), device=dev)
        clock = Clock(dev)
        cache.limit(model.cond_len)
        z = model.prefill(cond_in, cache)
        clock.lap("transformer")
        positions = torch.arange(model.cond_len, model.cond_len + L, device=dev)  # sliced below: no upload per token
        for t in tqdm(range(L), disable=not progress, desc="ar", leave=False):
            pos = torch.full((B,), t, device=dev)
            tok = draw_tokens(model, z, noise, rows, pos, o, L, guided).token
            tokens[:, t] = tok
            clock.lap("head")
            if t + 1 < L:
                x = torch.cat([tok, tok]) if guided else tok
                cache.limit(model.cond_len + t + 1)
                z = model.decode(x[:, None], positions[t:t + 1], cache)[:, 0]
                clock.lap("transformer")
        stats = {"forward_passes": L, "tokens": B * L, "seconds": time.perf_counter() - t0,
                 "kv_cache_bytes": cache.nbytes, "accepted_per_step": 1.0, **clock.stats(),
                 "step_map": torch.arange(L, device=dev).expand(B, L).clone()}
        return tokens, stats
