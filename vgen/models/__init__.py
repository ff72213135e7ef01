"""Backbones with official parameter names. ``build(kind, **config)``, ``load_official(kind, src, **config)``."""
from __future__ import annotations

from vgen.models.gpt import GPT, GPTConfig, find_multiple
from vgen.models.loading import (GPT_PRESETS, VQ_PRESETS, build, count_indexed, detect_kind, list_kinds,
                                 load_official, read_checkpoint, register_kind)
from vgen.tokenizers.vq import VQConfig, VQModel

_HEAD_DIM_GUESS = {d: (n_head) for (_, n_head, d) in GPT_PRESETS.values()}


def _infer_gpt(sd: dict) -> dict:
    cfg: dict = {}
    if "tok_embeddings.weight" in sd:
        cfg["vocab_size"], cfg["dim"] = sd["tok_embeddings.weight"].shape
    cfg["n_layer"] = count_indexed(sd, "layers")
    dim = cfg.get("dim")
    if dim is not None:
        n_head = _HEAD_DIM_GUESS.get(dim)  # n_head is invisible in the shapes: known for the presets only
        if n_head is not None:
            cfg["n_head"] = n_head
        wqkv = sd.get("layers.0.attention.wqkv.weight")
        if wqkv is not None and n_head is not None:
            head_dim = dim // n_head
            n_kv = (wqkv.shape[0] // head_dim - n_head) // 2
            if n_kv != n_head:
                cfg["n_kv_head"] = n_kv
        w1 = sd.get("layers.0.feed_forward.w1.weight")
        if w1 is not None and w1.shape[0] != find_multiple(int(8 * dim / 3), 256):
            cfg["ffn_dim_multiplier"] = w1.shape[0] / int(8 * dim / 3)
            cfg["multiple_of"] = 1
    if "cls_embedding.embedding_table.weight" in sd:
        cfg["model_type"] = "c2i"
        rows = sd["cls_embedding.embedding_table.weight"].shape[0]
        cfg["num_classes"] = rows - 1  # released models keep a null-class row for CFG
        cfg["cls_token_num"] = 1
    elif "cls_embedding.cap_proj.fc1.weight" in sd:
        cfg["model_type"] = "t2i"
        cfg["caption_dim"] = sd["cls_embedding.cap_proj.fc1.weight"].shape[1]
        if "cls_embedding.uncond_embedding" in sd:
            cfg["cls_token_num"] = sd["cls_embedding.uncond_embedding"].shape[0]
    if "freqs_cis" in sd:  # some released files still carry the RoPE table: it fixes the grid size
        cfg["block_size"] = sd["freqs_cis"].shape[0] - cfg.get("cls_token_num", 1)
    return cfg


def _infer_vq(sd: dict) -> dict:
    cfg: dict = {}
    if "quantize.embedding.weight" in sd:
        cfg["codebook_size"], cfg["codebook_embed_dim"] = sd["quantize.embedding.weight"].shape
    cfg["codebook_show_usage"] = "quantize.codebook_used" in sd
    if "quant_conv.weight" in sd:
        cfg["z_channels"] = sd["quant_conv.weight"].shape[1]
    if "encoder.conv_in.weight" in sd:
        ch = sd["encoder.conv_in.weight"].shape[0]
        cfg["ch"] = ch
        n = count_indexed(sd, "encoder.conv_blocks")
        mult = [sd[f"encoder.conv_blocks.{i}.res.0.conv1.weight"].shape[0] // ch for i in range(n)
                if f"encoder.conv_blocks.{i}.res.0.conv1.weight" in sd]
        if len(mult) == n and n:
            cfg["encoder_ch_mult"] = mult
        cfg["num_res_blocks"] = count_indexed(sd, "encoder.conv_blocks.0.res")
    if "decoder.conv_out.weight" in sd and "ch" in cfg:
        n = count_indexed(sd, "decoder.conv_blocks")
        key = "decoder.conv_blocks.{}.res.0.conv1.weight"
        mult = [sd[key.format(i)].shape[0] // cfg["ch"] for i in range(n) if key.format(i) in sd]
        if len(mult) == n and n:
            cfg["decoder_ch_mult"] = mult[::-1]
    return cfg


def _is_gpt(sd):
    return "tok_embeddings.weight" in sd and "medusa_output.weight" not in sd


def _is_vq(sd):
    return "quantize.embedding.weight" in sd and "encoder.conv_in.weight" in sd and "quant_conv.weight" in sd


register_kind("gpt", lambda c: GPT(c), GPTConfig, _infer_gpt, _is_gpt, "LlamaGen GPT")
register_kind("vq", lambda c: VQModel(c), VQConfig, _infer_vq, _is_vq, "LlamaGen VQ tokenizer")

__all__ = ["GPT", "GPTConfig", "VQModel", "VQConfig", "build", "load_official", "list_kinds", "read_checkpoint",
           "detect_kind", "GPT_PRESETS", "VQ_PRESETS"]
