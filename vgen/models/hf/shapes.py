"""Random-weight transformers image generators built with transformers' own config classes: tiny ones for tests,
and the released models' shapes (or scaled copies) for speed measurements (AR speed depends on the shapes, not the
weights). Nothing here downloads anything."""
from __future__ import annotations

import torch

# the released models' language-model shapes (config.json of each release)
RELEASED = {
    "janus-pro-1b": dict(hidden=2048, layers=24, heads=16, kv_heads=16, ffn=5632, vocab=102400, codes=16384, grid=(24, 24)),
    "janus-pro-7b": dict(hidden=4096, layers=30, heads=32, kv_heads=32, ffn=11008, vocab=102400, codes=16384,
                         grid=(24, 24)),
    "emu3-gen": dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=184622, codes=32768, grid=(90, 90)),
}
# the special ids the tiny models use (Janus: bos 0, pad 1, eos 2, begin-of-image 3; Emu3: see emu3_vocabulary)
JANUS_BOS, JANUS_PAD, JANUS_BOI = 0, 1, 3


def janus(hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, vocab=64, codes=8, grid=(2, 2), seed=0, std=None):
    """A JanusForConditionalGeneration with random weights (``std``: the init's std, larger = peakier logits)."""
    from transformers import (
        JanusConfig,
        JanusForConditionalGeneration,
        JanusVisionConfig,
        JanusVQVAEConfig,
        LlamaConfig,
    )
    g = grid[0]
    text = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=16384,
                       pad_token_id=JANUS_PAD, bos_token_id=JANUS_BOS, eos_token_id=2,
                       initializer_range=std or 0.02)
    vision = JanusVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=g * 16,
                               patch_size=16, num_image_tokens=g * g, projection_dim=hidden, depth=1)
    vq = JanusVQVAEConfig(embed_dim=8, num_embeddings=codes, latent_channels=32, base_channels=32,
                          channel_multiplier=[1, 1], num_res_blocks=1, projection_dim=hidden,
                          image_token_embed_dim=hidden, num_patches=g, initializer_range=std or 0.02)
    torch.manual_seed(seed)
    m = JanusForConditionalGeneration(JanusConfig(text_config=text, vision_config=vision, vq_config=vq,
                                                  image_token_id=vocab - 1)).eval()
    m.generation_config.bos_token_id, m.generation_config.pad_token_id = JANUS_BOS, JANUS_PAD
    m.generation_config.generation_kwargs = {"boi_token_id": JANUS_BOI}
    return m


def emu3_vocabulary(codes: int, text: int = 40) -> dict[str, int]:
    """Emu3's special tokens at small ids (row end 3, end of frame 4, end of image 5, image wrapper 6, image start 7,
    ``<image>`` 8) and ``codes`` visual tokens from id ``text`` on."""
    v = {"<|extra_200|>": 3, "<|extra_201|>": 4, "<|image end|>": 5, "<|image token|>": 6, "<|image start|>": 7,
         "<image>": 8}
    v.update({f"<|visual token {k:06d}|>": text + k for k in range(codes)})
    return v


def emu3(hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, codes=8, text=40, seed=0, std=None):
    """An Emu3ForConditionalGeneration with random weights; visual token k is id ``text + k``."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration, Emu3TextConfig, Emu3VQVAEConfig
    tc = Emu3TextConfig(vocab_size=text + codes, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=16384,
                        pad_token_id=1, bos_token_id=0, eos_token_id=2, initializer_range=std or 0.02)
    vq = Emu3VQVAEConfig(codebook_size=codes, embed_dim=4, latent_channels=4, base_channels=32,
                         channel_multiplier=[1, 1], num_res_blocks=1, attn_resolutions=[], hidden_size=32,
                         temporal_downsample_factor=1)
    torch.manual_seed(seed)
    return Emu3ForConditionalGeneration(Emu3Config(vq_config=vq, text_config=tc,
                                                   vocabulary_map=emu3_vocabulary(codes, text))).eval()


def emu3_allowed(height: int, width: int, prompt_len: int, visual: list[int], row_end: int = 3, eof: int = 4,
                 eoi: int = 5, eos: int = 2):
    """transformers' ``prefix_allowed_tokens_fn`` for Emu3 (as in its model card): visual tokens, a row end after
    each row, then end of frame, end of image, EOS (default: the tiny models' ids)."""
    def allowed(batch_id, input_ids):
        off = input_ids.shape[0] - prompt_len + 1  # 1 = the first visual token
        if off % (width + 1) == 0:
            return [row_end]
        if off == (width + 1) * height + 1:
            return [eof]
        if off == (width + 1) * height + 2:
            return [eoi]
        if off >= (width + 1) * height + 3:
            return [eos]
        return visual
    return allowed


def chameleon_vocabulary(codes: int, text: int = 40) -> dict[str, int]:
    """Chameleon's special tokens at small ids (begin of image 3, end of image 4, Lumina-mGPT's row end 5, its size
    tokens for 1..4 units at 6..9, ``<image>`` 10) and ``codes`` image tokens ``IMGIMG<digits as letters>Z`` from id
    ``text`` on, in name order (so code order and id order differ from 11 codes on, as in the released vocabulary)."""
    from vgen.models.hf.chameleon import BOI, EOI, ROW_END, size_token
    v = {"<s>": 0, "<pad>": 1, "</s>": 2, BOI: 3, EOI: 4, ROW_END: 5, "<image>": 10}
    v.update({size_token(n): 5 + n for n in range(1, 5)})
    letters = {str(i): chr(ord("A") + i) for i in range(10)}
    names = sorted("IMGIMG" + "".join(letters[c] for c in str(k)) + "Z" for k in range(codes))
    v.update({n: text + i for i, n in enumerate(names)})
    return v


def chameleon(hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, codes=8, text=40, seed=0, std=None,
              architecture: str | None = None):
    """A ChameleonForConditionalGeneration with random weights (``architecture``: the name its config records, e.g.
    Lumina-mGPT's ``ChameleonXLLMXForConditionalGeneration``)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration, ChameleonVQVAEConfig
    vq = ChameleonVQVAEConfig(embed_dim=4, num_embeddings=codes, latent_channels=4, resolution=16, base_channels=32,
                              channel_multiplier=[1, 2], num_res_blocks=1, attn_resolutions=[])
    cfg = ChameleonConfig(vocab_size=text + codes, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                          bos_token_id=0, pad_token_id=1, eos_token_id=2, vq_config=vq.to_dict(),
                          vocabulary_map=chameleon_vocabulary(codes, text), initializer_range=std or 0.02,
                          architectures=[architecture] if architecture else None)
    torch.manual_seed(seed)
    return ChameleonForConditionalGeneration(cfg).eval()
