"""Plain autoregressive sampling: one token per forward pass, static KV cache, CFG, temperature,
top-k / top-p. The reference every accelerated sampler is compared against.

``draw`` picks how a token is drawn from the target: ``inverse-cdf`` (the default: one uniform per token from the
sample's seed) or ``gumbel`` (Gumbel-max with noise fixed per (seed, position, token): :mod:`vgen.kernels.gumbel`).
Both are exact draws from the same distribution; ``gumbel`` gives the tokens SCD's Gumbel coupling reproduces."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from vgen.kernels.decode import ar_loop_step, compiled, token_step
from vgen.kernels.gumbel import gumbel_keys
from vgen.kernels.kv_cache import static_buffer
from vgen.kernels.sampling import per_sample_uniforms
from vgen.samplers.base import Sampler, SamplingOptions, option, register_sampler

DRAWS = ("inverse-cdf", "gumbel")


@dataclass
class AROptions(SamplingOptions):
    draw: str = option("inverse-cdf", "how each token is drawn: inverse-cdf (a uniform per token) or gumbel "
                       "(Gumbel-max, noise fixed per seed, position and token: the tokens scd reproduces)",
                       choices=DRAWS)


@register_sampler
class ARSampler(Sampler):
    name = "ar"
    Options = AROptions
    plain = True
    prefix = True

    def _sample(self, model, cond, seeds, progress, codebook=None, prefix=None):
        o = self.options
        t0 = time.perf_counter()
        B, L, dev = cond.shape[0], model.seq_len, cond.device
        cfg = o.guided
        cond_in = torch.cat([cond, model.null_cond(cond)]) if cfg else cond
        cache = model.new_cache(cond_in.shape[0])
        step = compiled(ar_loop_step, device=dev.type) if o.compile else ar_loop_step
        kw = dict(cfg=cfg, cfg_scale=o.cfg_scale, temperature=o.temperature, top_k=o.top_k, top_p=o.top_p)
        # the loop's state, read and written in place by every step (static addresses on CUDA, pooled for the next
        # run's replays): tokens, their log-probabilities, each sample's uniforms (or, with draw=gumbel, the
        # position keys: the draw at token t uses the noise of (seed, t)) and the token counter
        tokens = static_buffer(cache, "ar.tokens", (B, L), torch.long, dev)
        logp = static_buffer(cache, "ar.logp", (B, L), torch.float32, dev)
        u = static_buffer(cache, "ar.u", (B, L), torch.float32, dev).copy_(per_sample_uniforms(seeds, (L,), dev))
        gk = (static_buffer(cache, "ar.gkeys", (B, L), torch.long, dev).copy_(gumbel_keys(seeds, L, dev))
              if o.draw == "gumbel" else None)
        # attention reads the filled prefix only (bucketed when compiled: one graph per bucket)
        visible = [cache.bucket(model.cond_len + t) if o.compile else model.cond_len + t for t in range(L)]
        if not o.prefix_attention:
            visible = [None] * L
        cache.limit(visible[0])
        logits = model.prefill(cond_in, cache)
        P = 0 if prefix is None else prefix.shape[1]
        if P:  # given tokens: one pass feeds them all, then sampling continues at token P
            tokens[:, :P], logp[:, :P] = prefix, 0.0
            cache.limit(model.cond_len + P if o.prefix_attention else None)
            x = torch.cat([prefix, prefix]) if cfg else prefix
            logits = model.decode(x, torch.arange(model.cond_len, model.cond_len + P, device=dev), cache)[:, -1]
        tok, lp = token_step(logits, u[:, P], apply_cfg=o.cfg_interval < 0 or P <= o.cfg_interval + 1,
                             gkey=None if gk is None else gk[:, P], **kw)
        tokens[:, P], logp[:, P] = tok, lp
        counter = static_buffer(cache, "ar.t", (), torch.long, dev, fill=P)  # the last token drawn
        for t in tqdm(range(P + 1, L), disable=not progress, desc="ar", leave=False):
            cache.limit(visible[t])
            step(model, cache, tokens, logp, u, gk, counter, apply_cfg=o.cfg_interval < 0 or t <= o.cfg_interval + 1,
                 **kw)
        tokens, logp = tokens.clone(), logp.clone()  # the caller's own (the buffers go to the next run)
        nll = float(-logp[:, P:].mean())
        step_map = (torch.arange(L, device=dev) - P + int(P > 0)).clamp_min(0)
        stats = {"forward_passes": L - P + int(P > 0), "tokens": B * (L - P), "seconds": time.perf_counter() - t0,
                 "kv_cache_bytes": cache.nbytes, "nll": nll, "accepted_per_step": 1.0,
                 "step_map": step_map.expand(B, L).clone()}
        return tokens, stats
