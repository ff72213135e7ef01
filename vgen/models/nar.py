"""NAR: LlamaGen's GPT with dimension-oriented heads for next-neighbour decoding (ThisisBillhe/NAR).

Parameter names and config fields match the official NAR code, so released NAR checkpoints load
unchanged. The model is the GPT with ``n_layer + medusa_attention_num`` blocks and two heads:

* the right head (``norm`` / ``output``) reads the hidden state after block ``n_layer - 1`` and predicts
  the token to the right of each token;
* the down head (``medusa_norm`` / ``medusa_output``) reads it after the last block (the
  ``medusa_attention_num`` extra blocks) and predicts the token below.

At the condition position both heads predict token (0, 0). A token that both heads reach (one from its left
neighbour, one from the token above) gets the mean of their logits; first-row tokens only have the right
head, first-column tokens only the down head. Attention follows the proximity mask
(:mod:`vgen.kernels.proximity`): a token sees the condition and every token on its own or an earlier
anti-diagonal.

Interface for next-neighbour samplers (on top of the GPT's ``grid``, ``seq_len``, ``new_cache`` ...):
``neighbour_offsets`` (what each head predicts, as (d_row, d_col)), ``prefill(cond, cache)`` -> logits for
token (0, 0), and ``decode_neighbours(tokens, input_pos, cache)`` -> one logits tensor per head.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vgen.kernels.kv_cache import KVCache
from vgen.kernels.linear import Linear
from vgen.kernels.proximity import proximity_mask
from vgen.models.gpt import GPT, GPTConfig, RMSNorm, TransformerBlock


@dataclass
class NARConfig(GPTConfig):
    # extra blocks between the right head and the down head (official field name)
    medusa_attention_num: int = 1


class NAR(GPT):
    family = "nar"
    generation = "next-neighbour"
    neighbour_offsets = ((0, 1), (1, 0))  # right head, down head

    def __init__(self, config: NARConfig | None = None, **kwargs):
        cfg = config or NARConfig(**kwargs)
        if cfg.medusa_attention_num < 1:
            raise ValueError(f"medusa_attention_num must be >= 1 (blocks before the down head), got "
                             f"{cfg.medusa_attention_num}")
        super().__init__(cfg)
        extra = [TransformerBlock(cfg) for _ in range(cfg.medusa_attention_num)]
        self.layers.extend(extra)
        self.medusa_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.medusa_output = Linear(cfg.dim, cfg.vocab_size, bias=False)
        for m in [*extra, self.medusa_output]:
            m.apply(self._init_weights)
        h, w = self.grid
        self.register_buffer("prox_mask", proximity_mask(h, w, cfg.cls_token_num), persistent=False)

    # ---- cache and layers -----------------------------------------------------------------------------
    def new_cache(self, batch_size: int, max_len: int | None = None, dtype=None, device=None) -> KVCache:
        cfg = self.config
        w = self.tok_embeddings.weight
        return KVCache(len(self.layers), batch_size, cfg.n_kv_head or cfg.n_head,
                       max_len or cfg.cls_token_num + cfg.block_size, cfg.head_dim,
                       dtype or w.dtype, device or w.device)

    def run_heads(self, h, input_pos, cache=None, attn_mask=None):
        """Hidden states -> (right-head logits, down-head logits), both float (B, S, V)."""
        rope = self.freqs_cis[input_pos]
        if attn_mask is None:
            rows = self.prox_mask[input_pos]
            attn_mask = rows[:, None] if input_pos.dim() == 2 else rows[None, None]
            if cache is None:
                attn_mask = attn_mask[..., : h.shape[1]]
            elif attn_mask.shape[-1] < cache.max_len:
                attn_mask = torch.nn.functional.pad(attn_mask, (0, cache.max_len - attn_mask.shape[-1]))
        h_right = None
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, attn_mask, cache, i, input_pos)
            if i == self.config.n_layer - 1:
                h_right = h
        right = self.output(self.norm(h_right)).float()
        down = self.medusa_output(self.medusa_norm(h)).float()
        return right, down

    # ---- sampler interface ----------------------------------------------------------------------------
    def prefill(self, cond: torch.Tensor, cache: KVCache, return_hidden: bool = False):
        """Run the condition, fill the cache; logits (B, V) for token (0, 0): the mean of both heads."""
        if return_hidden:
            raise NotImplementedError("NAR has two heads on two hidden states; use decode_neighbours")
        h = self.embed_cond(cond)
        pos = torch.arange(h.shape[1], device=h.device)
        right, down = self.run_heads(h, pos, cache)
        return (right[:, -1] + down[:, -1]) / 2

    def decode_neighbours(self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: KVCache,
                          attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed tokens (B, S) at sequence positions ``input_pos`` (image token i at cls_token_num + i) under
        the proximity mask; returns the logits each head predicts for its neighbour, one (B, S, V) tensor per
        entry of ``neighbour_offsets``."""
        return self.run_heads(self.tok_embeddings(tokens), input_pos, cache, attn_mask)

    def decode(self, *args, **kwargs):
        raise TypeError("a NAR model has no next-token head: drive it with decode_neighbours (sampler 'nar')")

    # ---- training / teacher forcing -------------------------------------------------------------------
    def combine(self, right: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        """Head outputs over [condition..., tokens] (B, cond_len + n, V) -> logits per token in raster order
        (B, n, V): token (0, 0) from the last condition position (mean of both heads), then each token from
        the neighbours whose heads reach it (mean where both do)."""
        c = self.config.cls_token_num
        h, w = self.grid
        B, V = right.shape[0], right.shape[-1]
        r = right[:, c:].reshape(B, h, w, V)
        d = down[:, c:].reshape(B, h, w, V)
        out = torch.empty_like(r)
        out[:, 0, 0] = (right[:, c - 1] + down[:, c - 1]) / 2
        out[:, 0, 1:] = r[:, 0, :-1]
        out[:, 1:, 0] = d[:, :-1, 0]
        out[:, 1:, 1:] = (r[:, 1:, :-1] + d[:, :-1, 1:]) / 2
        return out.reshape(B, h * w, V)

    def forward(self, tokens: torch.Tensor, cond: torch.Tensor, attn_mask: torch.Tensor | None = None):
        """Teacher forcing over all n tokens (B, n) with the proximity mask -> logits (B, n, V), ``logits[:, i]``
        predicts ``tokens[:, i]`` from the tokens on earlier anti-diagonals."""
        c = self.embed_cond(cond)
        h = self.tok_dropout(torch.cat([c, self.tok_embeddings(tokens)], dim=1))
        pos = torch.arange(h.shape[1], device=h.device)
        right, down = self.run_heads(h, pos, None, attn_mask)
        return self.combine(right, down)
