"""The official LlamaGen ``generate()`` loop's per-step work, re-implemented for side-by-side timing: the hidden
sampler ``llamagen-loop`` (``vgen bench`` runs it as the baseline; ``list_samplers(include_hidden=True)`` names it).

It drives the same weights (a vgen ``GPT``) the way the official code does, so ``vgen bench`` can report
vgen's speed as a ratio against it in one run: caches allocated per call (length rounded up to a multiple
of 8) with a materialised (B, T, T) causal mask; per step the token is duplicated with ``cat`` for CFG,
the mask row is gathered, keys/values are written by index assignment, then copied by
``repeat_interleave`` before attention, the logits go through boolean-index top-k filtering, softmax and
``torch.multinomial``, and every token and probability row is cloned into a Python list.
Its randomness comes from the global generator, like the original, seeded with the first sample's seed per
batch: it is neither batch-invariant nor meant for sampling.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vgen.kernels.kv_cache import KVCache
from vgen.models.gpt import GPT, apply_rope
from vgen.samplers.base import Sampler, TokenOptions, option, register_sampler


def _filter_sample(logits, temperature, top_k, top_p):
    logits = logits[:, -1, :] / max(temperature, 1e-5)
    if top_k > 0:
        k = min(top_k, logits.size(-1))
        logits[logits < torch.topk(logits, k)[0][..., -1, None]] = -float("inf")
    if top_p < 1.0:
        srt, order = torch.sort(logits, descending=True)
        remove = torch.cumsum(F.softmax(srt, dim=-1), dim=-1) > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = 0
        logits[remove.scatter(1, order, remove)] = -float("inf")
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1), probs


def _rms(x, norm):
    x32 = x.float()
    return (x32 * torch.rsqrt(torch.mean(x32 * x32, dim=-1, keepdim=True) + norm.eps)).type_as(x) * norm.weight


def _ffn(x, ff):
    return F.linear(F.silu(F.linear(x, ff.w1.weight)) * F.linear(x, ff.w3.weight), ff.w2.weight)


def _forward(model: GPT, h, input_pos, caches, mask):
    """Plain ``F.linear`` and the unfused RMSNorm, as in the official model (not vgen's kernels)."""
    cfg = model.config
    rope = model.freqs_cis[input_pos]
    for layer, (kc, vc) in zip(model.layers, caches):
        att = layer.attention
        x = _rms(h, layer.attention_norm)
        b, s, _ = x.shape
        kv = att.n_kv_head * att.head_dim
        q, k, v = F.linear(x, att.wqkv.weight).split([att.dim, kv, kv], dim=-1)
        q = apply_rope(q.view(b, s, att.n_head, att.head_dim), rope).transpose(1, 2)
        k = apply_rope(k.view(b, s, att.n_kv_head, att.head_dim), rope).transpose(1, 2)
        v = v.view(b, s, att.n_kv_head, att.head_dim).transpose(1, 2)
        kc[:, :, input_pos] = k
        vc[:, :, input_pos] = v
        keys = kc.repeat_interleave(att.n_head // att.n_kv_head, dim=1)
        values = vc.repeat_interleave(att.n_head // att.n_kv_head, dim=1)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        h = h + F.linear(y.transpose(1, 2).contiguous().view(b, s, cfg.dim), att.wo.weight)
        h = h + _ffn(_rms(h, layer.ffn_norm), layer.feed_forward)
    return F.linear(_rms(h, model.norm), model.output.weight).float()


@torch.inference_mode()
def llamagen_generate(model: GPT, cond: torch.Tensor, cfg_scale: float = 1.0, cfg_interval: int = -1,
                      temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    cfg = model.config
    T = cfg.cls_token_num
    L = cfg.block_size
    use_cfg = cfg_scale > 1.0
    cond_in = torch.cat([cond, model.null_cond(cond)]) if use_cfg else cond
    bsz = cond_in.shape[0]
    max_len = T + L
    max_len += (-max_len) % 8
    dev, dt = cond.device, model.tok_embeddings.weight.dtype
    shape = (bsz, cfg.n_kv_head or cfg.n_head, max_len, cfg.head_dim)
    caches = [(torch.zeros(shape, dtype=dt, device=dev), torch.zeros(shape, dtype=dt, device=dev))
              for _ in model.layers]
    causal = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool, device=dev)).unsqueeze(0).repeat(bsz, 1, 1)

    def guided(logits, flag=True):
        if not use_cfg:
            return logits
        c, u = torch.split(logits, len(logits) // 2, dim=0)
        return u + (c - u) * cfg_scale if flag else c

    input_pos = torch.arange(0, T, device=dev)
    h = model.cls_embedding(cond_in, train=False)[:, :T]
    logits = _forward(model, h, input_pos, caches, causal[:bsz, None, input_pos])
    tok, _ = _filter_sample(guided(logits), temperature, top_k, top_p)
    out, probs = [tok.clone()], []
    input_pos = torch.tensor([T], device=dev, dtype=torch.int)
    flag = True
    for i in range(L - 1):
        if cfg_interval > -1 and i > cfg_interval:
            flag = False
        x = torch.cat([tok, tok]) if use_cfg else tok
        logits = _forward(model, model.tok_embeddings(x), input_pos, caches, causal[:bsz, None, input_pos])
        tok, p = _filter_sample(guided(logits, flag), temperature, top_k, top_p)
        input_pos += 1
        out.append(tok.clone())
        probs.append(p.clone())
        tok = tok.view(-1, 1)
    return torch.cat(out, dim=1)


@dataclass
class LoopOptions(TokenOptions):
    cfg_interval: int = option(-1, "guide only the first cfg_interval+1 tokens (-1 = every token; LlamaGen's)")


@register_sampler
class LlamaGenLoop(Sampler):
    """The official loop as a (hidden) sampler: same call and stats as the others, so a benchmark times it like
    any other cell."""
    name = "llamagen-loop"
    Options = LoopOptions
    hidden = True
    conditionings = ("class", "text")  # LlamaGen's class / caption GPTs; prompt-token models have their own loops

    def _sample(self, model, cond, seeds, progress, codebook=None):
        from vgen.errors import VGenError
        if not isinstance(model.layers[0].attention.wqkv, torch.nn.Linear):
            raise VGenError("sampler=llamagen-loop is the official loop over float linear layers: it takes no quantized "
                            "model (quantize=int8 / int4); use sampler=ar")
        o = self.options
        torch.manual_seed(seeds[0])
        t0 = time.perf_counter()
        tokens = llamagen_generate(model, cond, cfg_scale=o.cfg_scale, cfg_interval=o.cfg_interval,
                                   temperature=o.temperature, top_k=o.top_k, top_p=o.top_p)
        c, L = model.config, model.seq_len
        rows = 2 * len(cond) if o.cfg_scale > 1.0 else len(cond)
        max_len = c.cls_token_num + L + (-(c.cls_token_num + L)) % 8  # the official loop rounds up to 8
        kv = KVCache.nbytes_for(c.n_layer, rows, c.n_kv_head or c.n_head, max_len, c.head_dim,
                                model.tok_embeddings.weight.dtype)
        return tokens, {"forward_passes": L, "tokens": len(cond) * L, "seconds": time.perf_counter() - t0,
                        "kv_cache_bytes": kv, "accepted_per_step": 1.0}
