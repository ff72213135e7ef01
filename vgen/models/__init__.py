"""Backbones with official parameter names. ``build(kind, **config)``, ``load_official(kind, src, **config)``."""
from __future__ import annotations

import torch

from vgen.models.gpt import GPT, GPTConfig, find_multiple
from vgen.models.loading import (GPT_PRESETS, VQ_PRESETS, build, count_indexed, detect_kind, list_kinds,
                                 load_official, read_checkpoint, register_kind)
from vgen.models.nar import NAR, NARConfig
from vgen.models.var import VAR, VARConfig
from vgen.tokenizers.msvq import MSVQConfig, MultiScaleVQVAE
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


def _infer_nar(sd: dict) -> dict:
    """As the GPT, but the blocks are n_layer + medusa_attention_num: the split is invisible in the shapes,
    so the official default of one extra block is assumed (pass medusa_attention_num to change it)."""
    cfg = _infer_gpt(sd)
    if cfg.get("n_layer"):
        cfg["n_layer"] -= 1
        cfg["medusa_attention_num"] = 1
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


def _infer_var(sd: dict) -> dict:
    cfg: dict = {}
    if "head.weight" in sd:
        cfg["vocab_size"], cfg["embed_dim"] = sd["head.weight"].shape
    if "word_embed.weight" in sd:
        cfg["Cvae"] = sd["word_embed.weight"].shape[1]
    cfg["depth"] = count_indexed(sd, "blocks")
    scale_mul = sd.get("blocks.0.attn.scale_mul_1H11")
    cfg["attn_l2_norm"] = scale_mul is not None
    if scale_mul is not None:
        cfg["num_heads"] = scale_mul.shape[1]
    elif cfg["depth"]:
        cfg["num_heads"] = cfg["depth"]  # official builds use heads = depth
    if "class_emb.weight" in sd:
        cfg["num_classes"] = sd["class_emb.weight"].shape[0] - 1
    if "lvl_1L" in sd:  # the level of every token: its counts give the scale schedule
        counts = torch.bincount(sd["lvl_1L"].flatten().long()).tolist()
        cfg["patch_nums"] = [round(c ** 0.5) for c in counts]
    cfg["shared_aln"] = "shared_ada_lin.1.weight" in sd
    fc1 = sd.get("blocks.0.ffn.fc1.weight")
    if fc1 is not None and "embed_dim" in cfg:
        cfg["mlp_ratio"] = fc1.shape[0] / cfg["embed_dim"]
    return cfg


def _infer_msvq(sd: dict) -> dict:
    cfg: dict = {}
    if "quantize.embedding.weight" in sd:
        cfg["vocab_size"], cfg["z_channels"] = sd["quantize.embedding.weight"].shape
    if "encoder.conv_in.weight" in sd:
        ch = cfg["ch"] = sd["encoder.conv_in.weight"].shape[0]
        n = count_indexed(sd, "encoder.down")
        key = "encoder.down.{}.block.0.conv1.weight"
        if n and all(key.format(i) in sd for i in range(n)):
            cfg["ch_mult"] = [sd[key.format(i)].shape[0] // ch for i in range(n)]
        cfg["num_res_blocks"] = count_indexed(sd, "encoder.down.0.block")
        cfg["using_sa"] = f"encoder.down.{max(n - 1, 0)}.attn.0.qkv.weight" in sd
        cfg["using_mid_sa"] = "encoder.mid.attn_1.qkv.weight" in sd
    if "quant_conv.weight" in sd:
        cfg["quant_conv_ks"] = sd["quant_conv.weight"].shape[-1]
    shared = count_indexed(sd, "quantize.quant_resi.qresi_ls")
    if shared:
        cfg["share_quant_resi"] = shared
    elif "quantize.quant_resi.qresi.weight" in sd:
        cfg["share_quant_resi"] = 1
    elif count_indexed(sd, "quantize.quant_resi"):
        cfg["share_quant_resi"], cfg["default_qresi_counts"] = 0, count_indexed(sd, "quantize.quant_resi")
    return cfg


def _is_var(sd):
    return "lvl_1L" in sd or ("blocks.0.attn.mat_qkv.weight" in sd and "head_nm.ada_lin.1.weight" in sd)


def _is_msvq(sd):
    return "quantize.embedding.weight" in sd and any(k.startswith("encoder.down.") for k in sd)


def _is_gpt(sd):
    return "tok_embeddings.weight" in sd and "medusa_output.weight" not in sd


def _is_nar(sd):
    return "tok_embeddings.weight" in sd and "medusa_output.weight" in sd


def _is_vq(sd):
    return ("quantize.embedding.weight" in sd and "encoder.conv_in.weight" in sd and "quant_conv.weight" in sd
            and not _is_msvq(sd))


register_kind("gpt", lambda c: GPT(c), GPTConfig, _infer_gpt, _is_gpt, "LlamaGen GPT")
register_kind("nar", lambda c: NAR(c), NARConfig, _infer_nar, _is_nar, "NAR (LlamaGen GPT with next-neighbour heads)")
register_kind("vq", lambda c: VQModel(c), VQConfig, _infer_vq, _is_vq, "LlamaGen VQ tokenizer")
register_kind("var", lambda c: VAR(c), VARConfig, _infer_var, _is_var, "VAR next-scale transformer")
register_kind("var-vqvae", lambda c: MultiScaleVQVAE(c), MSVQConfig, _infer_msvq, _is_msvq,
              "VAR multi-scale VQVAE")
register_kind("msvq", lambda c: MultiScaleVQVAE(c), MSVQConfig, _infer_msvq, _is_msvq, "VAR multi-scale VQVAE")

__all__ = ["GPT", "GPTConfig", "NAR", "NARConfig", "VQModel", "VQConfig", "VAR", "VARConfig", "MultiScaleVQVAE", "MSVQConfig", "build", "load_official", "list_kinds", "read_checkpoint",
           "detect_kind", "GPT_PRESETS", "VQ_PRESETS"]
