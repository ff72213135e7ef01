"""An EAGLE-style draft head for a next-token GPT (the drafter LANTERN and LANTERN++ speculate with).

One transformer block of the target's own shape reads, at every position, the target's last hidden state (before
its final norm) and the embedding of the token that follows it, projected from 2d to d, and predicts the target's
next hidden state; the target's own norm and output head turn that into draft logits. Only ``fc`` and the block
are the drafter's: the token embedding, positions (RoPE) and output head are read from the target it drafts for,
so its file is small (one block plus a 2d x d projection) and it cannot drift from the target's vocabulary.

Sequence convention (slot == position, as in the target's static cache): slot s holds the pair
(f[s-1], x[s]) -- the target's hidden state after token s-1 (after the condition, for s = 0) and token s, at the
target's position of token s. Its output g[s] approximates f[s], whose logits predict token s+1. Drafting
chains: g[s] and a drafted token x[s+1] are the pair of slot s+1.

Two architectures (``arch``): ``block`` (EAGLE's: one transformer block with its own static KV cache, attending
over the drafted prefix) and ``mlp`` (attention-free: the projection and one residual feed-forward layer, no KV
cache, no positions: each draft reads only the previous state and token, as Medusa-style heads do). ``mlp`` costs a
fraction of a block per call, which is what a small target on a CPU needs; its drafts see less context.

Training (``vgen train recipe=drafter``): teacher forcing on the target's features over real token sequences,
with both the class and the null (CFG) condition; loss = smooth-L1(g, f) + ``cls_weight`` * cross-entropy against
the target's next-token distribution (EAGLE's regression + classification)."""
from __future__ import annotations

import json
from dataclasses import asdict, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from vgen.errors import VGenError
from vgen.kernels.kv_cache import KVCache
from vgen.models.gpt import GPT, FeedForward, GPTConfig, RMSNorm, TransformerBlock

ARCHS = ("block", "mlp")


