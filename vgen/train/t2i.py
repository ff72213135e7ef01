"""Zoo recipe: the text-to-image pipeline ``photos-t2i``: a LlamaGen-T2I GPT over photos-gpt's VQ codes, captioned
photo crops (:mod:`vgen.data.captions`), and a zoo-sized T5 encoder with a tokenizer trained here on the captions.

1. the caption tokenizer (``tokenizers``), trained on the caption corpus before anything else (``text/``);
2. the crops of both splits encoded once with the VQ (``codes_<split>.pt``, their facts beside them);
3. the GPT (``model_type=t2i``, ``cls_token_num`` caption positions; its transformer, token table and head start
   from photos-gpt's weights unless ``init_gpt`` is empty) and the T5 encoder trained together end to end: each
   step draws a fresh caption of every crop (a random phrasing and subset of its facts, all true), tokenizes it,
   encodes it, left-pads it as ``sample_t2i.py`` does and feeds the GPT, 10% of captions replaced by the null
   caption for classifier-free guidance;
4. the pipeline folder: ``gpt.safetensors``, ``vq.safetensors``, ``text/`` (T5 encoder + tokenizer, loadable with
   ``T5EncoderModel`` / ``AutoTokenizer``) and ``pipeline.json`` (``conditioning: text``).

The text path at sampling time is the one FLAN-T5-XL takes for the released LlamaGen-T2I (:mod:`vgen.models.text`).
"""
from __future__ import annotations

import io
import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vgen.errors import VGenError
from vgen.io import atomic_write_bytes, atomic_write_json
from vgen.models.gpt import GPT, GPTConfig
from vgen.train.common import RecipeConfig, adamw, autocast, recipe, start_run, train_loop


@dataclass
class T2ITrainConfig(RecipeConfig):
    out: str = "runs/photos-t2i"
    tokenizer: str = "vgen/zoo/photos-gpt/vq.safetensors"   # the VQ (photos-gpt's: the same codes)
    init_gpt: str = "vgen/zoo/photos-gpt/gpt.safetensors"   # start the transformer here ('' = from scratch)
    init_pipeline: str = ""  # a photos-t2i pipeline folder to continue from (GPT, caption path, encoder, tokenizer)
    install: bool = False    # copy the pipeline into the zoo as photos-t2i (GPT stored fp16; any old drafter dropped)
    steps: int = 1000
    batch_size: int = 32
    lr: float = 5e-4
    weight_decay: float = 0.05
    warmup: int = 50
    precision: str = "fp32"
    n_train: int = 24000
    n_test: int = 512
    save_every: int = 100
    caption_tokens: int = 32      # the GPT's cls_token_num: the encoder's max length
    text_vocab: int = 1000
    subject_dropout: float = 0.0  # share of training captions without the subject (treatment_caption)
    treatments: int = 1           # looks per training crop: k > 1 adds each crop under k - 1 other treatments
    text: dict = field(default_factory=lambda: dict(d_model=128, d_kv=32, d_ff=512, num_layers=3, num_heads=4))
    model: dict = field(default_factory=lambda: dict(
        dim=256, n_layer=6, n_head=4, vocab_size=1024, block_size=256, class_dropout_prob=0.1,
        token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0))
    sampling: dict = field(default_factory=lambda: dict(cfg_scale=3.0, top_k=100, temperature=1.0, init="vertical"))


class T2I(torch.nn.Module):
    """The GPT and the T5 encoder, trained as one module (one optimiser, one checkpoint)."""

    def __init__(self, gpt: GPT, text):
        super().__init__()
        self.gpt, self.text = gpt, text


def text_encoder(folder: Path, cfg: T2ITrainConfig):
    from transformers import AutoTokenizer, T5Config, T5EncoderModel

    from vgen.models.text import TextEncoder
    tok = AutoTokenizer.from_pretrained(str(folder))
    t5 = T5EncoderModel(T5Config(vocab_size=len(tok), dropout_rate=0.0, feed_forward_proj="gated-gelu",
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **cfg.text))
    return TextEncoder(tok, t5, cfg.caption_tokens)


