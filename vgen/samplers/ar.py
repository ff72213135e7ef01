"""Plain autoregressive sampling: one token per forward pass, static KV cache, CFG, temperature,
top-k / top-p. The reference every accelerated sampler is compared against."""
from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm

from vgen.kernels.decode import ar_decode_step, compiled, token_step
from vgen.kernels.sampling import per_sample_uniforms
from vgen.samplers.base import Sampler, SamplingOptions, register_sampler


@register_sampler
class ARSampler(Sampler):
    name = "ar"
    Options = SamplingOptions
    plain = True

    def _sample(self, model, cond, seeds, progress, codebook=None):
        o = self.options
        t0 = time.perf_counter()
        B, L, dev = cond.shape[0], model.seq_len, cond.device
        cfg = o.guided
        cond_in = torch.cat([cond, model.null_cond(cond)]) if cfg else cond
        cache = model.new_cache(cond_in.shape[0])
        u = per_sample_uniforms(seeds, (L,), dev)
        us = [c.clone() for c in u.t()]
        positions = [torch.tensor([model.cond_len + t], device=dev) for t in range(L)]
        step = compiled(ar_decode_step) if o.compile else ar_decode_step
        kw = dict(cfg=cfg, cfg_scale=o.cfg_scale, temperature=o.temperature, top_k=o.top_k, top_p=o.top_p)

        tokens = torch.empty((B, L), dtype=torch.long, device=dev)
        logp = torch.empty((B, L), dtype=torch.float32, device=dev)
        tok, lp = token_step(model.prefill(cond_in, cache), us[0], apply_cfg=True, **kw)
        tokens[:, 0], logp[:, 0] = tok, lp
        for t in tqdm(range(1, L), disable=not progress, desc="ar", leave=False):
            apply_cfg = o.cfg_interval < 0 or t <= o.cfg_interval + 1
            tok, lp = step(model, cache, tok[:, None], positions[t - 1], us[t], apply_cfg=apply_cfg, **kw)
            tokens[:, t], logp[:, t] = tok, lp
        nll = float(-logp.mean())
        stats = {"forward_passes": L, "tokens": B * L, "seconds": time.perf_counter() - t0,
                 "kv_cache_bytes": cache.nbytes, "nll": nll, "accepted_per_step": 1.0,
                 "step_map": torch.arange(L, device=dev).expand(B, L).clone()}
        return tokens, stats