class Drafter(nn.Module):
    """``forward(target, feats (B, S, d), tokens (B, S), input_pos, cache=None) -> hidden (B, S, d)``;
    ``logits(target, hidden)`` = the target's head on it. ``config`` is the target's GPTConfig (the block copies
    its width, heads and FFN); ``arch``: ``block`` or ``mlp`` (no attention: ``attends`` is False, ``new_cache``
    gives None and ``forward`` ignores the cache, positions and mask)."""

    def __init__(self, config: GPTConfig, arch: str = "block"):
        super().__init__()
        if arch not in ARCHS:
            raise VGenError(f"unknown drafter arch {arch!r}: use one of {', '.join(ARCHS)}")
        self.config, self.arch = config, arch
        block_cfg = replace(config, n_layer=1, attn_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)
        self.fc = nn.Linear(2 * config.dim, config.dim, bias=True)
        if arch == "block":
            self.block = TransformerBlock(block_cfg)
        else:
            self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
            self.feed_forward = FeedForward(block_cfg)
        for m in self.modules():  # the target's init (GPT._init_weights)
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, config.initializer_range)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def check_target(self, target, where: str = "the drafter", shapes_only: bool = False) -> None:
        """One-line error unless ``target`` is the kind of model this drafter was trained for (``shapes_only``: its
        tensors fit ``target``'s, as a starting point for training one: the grid and condition may differ)."""
        tc = target.config
        keys = ("dim", "n_head", "vocab_size") if shapes_only else ("dim", "n_head", "vocab_size", "block_size",
                                                                    "cls_token_num")
        for k in keys:
            if getattr(tc, k) != getattr(self.config, k):
                raise VGenError(f"{where} was trained for a target with {k}={getattr(self.config, k)}, but this "
                                f"model has {k}={getattr(tc, k)}: train one with `vgen train recipe=drafter "
                                "model=<this pipeline>`")

    @property
    def attends(self) -> bool:
        """Whether the head attends over earlier slots (then it keeps a static KV cache of its own)."""
        return self.arch == "block"

    def forward(self, target, feats: torch.Tensor, tokens: torch.Tensor, input_pos: torch.Tensor,
                cache: KVCache | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.fc(torch.cat([feats.to(self.fc.weight.dtype), target.tok_embeddings(tokens)], dim=-1))
        if not self.attends:
            return x + self.feed_forward(self.ffn_norm(x))
        x, rope = target.positions(x, input_pos)
        if cache is not None and attn_mask is None:
            attn_mask = cache.causal_mask(input_pos)
        return self.block(x, rope, attn_mask, cache, 0, input_pos)

    def rollout(self, target, feats: torch.Tensor, tokens: torch.Tensor, input_pos: torch.Tensor,
                depths: int) -> list[torch.Tensor]:
        """Teacher-forced outputs at drafting depths 1..``depths`` (EAGLE-3's training-time test), each (B, S, d).

        Depth 1 is ``forward`` on the target's states (slot j fed (f[j-1], x[j])); depth k feeds slot j the head's
        own depth-(k-1) output at slot j-1 instead of the target's state, as a chain does at generation time. Its
        attention reads what the head's cache holds then: depth-1 keys up to slot j-k+1 (the target-fed catch-up),
        then one key of each depth 2..k on the diagonal (the chain's earlier drafts), so depth k at slot j equals
        the head's k-th chained call after catching up to slot j-k+1 (``tests/test_eagle.py``). Depth k is
        meaningful at slots j >= k-1 only; earlier ones hold finite filler."""
        if not self.attends:  # no attention: each depth is the head on the shifted previous one
            outs = [self(target, feats, tokens, input_pos)]
            for _ in range(depths - 1):
                outs.append(self(target, F.pad(outs[-1][:, :-1], (0, 0, 1, 0)), tokens, input_pos))
            return outs
        at = self.block.attention
        B, S, d = feats.shape
        H, Hk, hd = at.n_head, at.n_kv_head, at.head_dim

        def shifted(t, by):  # t (..., S, e) -> row j holds t[j - by] (zeros before)
            return F.pad(t[..., :S - by, :], (0, 0, by, 0)) if by else t

        outs, keys, values = [], [], []
        idx = torch.arange(S, device=feats.device)
        for k in range(1, depths + 1):
            inp = feats if k == 1 else shifted(outs[-1], 1)
            x = self.fc(torch.cat([inp.to(self.fc.weight.dtype), target.tok_embeddings(tokens)], dim=-1))
            x, rope = target.positions(x, input_pos)
            q, kk, v = at.project(self.block.attention_norm(x), rope)
            kk, v = kk.repeat_interleave(H // Hk, 1), v.repeat_interleave(H // Hk, 1)
            keys.append(kk)
            values.append(v)
            if k == 1:
                y = F.scaled_dot_product_attention(q, kk, v, is_causal=True)
            else:  # scores on the catch-up prefix (keys <= j-k+1), then the diagonal of each later depth
                scale = hd ** -0.5
                s1 = (q @ keys[0].transpose(-1, -2)) * scale
                s1 = s1.masked_fill(idx[None, :] > idx[:, None] - (k - 1), float("-inf"))
                diag = [(q * shifted(keys[m - 1], k - m)).sum(-1, keepdim=True) * scale for m in range(2, k + 1)]
                w = torch.cat([s1] + diag, -1).softmax(-1)
                y = w[..., :S] @ values[0]
                for i, m in enumerate(range(2, k + 1)):
                    y = y + w[..., S + i:S + i + 1] * shifted(values[m - 1], k - m)
            h = x + at.wo(y.transpose(1, 2).reshape(B, S, d))
            outs.append(h + self.block.feed_forward(self.block.ffn_norm(h)))
        return outs

    @torch.no_grad()
    def inference(self, target) -> InferenceHead:
        """This head's few-op inference path for ``target`` (what the eagle sampler calls per pass)."""
        return InferenceHead(self, target)

    @staticmethod
    def logits(target, hidden: torch.Tensor) -> torch.Tensor:
        return target.head(hidden)

    def new_cache(self, target, rows: int, extra: int = 0) -> KVCache | None:
        """The head's static cache: one slot per position, plus ``extra`` scratch slots (tree drafting); None for
        a head that does not attend."""
        if not self.attends:
            return None
        c = self.config
        w = self.fc.weight
        cache = KVCache(1, rows, c.n_kv_head or c.n_head, target.cond_len + target.seq_len + extra, c.head_dim,
                        w.dtype, w.device)
        cache.hide(target.cond_len)  # slot s = position s; the condition's slots hold nothing (as in training)
        return cache

    def digest(self, n: int = 16) -> str:
        """A digest of the head's tensors (cache keys)."""
        import hashlib
        h = hashlib.sha256()
        for k, v in sorted(self.state_dict().items()):
            h.update(k.encode())
            h.update(v.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:n]

    @property
    def config_json(self) -> str:
        return json.dumps(asdict(self.config))


class InferenceHead:
    """The head's inference path for one target: ``Drafter.forward``'s function with its weights pre-arranged for
    few ops per call (on a CPU a small head's call is per-op dispatch and streaming its weights:
    docs/lab/benchmarks-log.md "A few-op head"). The projection's token half is folded with the target's embedding into one (V, d) table, the
    block's norms' gains into the products after them, the FFN's two input products into one; weights are stored
    (in, out) (the fastest orientation for a few rows); positions are table lookups (RoPE as two multiplies on q and
    k at once); the output head reads the target's own weight (no copy). Same call as the drafter
    (``head(target, feats, tokens, input_pos, cache=None, attn_mask=None)``), ``attends``, ``new_cache`` and
    ``logits``; no gradients. Made by :meth:`Drafter.inference`; equal to ``forward``
    and the target's head up to float rounding (``tests/test_eagle.py``)."""

    def __init__(self, drafter: "Drafter", target):
        self.drafter, self.arch, d = drafter, drafter.arch, drafter.config.dim
        w = drafter.fc.weight.detach()
        dt, dev = w.dtype, w.device
        self.wg = w[:, :d].t().contiguous()  # feature half, (in, out)
        emb = target.tok_embeddings.weight.detach().to(dt)
        self.emb = torch.addmm(drafter.fc.bias.detach(), emb, w[:, d:].t())  # token half + bias, per token

        def gained(norm, *linears):  # (in, out) weights of the products after an RMSNorm, its gain folded in
            return norm.eps, torch.cat([m.weight.detach() for m in linears]).mul(norm.weight.detach()).t().contiguous()

        if self.arch == "mlp":
            ff = drafter.feed_forward
            self.ffn_eps, self.w13 = gained(drafter.ffn_norm, ff.w1, ff.w3)
        else:
            blk = drafter.block
            at, ff = blk.attention, blk.feed_forward
            self.attn_eps, self.wqkv = gained(blk.attention_norm, at.wqkv)
            self.ffn_eps, self.w13 = gained(blk.ffn_norm, ff.w1, ff.w3)
            self.wo = at.wo.weight.detach().t().contiguous()
            self.n_head, self.n_kv_head, self.head_dim = at.n_head, at.n_kv_head, at.head_dim
            # positions: the target's own, for every slot, as tables (additive embeddings and RoPE cos / sin)
            n = target.cond_len + target.seq_len
            x0, rope = target.positions(torch.zeros(1, n, d, dtype=dt, device=dev), torch.arange(n, device=dev))
            self.add_pos = x0[0] if bool(x0.any()) else None
            if rope is None:
                self.cos = self.sin = None
            else:  # rope (n, hd/2, 2): pairs (x0, x1) -> (x0 c - x1 s, x1 c + x0 s) = x * cos + swap(x) * sin
                c, s = rope[..., 0].to(dt), rope[..., 1].to(dt)
                self.cos = c.repeat_interleave(2, -1)
                self.sin = torch.stack([-s, s], -1).flatten(-2)
        self.w2 = ff.w2.weight.detach().t().contiguous()
        # the target's output head (final norm, then the product) where it is GPT's own: its very weights (a copy
        # would be one more megabyte streamed per pass beside the target's), its norm's gain applied by the norm
        plain = type(target).head is GPT.head and isinstance(target.norm, RMSNorm) and target.output.bias is None \
            and isinstance(target.output, nn.Linear) if isinstance(target, GPT) else False  # (not a quantized head)
        self.head = (target.norm.eps, target.norm.weight.detach(), target.output.weight.detach()) if plain else None

    @property
    def attends(self) -> bool:
        return self.arch == "block"

    def new_cache(self, target, rows: int, extra: int = 0):
        return self.drafter.new_cache(target, rows, extra)

    def logits(self, target, hidden: torch.Tensor) -> torch.Tensor:
        """The target's head on the head's states (rows, S, d) -> float logits (rows, S, V)."""
        if self.head is None:
            return target.head(hidden)
        eps, gain, w = self.head
        d = hidden.shape[-1]
        x = F.rms_norm(hidden.reshape(-1, d), (d,), gain, eps)
        return torch.mm(w, x.t()).t().float().view(*hidden.shape[:-1], -1)  # W x^T: vgen.kernels.linear's order

    def _ffn(self, x):
        a, b = torch.mm(F.rms_norm(x, (x.shape[-1],), None, self.ffn_eps), self.w13).chunk(2, -1)
        return torch.addmm(x, F.silu(a) * b, self.w2)

    def __call__(self, target, feats, tokens, input_pos, cache=None, attn_mask=None):
        B, S = tokens.shape
        d = self.wg.shape[0]
        x = torch.addmm(self.emb[tokens.reshape(-1)], feats.reshape(B * S, d).to(self.wg.dtype), self.wg)
        if not self.attends:
            return self._ffn(x).view(B, S, d)
        if self.add_pos is not None:
            x = x + self.add_pos[input_pos].expand(B, S, d).reshape(B * S, d)
        H, Hk, hd = self.n_head, self.n_kv_head, self.head_dim
        qkv = torch.mm(F.rms_norm(x, (d,), None, self.attn_eps), self.wqkv).view(B, S, H + 2 * Hk, hd)
        qk, v = qkv[:, :, :H + Hk], qkv[:, :, H + Hk:]
        if self.cos is not None:
            cs, sn = self.cos[input_pos], self.sin[input_pos]  # (S, hd) or (B, S, hd)
            qk = qk * cs.unsqueeze(-2) + qk.unflatten(-1, (hd // 2, 2)).flip(-1).flatten(-2) * sn.unsqueeze(-2)
        q, k, v = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            if attn_mask is None:
                attn_mask = cache.causal_mask(input_pos)
            k, v = cache.update(0, input_pos, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
                                           enable_gqa=Hk != H)
        x = torch.addmm(x, y.transpose(1, 2).reshape(B * S, d), self.wo)
        return self._ffn(x).view(B, S, d)


def target_features(target, tokens: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    """Teacher-forced hidden states of ``target`` (what its ``head`` reads): (B, L, d), row i predicts token i
    (row 0 is the state after the condition)."""
    return target.teacher_features(tokens, cond)


def save_drafter(drafter: Drafter, path, extra: dict | None = None):
    """The drafter's own tensors (fc + block), fp16, with the target's config in the metadata."""
    from vgen.io import save_safetensors
    meta = {"config": drafter.config_json, "kind": "eagle-drafter", "arch": drafter.arch}
    meta.update({k: json.dumps(v) for k, v in (extra or {}).items()})
    save_safetensors({k: v.half() for k, v in drafter.state_dict().items()}, path, metadata=meta)


def load_drafter(path, device="cpu") -> Drafter:
    """A drafter written by :func:`save_drafter` (``vgen train recipe=drafter``), fp32, eval mode."""
    from pathlib import Path

    from vgen.io import read_safetensors
    p = Path(path)
    if not p.is_file():
        raise VGenError(f"drafter weights not found at {p}: train them with `vgen train recipe=drafter "
                        "model=<pipeline>`")
    state, meta = read_safetensors(p, "write it with `vgen train recipe=drafter`")
    if meta.get("kind") != "eagle-drafter" or "config" not in meta:
        raise VGenError(f"{p} is not a vgen drafter (no 'eagle-drafter' metadata): write it with "
                        "`vgen train recipe=drafter`")
    arch = meta.get("arch", "block")  # files written before the mlp head have a block
    if arch not in ARCHS:
        raise VGenError(f"{p} holds a drafter of arch {arch!r}, which this vgen does not know ({', '.join(ARCHS)})")
    with torch.device("meta"):
        d = Drafter(GPTConfig(**json.loads(meta["config"])), arch)
    want = d.state_dict()
    if set(state) != set(want) or any(state[k].shape != want[k].shape for k in want):
        raise VGenError(f"{p} does not match the drafter its config describes: write it with "
                        "`vgen train recipe=drafter`")
    d.load_state_dict({k: v.float() for k, v in state.items()}, strict=True, assign=True)
    return d.to(device).eval().requires_grad_(False)


def head_for(heads: dict, path, model, device="cpu") -> Drafter:
    """The draft head at ``path``, loaded once into ``heads`` (a pipeline's cache, keyed by path), checked against
    ``model``, the target it drafts for, and cast to the target's floating dtype (a bfloat16 target gets a bfloat16
    head: its products read the target's embeddings and output weight; logits still come out float32)."""
    dtype = next(model.parameters()).dtype
    key = f"{path}|{dtype}"
    if key not in heads:
        head = load_drafter(path, device=device)
        head.check_target(model, f"draft head {path}")
        heads[key] = head.to(dtype) if dtype.is_floating_point else head
    return heads[key]
