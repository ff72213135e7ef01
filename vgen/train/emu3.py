"""The zoo's Emu3-architecture text-to-image model ``photos-emu3``: transformers' ``Emu3ForConditionalGeneration`` at
zoo size, trained on photos-t2i's captioned crops and codes, saved with ``save_pretrained``.

Its vocabulary: the caption tokenizer's words (photos-t2i's, ids 0..T-1), Emu3's special tokens (BOS, EOS, pad, the
row end ``<|extra_200|>``, end of frame ``<|extra_201|>``, ``<|image end|>``, ``<|image token|>``, ``<|image start|>``,
``<image>``) and one ``<|visual token k|>`` per code of photos-t2i's VQ (1024). A training sequence is Emu3's layout:

    BOS caption <|image start|> <|image token|>  row_0 <row end> ... row_15 <row end>  <eof> <eoi> EOS

left-padded in a batch (positions counted from the first real token, as vgen's adapter and transformers' generate
count them); the caption is dropped (the null prompt BOS <|image start|> <|image token|>) 10% of the time, for CFG.
The transformer starts from photos-t2i's GPT where shapes allow (blocks, code embeddings and head rows; the q / k rows
permuted from LlamaGen's interleaved RoPE pairs to transformers' halves; positions are 1-D here, so this is a warm
start, not a conversion). Images decode through photos-t2i's VQ (the Emu3 module's own VQ is untrained). Resumable.
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vgen.io import atomic_write_json
from vgen.models.hf.emu3_zoo import N_SPECIAL, Layout, vocabulary
from vgen.train.common import RecipeConfig, adamw, autocast, recipe, start_run, train_loop


@dataclass
class Emu3TrainConfig(RecipeConfig):
    out: str = "runs/photos-emu3"
    source: str = "vgen/zoo/photos-t2i"     # the pipeline whose VQ, caption tokenizer and GPT (warm start) it uses
    warm_start: bool = True
    install: bool = False                   # copy into the zoo as photos-emu3 (weights stored fp16)
    steps: int = 800
    batch_size: int = 32
    lr: float = 5e-4
    weight_decay: float = 0.05
    warmup: int = 50
    precision: str = "fp32"
    n_train: int = 24000
    n_test: int = 512
    save_every: int = 100
    caption_tokens: int = 32
    caption_dropout: float = 0.1
    model: dict = field(default_factory=lambda: dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                                                     num_attention_heads=4, num_key_value_heads=4))
    sampling: dict = field(default_factory=lambda: dict(cfg_scale=3.0, top_k=100, temperature=1.0, init="vertical"))


def build_model(words: int, codes: int, cfg: Emu3TrainConfig):
    from transformers import Emu3Config, Emu3ForConditionalGeneration, Emu3TextConfig, Emu3VQVAEConfig
    vmap, sp = vocabulary(words, codes)
    text = Emu3TextConfig(vocab_size=words + N_SPECIAL + codes, max_position_embeddings=512,
                          pad_token_id=sp["<|pad|>"], bos_token_id=sp["<|bos|>"], eos_token_id=sp["<|eos|>"],
                          attention_dropout=0.0, **cfg.model)
    vq = Emu3VQVAEConfig(codebook_size=codes, embed_dim=4, latent_channels=4, base_channels=32,
                         channel_multiplier=[1, 1], num_res_blocks=1, attn_resolutions=[], hidden_size=32,
                         temporal_downsample_factor=1)
    return Emu3ForConditionalGeneration(Emu3Config(vq_config=vq, text_config=text, vocabulary_map=vmap))


def warm_start(m, gpt_path: Path, words: int) -> int:
    """Copy photos-t2i's GPT blocks, code embeddings and head rows into the Emu3 text model where shapes match."""
    from vgen.kinds import read_checkpoint
    sd, _ = read_checkpoint(str(gpt_path))
    sd = {k: v.float() for k, v in sd.items()}
    text = m.model.text_model
    cfg = text.config
    hd = cfg.hidden_size // cfg.num_attention_heads
    copied = 0

    def put(dst: torch.Tensor, src: torch.Tensor) -> None:
        nonlocal copied
        if dst.shape == src.shape:
            dst.copy_(src)
            copied += 1

    def halves(w: torch.Tensor, heads: int) -> torch.Tensor:  # interleaved (x0, x1) pairs -> rotate_half layout
        w = w.view(heads, hd // 2, 2, -1)
        return w.transpose(1, 2).reshape(heads * hd, -1)

    with torch.no_grad():
        codes = sd["tok_embeddings.weight"].shape[0]
        vis = slice(words + N_SPECIAL, words + N_SPECIAL + codes)
        if text.embed_tokens.weight[vis].shape == sd["tok_embeddings.weight"].shape:
            text.embed_tokens.weight[vis] = sd["tok_embeddings.weight"]
            m.lm_head.weight[vis] = sd["output.weight"]
            copied += 2
        for i, layer in enumerate(text.layers):
            p = f"layers.{i}."
            if p + "attention.wqkv.weight" not in sd:
                break
            q, k, v = sd[p + "attention.wqkv.weight"].split(
                [cfg.hidden_size, cfg.num_key_value_heads * hd, cfg.num_key_value_heads * hd])
            put(layer.self_attn.q_proj.weight, halves(q, cfg.num_attention_heads))
            put(layer.self_attn.k_proj.weight, halves(k, cfg.num_key_value_heads))
            put(layer.self_attn.v_proj.weight, v)
            put(layer.self_attn.o_proj.weight, sd[p + "attention.wo.weight"])
            put(layer.mlp.gate_proj.weight, sd[p + "feed_forward.w1.weight"])
            put(layer.mlp.up_proj.weight, sd[p + "feed_forward.w3.weight"])
            put(layer.mlp.down_proj.weight, sd[p + "feed_forward.w2.weight"])
            put(layer.input_layernorm.weight, sd[p + "attention_norm.weight"])
            put(layer.post_attention_layernorm.weight, sd[p + "ffn_norm.weight"])
        put(text.norm.weight, sd["norm.weight"])
    return copied


def sequence_loss(m, layout: Layout, prompts, codes, device, reduction="mean"):
    ids, att, pos, lmask = (t.to(device) for t in layout.batch(prompts, codes))
    logits = m(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, :-1]
    tgt = ids[:, 1:].masked_fill(~lmask[:, 1:], -100)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100,
                           reduction=reduction)


