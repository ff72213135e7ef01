"""Emu3 (transformers' ``Emu3ForConditionalGeneration``) as a vgen next-token model.

Emu3 writes an image as rows of visual tokens (``<|visual token k|>``, code k) with a row-end token
(``<|extra_200|>``) after each row, then end-of-frame / end-of-image / EOS. vgen samples the (height, width) grid of
codes; the adapter forces the row ends (:mod:`vgen.models.hf`: the model sees its own layout, the sampler never
drafts a forced token). Logits are the language-model head's rows of the visual tokens (a view of the weight when
they are contiguous, as in the released vocabulary), so sampling over them equals transformers' sampling restricted
to visual tokens by ``prefix_allowed_tokens_fn``. CFG: rows [prompt; negative prompt] in one batch, mixing logits
``u + s (c - u)``; transformers mixes log-softmaxes of the full vocabulary in a second, unbatched forward, which
differs by a constant per row (the same distribution). Without a negative prompt the CFG row is the prompt's last
token, as in transformers' ``UnbatchedClassifierFreeGuidanceLogitsProcessor``.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from vgen.errors import VGenError
from vgen.models.hf.adapter import Family, FamilyBase, register_family

SAMPLING = {"cfg_scale": 3.0, "top_k": 2048}  # Emu3-Gen's model card: guidance 3, top-k 2048
NEGATIVE_PROMPT = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
                   "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, "
                   "blurry.")  # the model card's


def decoder(m) -> nn.Module:
    """Emu3's text model (what runs once per token)."""
    return m.model.text_model


def wrap(m, height: int | None = None, width: int | None = None, negative_prompt_ids=None) -> Family:
    if height is None or width is None:
        raise VGenError("Emu3 generates any grid: give height= and width= in tokens (the processor's image size / 8; "
                        "the released model's default 720 px is 90 x 90)")
    if int(height) < 1 or int(width) < 1:
        raise VGenError(f"height and width must be >= 1 tokens, got {height} x {width}")
    vm = m.model.vocabulary_mapping
    img2bpe = vm.img2bpe
    codes = len(img2bpe)
    if codes == 0 or vm.eol_token_id is None:
        raise VGenError("this Emu3 model's vocabulary_map has no visual tokens or no row-end token <|extra_200|>")
    ids = torch.tensor([img2bpe[k] for k in range(codes)], dtype=torch.long)
    text = decoder(m)
    head = m.lm_head
    contiguous = bool((ids == ids[0] + torch.arange(codes)).all())
    lo = int(ids[0])
    neg = None
    if negative_prompt_ids is not None:
        neg = torch.as_tensor(negative_prompt_ids, dtype=torch.long).reshape(1, -1)
        if neg.numel() == 0:
            raise VGenError("negative_prompt_ids is empty")
    vocab_map = ids  # code k -> its <|visual token k|> id

    on_device: dict = {}  # the code -> id table per device (no host-to-device copy per pass)

    def embed_codes(t: torch.Tensor) -> torch.Tensor:
        table = on_device.get(t.device)
        if table is None:
            table = on_device[t.device] = vocab_map.to(t.device)
        return text.embed_tokens(table[t])

    if contiguous:
        def logits(h: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(h, head.weight[lo: lo + codes])
    else:
        rows = head.weight.detach()[ids]  # one gather at wrap time (the released vocabulary never needs it)

        def logits(h: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(h, rows.to(h.device))

    def null_prompt(cond: torch.Tensor) -> torch.Tensor:
        if neg is not None:
            return neg.to(cond.device).expand(cond.shape[0], -1)
        return cond[:, -1:]

    def decode_image(grid: torch.Tensor) -> torch.Tensor:
        b, h, w = grid.shape
        seq = torch.cat([vocab_map.to(grid.device)[grid], grid.new_full((b, h, 1), vm.eol_token_id)], -1).flatten(1)
        seq = torch.cat([seq, seq.new_zeros(b, 3)], 1)  # eof, eoi, eos: dropped by decode_image_tokens
        return m.model.decode_image_tokens(seq, height=h, width=w).clamp(-1, 1)

    tc = text.config
    return Family(
        name="Emu3", decoder=text, embed_prompt=lambda t: text.embed_tokens(t), embed_codes=embed_codes, logits=logits,
        vocab_size=codes, grid=(int(height), int(width)), null_prompt=null_prompt,
        pad_id=int(tc.pad_token_id if tc.pad_token_id is not None else 0), text_vocab=int(tc.vocab_size),
        max_positions=getattr(tc, "max_position_embeddings", None),
        codebook=lambda: m.model.vqmodel.quantize.embedding.weight.detach(), row_end=int(vm.eol_token_id),
        decode_image=decode_image, sampling=dict(SAMPLING),
        config={"hidden": tc.hidden_size, "layers": tc.num_hidden_layers, "heads": tc.num_attention_heads,
                "vocab": codes, "negative": None if neg is None else neg.tolist()})


def prompt_ids(processor, text: str, height: int, width: int) -> torch.Tensor:
    """A prompt's ids (L,) as Emu3's processor builds them for image generation (``return_for_image_generation``):
    BOS, the text, the image's start and its size in tokens."""
    tok = processor.tokenizer
    ids = tok(f"{tok.bos_token or ''}{text}{processor.image_start_token}{height}*{width}"
              f"{processor.fake_token_around_image}", add_special_tokens=False, return_tensors="pt").input_ids
    return ids[0]


class Emu3(FamilyBase):
    """Emu3 for :func:`vgen.models.from_transformers` and :mod:`vgen.hf_pipeline`: the grid from the processor's
    image size unless given, the model card's negative prompt as the CFG row unless another is given; the zoo's
    photos-emu3 layout (:mod:`vgen.models.hf.emu3_zoo`)."""
    name = "emu3"
    releases = "Emu3"

    def model_class(self) -> type:
        from transformers import Emu3ForConditionalGeneration
        return Emu3ForConditionalGeneration

    def wrap(self, hf_model, height=None, width=None, **options) -> Family:
        return wrap(hf_model, height, width, **options)

    def decoder(self, hf_model) -> nn.Module:
        return decoder(hf_model)

    def card_fields(self, name: str, folder: Path, config: dict) -> dict:
        vocab = config.get("vocabulary_map") or {}
        return {"token_shape": [90, 90], "vocab_size": sum(k.startswith("<|visual token") for k in vocab),
                "sampling": dict(SAMPLING)}

    def prompt_options(self, hf_model, processor, height, width, negative_prompt, options):
        if "negative_prompt_ids" in options:
            return height, width, options
        p = processor
        if (height is None or width is None) and p is not None:
            height, width = p.calculate_generate_size(p.ratio if hasattr(p, "ratio") else "1:1",
                                                      getattr(p, "image_area", 518400), p.downsample_ratio)
        neg = NEGATIVE_PROMPT if negative_prompt is None else negative_prompt
        if p is not None and neg:
            options = {**options, "negative_prompt_ids": prompt_ids(p, neg, height, width)}
        return height, width, options

    def tokenize(self, processor, hf_model, family: Family, prompt: str) -> torch.Tensor:
        return prompt_ids(processor, prompt, *family.grid)

    def zoo_prompt(self, tokenizer, card: dict):
        from vgen.models.hf.emu3_zoo import Layout
        h, w = card["token_shape"]
        return Layout(tokenizer, card["special"], card["vocab_size"], (h, w), card["caption_tokens"]).prompt


register_family(Emu3())
