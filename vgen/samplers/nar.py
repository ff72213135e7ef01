"""Next-neighbour parallel decoding (NAR): one anti-diagonal of the token grid per forward pass.

The prefill predicts the first token. Each following pass feeds the tokens of anti-diagonal d (raster order)
under the proximity mask and draws every token of diagonal d + 1 at once: each target's logits are the mean
of the heads that reach it (for an image the right head of its left neighbour and the down head of the token
above; edge tokens have one). An h x w grid takes h + w - 1 passes (31 for 16 x 16) whatever the batch; the
sampler reads the grid (``model.token_shape``) and the heads (``model.neighbour_offsets``) from the model, so a
t x h x w video grid with a next-frame head takes t + h + w - 2.

Options are the shared ones: CFG (rows [cond; uncond], LlamaGen's form, applied to the head-averaged
logits; ``cfg_interval`` means what it means for every sampler: token t is guided when t <= cfg_interval + 1,
LlamaGen's rule, applied per token of a diagonal; the official NAR code instead stops guiding a whole diagonal once
more than ``cfg_interval`` tokens exist), temperature, top-k, top-p. Token i of sample j draws with uniform ``u[j, i]`` from seed j, so a
sample is the same in any batch.
"""
from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm

from vgen.interfaces import Order
from vgen.kernels.decode import compiled, token_step
from vgen.kernels.proximity import anti_diagonals, average_heads, neighbour_sources
from vgen.kernels.sampling import per_sample_uniforms
from vgen.samplers.base import Sampler, SamplingOptions, register_sampler


def nar_decode_step(model, cache, tokens, pos, sources: list[torch.Tensor], u, cfg: bool, apply_cfg,
                    cfg_scale: float, temperature: float, top_k: int, top_p: float):
    """Feed diagonal d's tokens (B, S) at positions ``pos`` (S,); draw diagonal d + 1's tokens with uniforms
    ``u`` (B, T) -> (tokens (B, T), log-probs (B, T))."""
    x = torch.cat([tokens, tokens]) if cfg else tokens
    logits = average_heads(model.decode_neighbours(x, pos, cache), sources)
    return token_step(logits, u, cfg, apply_cfg, cfg_scale, temperature, top_k, top_p)


@register_sampler
class NARSampler(Sampler):
    name = "nar"
    Options = SamplingOptions
    order = Order.NEXT_NEIGHBOUR
    plain = True
    prefix = True

    def _sample(self, model, cond, seeds, progress, codebook=None, prefix=None):
        o = self.options
        t0 = time.perf_counter()
        B, L, dev = cond.shape[0], model.seq_len, cond.device
        shape = tuple(model.token_shape)
        diags = [d.to(dev) for d in anti_diagonals(shape)]
        offsets = tuple(tuple(o) for o in model.neighbour_offsets)
        cfg = o.guided
        cond_in = torch.cat([cond, model.null_cond(cond)]) if cfg else cond
        cache = model.new_cache(cond_in.shape[0])
        u = per_sample_uniforms(seeds, (L,), dev)
        kw = dict(cfg=cfg, cfg_scale=o.cfg_scale, temperature=o.temperature, top_k=o.top_k, top_p=o.top_p)
        step = compiled(nar_decode_step, dynamic=True, device=dev.type) if o.compile else nar_decode_step

        tokens = torch.empty((B, L), dtype=torch.long, device=dev)
        logp = torch.empty((B, L), dtype=torch.float32, device=dev)
        step_map = torch.empty((B, L), dtype=torch.long, device=dev)
        cache.limit(model.cond_len if o.prefix_attention else None)
        tok, lp = token_step(model.prefill(cond_in, cache)[:, None], u[:, :1], apply_cfg=True, **kw)
        tokens[:, :1], logp[:, :1], step_map[:, 0] = tok, lp, 0
        last_index = [int(x.max()) for x in anti_diagonals(shape)]
        sources_per_step = [[s.to(dev) for s in neighbour_sources(shape, d, offsets)] for d in range(len(diags) - 1)]
        P = 0 if prefix is None else prefix.shape[1]
        K = sum(1 for i in last_index if i < P)  # leading diagonals the given tokens fill completely
        if P:
            tokens[:, :P], logp[:, :P], step_map[:, :P] = prefix, 0.0, 0
        for d in tqdm(range(max(K - 1, 0), len(diags) - 1), disable=not progress, desc="nar", leave=False):
            cur, nxt, sources = diags[d], diags[d + 1], sources_per_step[d]
            if d == K - 1 and K > 1:  # the known diagonals in one pass; heads read diagonal d at its end
                cur = torch.cat(diags[:K])
                sources = [torch.where(x >= 0, x + len(cur) - len(diags[d]), x) for x in sources]
            apply_cfg = True if o.cfg_interval < 0 else nxt <= o.cfg_interval + 1
            seen = model.cond_len + last_index[d] + 1  # attention reads the filled prefix only
            cache.limit((cache.bucket(seen) if o.compile else seen) if o.prefix_attention else None)
            tok, lp = step(model, cache, tokens[:, cur], cur + model.cond_len, sources, u[:, nxt],
                           apply_cfg=apply_cfg, **kw)
            if P:  # given tokens on this diagonal stay as given
                known = nxt < P
                tok = torch.where(known, prefix[:, nxt.clamp_max(P - 1)], tok)
                lp = torch.where(known, torch.zeros_like(lp), lp)
            tokens[:, nxt], logp[:, nxt], step_map[:, nxt] = tok, lp, d + 2 - max(K, 1)
        passes = 1 + len(diags) - 1 - max(K - 1, 0)  # the prefill, then one pass per diagonal still to draw
        stats = {"forward_passes": passes, "tokens": B * (L - P), "seconds": time.perf_counter() - t0,
                 "kv_cache_bytes": cache.nbytes, "nll": float(-logp[:, P:].mean()),
                 "accepted_per_step": (L - P) / passes, "step_map": step_map}
        return tokens, stats