def caption_tokenizer(run_path: Path, cfg: T2ITrainConfig) -> Path:
    from vgen.data.captions import caption_corpus, train_text_tokenizer
    folder = run_path / "text"
    if not (folder / "tokenizer.json").exists():
        tmp = run_path / ".text.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        train_text_tokenizer(caption_corpus(20000, cfg.seed), tmp, vocab_size=cfg.text_vocab)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    return folder


@torch.no_grad()
def captioned_codes(run_path: Path, tokenizer, split: str, n: int, seed: int, variant: int = 0):
    """(codes int16 (n, L), facts list) of ``n`` captioned crops, cached as ``codes_<split>.pt`` + ``facts_<split>.json``
    (variant k > 0: the same crops under their k-th other treatment, ``codes_<split>_v<k>.pt``)."""
    from vgen.data import to_model_range
    from vgen.data.captions import captioned_photos
    tag = f"{split}_v{variant}" if variant else split
    path, fpath = run_path / f"codes_{tag}.pt", run_path / f"facts_{tag}.json"
    if path.exists() and fpath.exists():
        codes = torch.load(path, weights_only=True)["codes"]
        facts = json.loads(fpath.read_text())
        if codes.shape[0] == n == len(facts):
            return codes, facts
    data = captioned_photos(split, n, seed=seed, variant=variant)
    device = next(tokenizer.parameters()).device
    codes = []
    for i in tqdm(range(0, n, 128), desc=f"encode {tag}", leave=False):
        codes.append(tokenizer.encode_to_codes(to_model_range(data.images[i:i + 128].to(device))).to(torch.int16).cpu())
    codes = torch.cat(codes)
    facts = [f if isinstance(f, dict) else asdict(f) for f in data.facts]
    buf = io.BytesIO()
    torch.save({"codes": codes}, buf)
    atomic_write_bytes(path, buf.getvalue())
    atomic_write_json(fpath, facts)
    return codes, facts


def draw_captions(facts: list[dict], idx: list[int], seed: int, subject_dropout: float = 0.0) -> list[str]:
    """A fresh true caption of each crop ``idx``; with probability ``subject_dropout`` one without the subject
    (:func:`vgen.data.captions.treatment_caption`), drawn from a stream of its own (0 = the captions as before)."""
    from vgen.data.captions import CropFacts, caption, treatment_caption
    rng = np.random.default_rng(seed)
    drop = np.random.default_rng([seed, 5]).random(len(idx)) < subject_dropout if subject_dropout \
        else [False] * len(idx)
    return [treatment_caption(CropFacts(**facts[i]), rng) if d else caption(CropFacts(**facts[i]), rng)
            for i, d in zip(idx, drop)]


def deepen(sd: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """A GPT state dict grown to ``n_layer`` layers, computing the same function: old layer ``i`` becomes layers
    ``k*i .. k*i + k - 1`` (``k = n_layer / old``), the repeats with their attention and feed-forward output
    projections zeroed, so each is the identity on the residual stream until trained (Net2DeeperNet's idea)."""
    old = 1 + max((int(k.split(".")[1]) for k in sd if k.startswith("layers.")), default=-1)
    if n_layer == old:
        return sd
    if old == 0 or n_layer < old or n_layer % old:
        raise VGenError(f"recipe.model.n_layer={n_layer} must be a multiple of the GPT continued from ({old} layers) "
                        "to grow it: give a multiple, or the same depth")
    k = n_layer // old
    out = {key: v for key, v in sd.items() if not key.startswith("layers.")}
    for key, v in sd.items():
        if key.startswith("layers."):
            _, i, rest = key.split(".", 2)
            for r in range(k):
                zero = r > 0 and rest in ("attention.wo.weight", "feed_forward.w2.weight")
                out[f"layers.{int(i) * k + r}.{rest}"] = torch.zeros_like(v) if zero else v.clone()
    return out


def init_from(gpt: GPT, path: str) -> int:
    """Copy a class-conditional GPT's transformer, token table and head (not its class table): tensors copied."""
    from vgen.kinds import read_checkpoint
    sd, _ = read_checkpoint(path)
    own = gpt.state_dict()
    keep = {k: v for k, v in sd.items() if k in own and not k.startswith("cls_embedding.") and own[k].shape == v.shape}
    gpt.load_state_dict(keep, strict=False)
    return len(keep)


@torch.no_grad()
def test_loss(m: T2I, codes: torch.Tensor, facts: list[dict], seed: int, batch: int = 64) -> float:
    m.eval()
    tot, n = 0.0, 0
    for i in range(0, codes.shape[0], batch):
        idx = list(range(i, min(i + batch, codes.shape[0])))
        x = codes[idx].long().to(next(m.parameters()).device)
        ids, mask = m.text.tokenize(draw_captions(facts, idx, seed + i))
        logits = m.gpt(x, m.text.features(ids, mask))
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1), reduction="sum").item()
        n += x.numel()
    m.train()
    return tot / n


