"""Janus / Janus-Pro (transformers' ``JanusForConditionalGeneration``) as a vgen next-token model.

Image tokens come from ``generation_head`` over the language model's last (normed) hidden state; a drawn code goes
back in through ``generation_embeddings`` + ``generation_aligner``; prompts through the language model's own token
embeddings. The CFG row is the prompt with every token but BOS and begin-of-image replaced by the pad token (what
``generate(generation_mode="image")`` builds). The grid is the model's (``vision_config.num_image_tokens``: 24 x 24
at 384 px); codes are ids into the VQ's codebook, decoded by the model's own VQ.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn as nn

from vgen.errors import VGenError
from vgen.models.hf.adapter import Family, FamilyBase, register_family

SAMPLING = {"cfg_scale": 5.0}  # the model card's recommended settings (cfg 5 for Janus-Pro's generate)


def _special(m, name: str) -> int:
    g = getattr(m, "generation_config", None)
    v = getattr(g, name, None) if g is not None else None
    if v is None:
        v = getattr(m.config.text_config, name, None)
    if v is None:
        raise VGenError(f"this Janus model states no {name} (generation_config.json): load the released folder "
                        "with its generation_config.json")
    return int(v[0] if isinstance(v, (list, tuple)) else v)


def decoder(m) -> nn.Module:
    """The language model inside Janus (what runs once per token)."""
    return m.model.language_model


def wrap(m, height: int | None = None, width: int | None = None, boi_token_id: int | None = None) -> Family:
    n = int(m.model.vision_model.config.num_image_tokens)
    g = math.isqrt(n)
    if g * g != n:
        raise VGenError(f"Janus makes {n} image tokens, not a square grid")
    if (height, width) not in ((None, None), (g, g)):
        raise VGenError(f"Janus generates a fixed {g} x {g} token grid ({n} image tokens), got height={height}, "
                        f"width={width}: leave them out")
    boi = boi_token_id
    if boi is None:
        boi = (getattr(getattr(m, "generation_config", None), "generation_kwargs", None) or {}).get("boi_token_id")
    if boi is None:
        raise VGenError("this Janus model states no begin-of-image token: pass boi_token_id= (the released "
                        "generation_config.json's generation_kwargs; vgen.load_pipeline('hf://...') reads it)")
    bos, pad = _special(m, "bos_token_id"), _special(m, "pad_token_id")
    inner = m.model
    lm = decoder(m)

    def null_prompt(cond: torch.Tensor) -> torch.Tensor:
        keep = (cond < 0) | (cond == bos) | (cond == boi)
        return torch.where(keep, cond, pad)

    def decode_image(codes: torch.Tensor) -> torch.Tensor:
        return inner.vqmodel.decode(codes.flatten(1)).clamp(-1, 1)

    tc = m.config.text_config
    return Family(
        name="Janus", decoder=lm, embed_prompt=lambda t: lm.get_input_embeddings()(t),
        embed_codes=lambda t: inner.generation_aligner(inner.generation_embeddings(t)),
        logits=inner.generation_head, vocab_size=int(m.config.vq_config.num_embeddings), grid=(g, g),
        null_prompt=null_prompt, pad_id=pad, text_vocab=int(tc.vocab_size),
        max_positions=getattr(tc, "max_position_embeddings", None),
        codebook=lambda: inner.vqmodel.quantize.embedding.weight.detach(), decode_image=decode_image,
        sampling=dict(SAMPLING),
        config={"hidden": tc.hidden_size, "layers": tc.num_hidden_layers, "heads": tc.num_attention_heads,
                "vocab": int(m.config.vq_config.num_embeddings)})


class Janus(FamilyBase):
    """Janus / Janus-Pro for :func:`vgen.models.from_transformers` and :mod:`vgen.hf_pipeline`: prompts through the
    processor's chat template (``generation_mode="image"``); the begin-of-image id read from the folder's
    ``generation_config.json`` (transformers drops its ``generation_kwargs`` on load)."""
    name = "janus"
    releases = "Janus, Janus-Pro"

    def model_class(self) -> type:
        from transformers import JanusForConditionalGeneration
        return JanusForConditionalGeneration

    def wrap(self, hf_model, height=None, width=None, **options) -> Family:
        return wrap(hf_model, height, width, **options)

    def decoder(self, hf_model) -> nn.Module:
        return decoder(hf_model)

    def load_options(self, name: str, folder: Path, config: dict, height, width):
        gen = folder / "generation_config.json"  # transformers drops its generation_kwargs on load: read them here
        kwargs = (json.loads(gen.read_text()).get("generation_kwargs") or {}) if gen.is_file() else {}
        boi = kwargs.get("boi_token_id")
        return height, width, {} if boi is None else {"boi_token_id": int(boi)}

    def card_fields(self, name: str, folder: Path, config: dict) -> dict:
        n = int((config.get("vision_config") or {}).get("num_image_tokens", 576))
        g = int(round(n ** 0.5))
        return {"token_shape": [g, g], "vocab_size": int((config.get("vq_config") or {}).get("num_embeddings", 16384)),
                "sampling": dict(SAMPLING)}

    def tokenize(self, processor, hf_model, family: Family, prompt: str) -> torch.Tensor:
        msgs = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
        text = processor.apply_chat_template(msgs, add_generation_prompt=True)
        return processor(text=text, generation_mode="image", return_tensors="pt").input_ids[0]


register_family(Janus())