@torch.no_grad()
def image_loss(m, layout: Layout, codes, facts, seed, device, batch: int = 64) -> float:
    """Mean cross-entropy (nats) of the visual tokens only, given true captions: comparable to photos-t2i's test loss."""
    from vgen.train.t2i import draw_captions
    m.eval()
    tot, n = 0.0, 0
    h, w = layout.grid
    for i in range(0, codes.shape[0], batch):
        idx = list(range(i, min(i + batch, codes.shape[0])))
        prompts = [layout.prompt(c) for c in draw_captions(facts, idx, seed + i)]
        ids, att, pos, _ = (t.to(device) for t in layout.batch(prompts, codes[idx].long()))
        logits = m(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, :-1]
        P = ids.shape[1] - layout.image(codes[idx[:1]].long()).shape[1]
        at = torch.tensor([P - 1 + j + j // w for j in range(h * w)], device=device)
        lv = logits[:, at, layout.words + N_SPECIAL: layout.words + N_SPECIAL + layout.codes]
        tot += F.cross_entropy(lv.float().reshape(-1, lv.shape[-1]), codes[idx].long().to(device).reshape(-1),
                               reduction="sum").item()
        n += len(idx) * h * w
    m.train()
    return tot / n


@recipe(Emu3TrainConfig)
def train_emu3(cfg: Emu3TrainConfig) -> dict:
    import numpy as np
    from transformers import AutoTokenizer

    from vgen.kinds import load_official
    from vgen.train.t2i import captioned_codes, draw_captions
    src = Path(cfg.source)
    needs = [(str(src / "vq.safetensors"), "photos-t2i VQ tokenizer", "vq")]
    if cfg.warm_start:
        needs.append((str(src / "gpt.safetensors"), "photos-t2i GPT (warm start)", "t2i"))
    run, device = start_run(cfg, needs=tuple(needs))
    vq = load_official("vq", str(src / "vq.safetensors"), device=device).eval()
    if not (run.path / "text" / "tokenizer.json").exists():
        tmp = run.path / ".text.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in (src / "text").iterdir():
            if f.name.startswith("tokenizer") or f.name.startswith("special"):
                shutil.copy(f, tmp / f.name)
        tmp.rename(run.path / "text")
    tok = AutoTokenizer.from_pretrained(str(run.path / "text"))
    tr_codes, tr_facts = captioned_codes(run.path, vq, "train", cfg.n_train, cfg.seed)
    te_codes, te_facts = captioned_codes(run.path, vq, "test", cfg.n_test, cfg.seed + 1)
    codes_n = int(vq.codebook().shape[0])
    side = int(round(tr_codes.shape[1] ** 0.5))
    m = build_model(len(tok), codes_n, cfg)
    copied = warm_start(m, src / "gpt.safetensors", len(tok)) if cfg.warm_start else 0
    m = m.to(device)
    m.model.vqmodel.requires_grad_(False)
    _, special = vocabulary(len(tok), codes_n)
    layout = Layout(tok, special, codes_n, (side, side), cfg.caption_tokens)
    opt = adamw(m.model.text_model, cfg.lr, cfg.weight_decay)
    opt.add_param_group({"params": [m.lm_head.weight], "weight_decay": cfg.weight_decay})
    g = torch.Generator()

    def step_fn(step):
        g.manual_seed(cfg.seed * 1_000_003 + step)
        idx = torch.randint(0, tr_codes.shape[0], (cfg.batch_size,), generator=g).tolist()
        drop = torch.rand(cfg.batch_size, generator=g) < cfg.caption_dropout
        caps = draw_captions(tr_facts, idx, cfg.seed * 1_000_003 + step)
        prompts = [layout.prompt(None if d else c) for c, d in zip(caps, drop.tolist())]
        with autocast(device, cfg.precision):
            loss = sequence_loss(m, layout, prompts, tr_codes[idx].long(), device)
        return loss, {}

    def on_save(step):
        if step % (cfg.save_every * 4) == 0 or step == cfg.steps:
            tl = image_loss(m, layout, te_codes, te_facts, 7, device)
            run.log({"step": step, "test_image_loss": tl})
            tqdm.write(f"step {step}: test loss of the visual tokens {tl:.4f} nats/token")

    np.random.seed(cfg.seed)
    step, last = train_loop(cfg, m, opt, run, step_fn, desc="emu3", clip=1.0, log_every=20, on_save=on_save)
    metrics = {"test_image_loss": image_loss(m, layout, te_codes, te_facts, 7, device),
               "train_loss_last": last if math.isfinite(last) else None, "steps": step,
               "params": sum(p.numel() for p in m.model.text_model.parameters()) + m.lm_head.weight.numel(),
               "warm_start_tensors": copied}
    run.log({"final": True, **metrics})
    folder = export(run.path / "pipeline", m, src, run.path / "text", special, (side, side), codes_n, cfg, metrics)
    if cfg.install:
        install(folder)
    return metrics


def export(folder: Path, m, src: Path, text: Path, special: dict, grid, codes: int, cfg: Emu3TrainConfig,
           metrics: dict, dtype=torch.float32) -> Path:
    """The zoo folder: hf/ (save_pretrained), text/ (the caption tokenizer), vq.safetensors, pipeline card."""
    from vgen.data.captions import prompt_set
    tmp = folder.parent / f".{folder.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    m.to(dtype).save_pretrained(tmp / "hf")
    m.float()
    shutil.copytree(text, tmp / "text")
    shutil.copy(src / "vq.safetensors", tmp / "vq.safetensors")
    card = {"name": "photos-emu3", "kind": "transformers", "hf": "hf", "text_tokenizer": "text",
            "tokenizer_kind": "vq", "tokenizer": "vq.safetensors", "token_shape": list(grid), "vocab_size": codes,
            "image_size": 64, "caption_tokens": cfg.caption_tokens, "special": special,
            "examples": [p for p, _ in prompt_set("subject", 16, 0)], "sampling": dict(cfg.sampling),
            "metrics": {**metrics, "stored_as": str(dtype).removeprefix("torch.")},
            "train": asdict(cfg)}
    atomic_write_json(tmp / "hf_pipeline.json", card)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def install(folder: Path, name: str = "photos-emu3") -> Path:
    """Copy an exported folder into the zoo, the transformer stored fp16 (loaded back as fp32)."""
    from transformers import Emu3ForConditionalGeneration

    from vgen.cards import ZOO_DIR
    dest, tmp = ZOO_DIR / name, ZOO_DIR / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    shutil.rmtree(tmp / "hf")
    Emu3ForConditionalGeneration.from_pretrained(folder / "hf", local_files_only=True).to(torch.float16) \
        .save_pretrained(tmp / "hf")
    card = json.loads((tmp / "hf_pipeline.json").read_text())
    card["metrics"]["stored_as"] = "float16 (loaded as float32)"
    atomic_write_json(tmp / "hf_pipeline.json", card)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