@recipe(T2ITrainConfig)
def train_t2i(cfg: T2ITrainConfig) -> dict:
    from vgen.kinds import load_official
    if not 0.0 <= cfg.subject_dropout <= 1.0:
        raise VGenError(f"recipe.subject_dropout is a share of the captions: give a number in [0, 1], got "
                        f"{cfg.subject_dropout}")
    if not 1 <= cfg.treatments <= 4:
        raise VGenError(f"recipe.treatments is how many looks each training crop has: give 1 to 4, got "
                        f"{cfg.treatments}")
    init = Path(cfg.init_pipeline) if cfg.init_pipeline else None
    needs = [(cfg.tokenizer, "VQ tokenizer", "vq")]
    if init is not None:
        needs += [(str(init / "gpt.safetensors"), "photos-t2i GPT to continue from", "t2i"),
                  (str(init / "text" / "model.safetensors"), "photos-t2i text encoder to continue from", "t2i")]
    elif cfg.init_gpt:
        needs += [(cfg.init_gpt, "GPT to start from", "gpt")]
    init_sd = None
    if init is not None and (init / "gpt.safetensors").is_file():  # a depth it cannot grow to fails before the run
        from vgen.kinds import read_checkpoint
        depth = int(cfg.model.get("n_layer", GPTConfig.n_layer))
        init_sd = deepen(read_checkpoint(str(init / "gpt.safetensors"))[0], depth)
    run, device = start_run(cfg, needs=tuple(needs))
    vq = load_official("vq", cfg.tokenizer, device=device).eval()
    if init is not None and not (run.path / "text" / "tokenizer.json").exists():  # its caption tokenizer
        tmp = run.path / ".text.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(init / "text", tmp)
        tmp.rename(run.path / "text")
    text_folder = caption_tokenizer(run.path, cfg)
    tr_codes, tr_facts = captioned_codes(run.path, vq, "train", cfg.n_train, cfg.seed)
    for k in range(1, cfg.treatments):  # the same crops under other looks
        codes, facts = captioned_codes(run.path, vq, "train", cfg.n_train, cfg.seed, variant=k)
        tr_codes, tr_facts = torch.cat([tr_codes, codes]), tr_facts + facts
    te_codes, te_facts = captioned_codes(run.path, vq, "test", cfg.n_test, cfg.seed + 1)
    if init is not None:  # the trained encoder (its weights travel in text/ with the tokenizer)
        from vgen.models.text import TextEncoder
        text = TextEncoder.load(text_folder, cfg.caption_tokens).train()
    else:
        text = text_encoder(text_folder, cfg)
    gpt = GPT(GPTConfig(model_type="t2i", cls_token_num=cfg.caption_tokens, caption_dim=text.dim, **cfg.model))
    if init_sd is not None:  # every tensor, caption projection included (a deeper GPT: each layer repeated)
        gpt.load_state_dict({k: v.float() for k, v in init_sd.items()})
        copied = len(init_sd)
    else:
        copied = init_from(gpt, cfg.init_gpt) if cfg.init_gpt else 0
    m = T2I(gpt, text).to(device)
    opt = adamw(m, cfg.lr, cfg.weight_decay)
    g = torch.Generator()

    def step_fn(step):
        g.manual_seed(cfg.seed * 1_000_003 + step)
        idx = torch.randint(0, tr_codes.shape[0], (cfg.batch_size,), generator=g).tolist()
        x = tr_codes[idx].long().to(device)
        ids, mask = m.text.tokenize(draw_captions(tr_facts, idx, cfg.seed * 1_000_003 + step, cfg.subject_dropout))
        with autocast(device, cfg.precision):
            logits = m.gpt(x, m.text.features(ids, mask))
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x.reshape(-1)), {}

    def on_save(step):
        if step % (cfg.save_every * 5) == 0 or step == cfg.steps:
            tl = test_loss(m, te_codes, te_facts, 7)
            run.log({"step": step, "test_loss": tl})
            tqdm.write(f"step {step}: test loss {tl:.4f} nats/token (perplexity {math.exp(tl):.1f})")

    step, last = train_loop(cfg, m, opt, run, step_fn, desc="t2i", clip=1.0, log_every=20, on_save=on_save)
    metrics = {"test_loss": test_loss(m, te_codes, te_facts, 7),
               "train_loss_last": last if math.isfinite(last) else None, "steps": step,
               "gpt_params": sum(p.numel() for p in gpt.parameters()),
               "text_params": sum(p.numel() for p in text.parameters()), "init_tensors_copied": copied}
    run.log({"final": True, **metrics})
    export(run.path / "pipeline", m, vq, cfg, metrics)
    if cfg.install:
        install(run.path / "pipeline")
    return metrics


def install(folder: Path, name: str = "photos-t2i") -> Path:
    """Copy a t2i pipeline folder into the zoo as ``name``: the GPT stored as fp16 (loaded back as fp32), the text
    encoder and the VQ as trained. A drafter of the pipeline it replaces is not kept (it drafted for other
    weights): train one with ``vgen train recipe=drafter model=photos-t2i recipe.install=true``."""
    from vgen.cards import ZOO_DIR
    from vgen.kinds import load_official
    from vgen.train.zoo import store_fp16
    dest, tmp = ZOO_DIR / name, ZOO_DIR / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    store_fp16(load_official("gpt", folder / "gpt.safetensors"), "gpt", tmp)
    card = json.loads((tmp / "pipeline.json").read_text())
    card["name"] = name
    card["metrics"]["stored_as"] = "gpt fp16 (loaded as fp32), text encoder and VQ fp32"
    atomic_write_json(tmp / "pipeline.json", card)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def export(folder: Path, m: T2I, vq, cfg: T2ITrainConfig, metrics: dict) -> Path:
    """The pipeline folder (weights in the official layouts, the card)."""
    from vgen.data.captions import prompt_set
    from vgen.io import save_safetensors
    folder.mkdir(parents=True, exist_ok=True)
    gpt = m.gpt
    save_safetensors(gpt.state_dict(), folder / "gpt.safetensors",
                     metadata={"config": json.dumps(gpt.config_dict()), "train": json.dumps(asdict(cfg))})
    save_safetensors(vq.state_dict(), folder / "vq.safetensors", metadata={"config": json.dumps(vq.config_dict())})
    shutil.rmtree(folder / "text", ignore_errors=True)
    m.text.save(folder / "text")
    examples = [p for p, _ in prompt_set("subject", 16, 0)]  # every subject: bench and window=auto sample them in turn
    card = {"name": "photos-t2i", "model_kind": "gpt", "model": "gpt.safetensors", "tokenizer_kind": "vq",
            "tokenizer": "vq.safetensors", "generation": "next-token", "conditioning": "text", "text_encoder": "text",
            "token_shape": list(gpt.token_shape), "vocab_size": gpt.vocab_size, "image_size": 64,
            "examples": examples, "sampling": dict(cfg.sampling), "metrics": metrics}
    atomic_write_json(folder / "pipeline.json", card)
    return folder
