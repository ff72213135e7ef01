"""Pipelines: a token model + its tokenizer + recommended sampling settings, loaded from the embedded zoo
(``vgen/zoo/<name>/``) or from any folder with the same layout:

    pipeline.json        the card (vgen.cards.Card): {"model_kind": "gpt", "model": "gpt.safetensors",
                          "tokenizer_kind": "vq", "tokenizer": "vq.safetensors", "class_names": [...],
                          "sampling": {...}}
    gpt.safetensors      official key layout, config in the safetensors metadata
    vq.safetensors
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vgen import validate
from vgen.cards import Card, model_facts, split_draft
from vgen.conditions import kind_of
from vgen.errors import VGenError
from vgen.kinds import load_official
from vgen.samplers import check_fits, get_sampler, plain_sampler, sampler_class


def resolve_sampler(card: Card, sampler: str, **options):
    """The sampler a pipeline would run: card defaults, overridden by the non-None ``options``, checked against
    the card (order, vocabulary, classes, the draft it needs). Needs only the card: callers check input before any
    weights load."""
    check_fits(sampler, card)
    Options = sampler_class(sampler, card).Options
    given = Options.normalize({k: v for k, v in options.items() if v is not None})
    s = get_sampler(sampler, card, **{**card.sampling_options(Options), **given})
    s.validate(card)
    if s.needs_draft and s.draft_kind == "head":
        card.drafter_path(s.options.drafter)
    elif s.needs_draft:
        card.draft_card(s.options.draft)
    return s


@dataclass
class Generation:
    """What ``Pipeline.generate`` returns. ``pixels``: uint8 images (N, 3, H, W) or videos (N, T, 3, H, W);
    ``tokens``: codes (int64) (N, seq_len) or latents (float) (N, seq_len, channels), in raster order."""
    pixels: torch.Tensor
    tokens: torch.Tensor
    labels: torch.Tensor | None  # (N,) class ids; None for a text model
    seeds: list[int]
    stats: dict = field(default_factory=dict)
    step_map: torch.Tensor | None = None  # (N, seq_len): forward pass at which each token was decided (0 = prefill)
    prompts: list[str] | None = None  # a text model's prompts, one per sample

    @property
    def images(self) -> torch.Tensor:
        if self.pixels.dim() != 4:
            raise VGenError("this generation holds videos (N, T, 3, H, W): use .videos")
        return self.pixels

    @property
    def videos(self) -> torch.Tensor:
        if self.pixels.dim() != 5:
            raise VGenError("this generation holds images (N, 3, H, W): use .images")
        return self.pixels

    @property
    def is_video(self) -> bool:
        return self.pixels.dim() == 5

    def save(self, folder, indices: list[int] | None = None, fps: int = 8) -> list[Path]:
        """Write sample k (index ``indices[k]``, default 0..N-1), atomically: an image as ``<index:06d>.png``; a
        clip as ``<index:06d>.gif`` and ``<index:06d>.strip.png`` (its frames in a row), then
        ``<index:06d>.mp4`` last (H.264), so an existing MP4 means the sample is complete. Returns the PNG or
        MP4 paths."""
        from vgen.io import frame_strip, save_gif, save_mp4, save_png
        indices = list(range(len(self.pixels))) if indices is None else list(indices)
        folder = validate.outdir(folder, "folder")
        paths = []
        for i, x in zip(indices, self.pixels):
            if self.is_video:
                save_gif(folder / f"{i:06d}.gif", x, fps)
                save_png(folder / f"{i:06d}.strip.png", frame_strip(x))
                save_mp4(folder / f"{i:06d}.mp4", x, fps)
                paths.append(folder / f"{i:06d}.mp4")
            else:
                save_png(folder / f"{i:06d}.png", x)
                paths.append(folder / f"{i:06d}.png")
        return paths


class Pipeline:
    """A model, its tokenizer and the card (:class:`vgen.cards.Card`: recommended settings, class names). A card
    given as a dict (a pipeline built in memory) is read on top of the model's facts."""

    def __init__(self, model, tokenizer, card: Card | dict | None = None, text_encoder=None):
        self.model = model.eval()
        self.tokenizer = tokenizer.eval()
        self.card = card if isinstance(card, Card) else Card.from_model(model, card)
        self.text_encoder = text_encoder  # prompts -> caption features (vgen.models.text.TextEncoder); text models
        kind = kind_of(self.card)
        if kind.needs_text_encoder and text_encoder is None:
            raise VGenError(f"{self.card.name} reads prompts: give its text encoder (Pipeline(model, tokenizer, card, "
                            "text_encoder=TextEncoder.load(folder, model.cond_len)))")
        if hasattr(model, "attach_tokenizer"):  # next-scale models build each scale's input with the tokenizer
            model.attach_tokenizer(tokenizer)
        calibration = kind.calibration(self.card)  # what window=auto calibrates on (vgen.samplers.example_cond)
        if calibration is not None:
            model.examples = self.encode(calibration)

    @classmethod
    def from_pretrained(cls, name_or_path: str = "photos-gpt", device="cpu", dtype=None, quantize: str | None = None,
                        quantize_group: int = 32) -> Pipeline:
        device, dtype = validate.device(device), validate.dtype(dtype)
        return cls.from_card(Card.load(validate.name_or_path(name_or_path)), device, dtype, quantize, quantize_group)

    @classmethod
    def from_card(cls, card: Card, device="cpu", dtype=None, quantize: str | None = None,
                  quantize_group: int = 32) -> Pipeline:
        """The pipeline a loaded card describes: its model and tokenizer files read; ``quantize``: the model's linear
        layers quantized while they load (:func:`vgen.models.loading.load_official`), as :meth:`quantize` would."""
        from vgen.kernels.quant import check_mode
        device, dtype = validate.device(device), validate.dtype(dtype)
        quantize = check_mode(quantize, quantize_group)
        card.check_files()
        text = None
        needs_text = kind_of(card).needs_text_encoder
        if needs_text:
            from vgen.models.text import check_folder, find_folder
            check_folder(find_folder(card.text_encoder_path))  # before any weights load
        model = load_official(card.model_kind, card.model_path, device=device, dtype=dtype, quantize=quantize,
                              quantize_group=quantize_group, **card.model_config)
        tok = load_official(card.tokenizer_kind, card.tokenizer_path, device=device)
        if needs_text:
            from vgen.models.text import TextEncoder
            text = TextEncoder.load(card.text_encoder_path, model.cond_len, device=device)
        pipe = cls(model, tok, card, text)
        if quantize is not None:
            from vgen.kernels.quant import summary
            pipe.quantization = {"mode": quantize, "group_size": quantize_group if quantize == "int4" else None,
                                 **summary(model, tuple(getattr(model, "quantize_skip", ())))}
        return pipe

    def quantize(self, mode: str, group_size: int = 32) -> dict:
        """The model's linear layers in int8 / int4 weights (:func:`vgen.kernels.quant.quantize_model`; the model
        class's ``quantize_skip`` names children kept in float, such as a diffusion head); the tokenizer and the text
        encoder stay as they are. Returns ``{"mode", "group_size", "quantized", "kept", "weight_bytes"}``, kept in
        ``self.quantization`` and recorded in the stats of every job run with it."""
        from vgen.kernels.quant import quantize_model
        info = quantize_model(self.model, mode, group_size)
        self.quantization = {"mode": mode, "group_size": group_size if mode == "int4" else None, **info}
        return self.quantization

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    @property
    def class_names(self) -> list[str]:
        return list(self.card.class_names or [str(i) for i in range(self.num_classes)])

    @property
    def device(self):
        return next(self.model.parameters()).device

    def make_sampler(self, sampler: str | None = None, **options):
        """The sampler ``generate`` would run (default: the model's plain one), card settings filled in."""
        s = resolve_sampler(self.card, sampler or plain_sampler(self.model), **options)
        s.validate(self.model)
        return s

    def condition(self, labels=None, prompts=None):
        """``labels`` or ``prompts`` checked against the card (:mod:`vgen.conditions`)."""
        return self.card.condition(labels, prompts)

    @torch.inference_mode()
    def encode(self, cond) -> torch.Tensor:
        """A condition -> what the samplers read, by its kind (:mod:`vgen.conditions`): class ids (N,), or a text
        model's caption features (N, T, D) (each prompt encoded on its own: the same bytes in any batch)."""
        return kind_of(cond.kind).encode(self, cond)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Flat tokens (N, seq_len) -> uint8 pixels (images (N, 3, H, W); for a (t, h, w) token grid, clips
        (N, T, 3, H, W) decoded frame by frame), through the tokenizer on the model's token shape, one sample
        at a time and (on CPU) on one thread, so the bytes depend neither on the batch nor on the process's thread
        count (convolutions round differently with more threads; torchrun gives each process one thread)."""
        from vgen.data import to_uint8
        shape = tuple(self.model.token_shape)
        threads = torch.get_num_threads()
        if self.device.type == "cpu":
            torch.set_num_threads(1)
        try:
            if len(shape) == 3:  # a clip, tokenized frame by frame: its frames decode as one batch
                return torch.stack([to_uint8(self.tokenizer.decode(t.view(*shape, *t.shape[1:]))) for t in tokens]).cpu()
            # latents keep their channels last: (h, w, C)
            return torch.cat([to_uint8(self.tokenizer.decode(t.view(1, *shape, *t.shape[1:]).to(self.device)))
                              for t in tokens]).cpu()
        finally:
            torch.set_num_threads(threads)

    def draft_for(self, sampler):
        """What ``sampler`` drafts with: a draft model (cspd) or a draft head (eagle), loaded once and kept."""
        if sampler.draft_kind == "head":
            from vgen.models.drafter import head_for
            return head_for(self.__dict__.setdefault("_heads", {}), self.card.drafter_path(sampler.options.drafter),
                            self.model, self.device)
        return self.draft_model(sampler.options.draft)

    def draft_model(self, name: str = ""):
        """The draft model a speculative sampler runs next to this one: ``name`` (a zoo name or pipeline folder;
        '' = the card's ``draft``; ``self``: this model), with ``@int8`` / ``@int4`` a copy in those weights
        (:func:`vgen.cards.split_draft`; int4 in groups of 32); loaded once and kept."""
        name = name or self.card.draft
        drafts = self.__dict__.setdefault("_drafts", {})
        if name not in drafts:
            base, mode = split_draft(name)
            if base == "self":
                model = copy.deepcopy(self.model) if mode else self.model
                if mode:
                    from vgen.kernels.quant import quantize_model
                    quantize_model(model, mode, 32)
            else:  # quantized while it loads
                model = Pipeline.from_card(self.card.draft_card(base), device=self.device, quantize=mode).model
            drafts[name] = model
        return drafts[name]

    @torch.inference_mode()
    def encode_prompt(self, prompt, frames: int, n: int) -> torch.Tensor:
        """The first ``frames`` frames of a clip (uint8 (T, 3, H, W)) or of one clip per sample ((n, T, 3, H, W))
        -> the token prefix (n, frames * h * w) that frame-conditioned generation continues."""
        from vgen.data import to_model_range
        self.card.check_prompt(prompt, frames)
        clips = prompt.unsqueeze(0) if prompt.dim() == 4 else prompt
        if clips.shape[0] not in (1, n):
            raise VGenError(f"got {clips.shape[0]} prompt clips for {n} samples: give one clip, or one per sample")
        t, h, w = self.model.token_shape
        x = to_model_range(clips[:, :frames].flatten(0, 1).to(self.device))
        codes = self.tokenizer.encode(x)
        if tuple(codes.shape[-2:]) != (h, w):
            raise VGenError(f"prompt frames of {x.shape[-2]}x{x.shape[-1]} pixels give {codes.shape[-2]}x"
                            f"{codes.shape[-1]} tokens but this model's frames are {h}x{w} tokens: resize the clip")
        return codes.reshape(clips.shape[0], -1).expand(n, -1).contiguous()

    def generate(self, labels=None, sampler: str | None = None, seed: int = 0, batch_size: int | None = None,
                 progress: bool = False, seeds: list[int] | None = None, prompt: torch.Tensor | None = None,
                 prompt_frames: int = 1, prompts: list[str] | str | None = None, **options) -> Generation:
        """Sample for ``labels`` (a class model) or ``prompts`` (a text model) with ``sampler`` (default: the model's
        plain one); sample i uses seed ``seed + i`` (or ``seeds[i]``) whatever the batching. Video models:
        ``prompt`` (uint8 (T, 3, H, W), one clip for all samples, or (N, T, 3, H, W)) gives the first
        ``prompt_frames`` frames; the rest is generated from them (frame-conditioned generation)."""
        condition = self.card.condition(labels, prompts)
        n = len(condition)
        if seeds is not None and len(seeds) != n:
            what = kind_of(condition.kind).noun
            raise VGenError(f"got {len(seeds)} seeds for {n} {what}s: give one seed per {what}")
        sampler = sampler or plain_sampler(self.model)
        s = self.make_sampler(sampler, **options)
        cond = self.encode(condition)
        prefix = None if prompt is None else self.encode_prompt(prompt, prompt_frames, n)
        if seeds is None:
            seed = validate.seed(seed, n)
            seeds = [seed + i for i in range(n)]
        else:
            seeds = [validate.seed(x) for x in seeds]
        s, tokens, pixels, stats, step_map = sample_and_decode(self, s, cond, seeds, batch_size, progress, prefix)
        stats.update(sampler=sampler, options=dataclasses.asdict(s.options))
        given = condition.record()  # {"labels": [...]} or {"prompts": [...]}
        labels = torch.tensor(given["labels"]) if "labels" in given else None
        return Generation(pixels, tokens, labels, seeds, stats, step_map, given.get("prompts"))

    def sample_tokens(self, sampler, cond: torch.Tensor, seeds: list[int], batch_size: int | None = None,
                      progress: bool = False, prefix: torch.Tensor | None = None):
        """Run ``sampler`` (from :meth:`make_sampler`) on this pipeline's model with what it needs wired in (the
        tokenizer's codebook, the draft model or head): (tokens (N, seq_len), stats). ``generate`` and the bench
        both sample through here."""
        codebook = self.tokenizer.codebook() if sampler.needs_codebook else None
        draft = self.draft_for(sampler) if sampler.needs_draft else None
        return sampler(self.model, cond.to(self.device), seeds, progress=progress, codebook=codebook,
                       batch_size=batch_size, prefix=prefix, draft=draft)


def sample_and_decode(pipe, sampler, cond: torch.Tensor, seeds: list[int], batch_size: int | None = None,
                      progress: bool = False, prefix: torch.Tensor | None = None):
    """The one path of every pipeline's ``generate`` (:class:`vgen.interfaces.SamplingPipeline`) from a sampler to
    pixels: ``compile=auto`` decided for this call's job (so the stats say what ran), the sampler run through
    ``pipe.sample_tokens``, its tokens decoded. Returns (the sampler as run, tokens (N, seq_len) on the CPU, pixels,
    stats with ``num_samples``, ``sample_seconds`` and ``decode_seconds``, the step map or None)."""
    n = cond.shape[0]
    s = sampler.resolved(pipe.model, n, batch_size or n)
    t0 = time.perf_counter()
    tokens, stats = pipe.sample_tokens(s, cond, seeds, batch_size=batch_size, progress=progress, prefix=prefix)
    tokens = tokens.cpu()
    step_map = stats.pop("step_map", None)
    t1 = time.perf_counter()
    pixels = pipe.decode(tokens)
    stats.update(num_samples=n, sample_seconds=t1 - t0, decode_seconds=time.perf_counter() - t1)
    return s, tokens, pixels, stats, None if step_map is None else step_map.cpu()


_LOADERS: list[tuple] = []  # (accepts(name), load(name, device=, dtype=, **options), card(name)): other pipeline kinds
LOADER_GROUP = "vgen.loaders"  # entry points: modules that call register_loader when imported


def register_loader(accepts, load, card=None) -> None:
    """Let ``load_pipeline`` hand names ``accepts`` recognises to ``load``, and :func:`load_card` to ``card`` (their
    :class:`Card`, read without loading weights; its ``model_kind`` names the loader's kind and ``model_file`` the
    name to load). :mod:`vgen.hf_pipeline` registers transformers folders, cached ``hf://`` repos and the zoo's
    transformers models (kind ``transformers``). A package of its own declares its module under the entry-point group
    ``vgen.loaders`` (as vgen's pyproject.toml does for :mod:`vgen.hf_pipeline`): it is imported on the first load.
    A ``load`` with parameters ``quantize`` and ``quantize_group`` quantizes as the weights load; any other loader's
    pipeline is quantized after it loads (its ``quantize(mode, group_size)``)."""
    _LOADERS.append((accepts, load, card))


def loaders() -> list[tuple]:
    """The registered loaders, after importing every module declared under the ``vgen.loaders`` entry points (once
    per process, on first use: importing vgen loads none of them)."""
    from vgen.plugins import load_group
    load_group(LOADER_GROUP)
    return _LOADERS


def load_card(name) -> Card:
    """The card of any pipeline ``load_pipeline`` loads, before any weights load (a sampling job's checks)."""
    for accepts, _, card in loaders():
        if card is not None and accepts(name):
            return card(name)
    return Card.load(name)


def _load_quantized(load, name, device, dtype, quantize: str | None, group_size: int, **options):
    """A registered loader's pipeline in ``quantize``: by the loader as the weights load when it takes ``quantize``
    (the transformers loaders), else quantized after."""
    if quantize is not None and "quantize" in inspect.signature(load).parameters:
        return load(name, device=device, dtype=dtype, quantize=quantize, quantize_group=group_size, **options)
    pipe = load(name, device=device, dtype=dtype, **options)
    if quantize is not None:
        pipe.quantize(quantize, group_size)
    return pipe


def pipeline_for(card: Card, device="cpu", dtype=None, quantize: str | None = None, quantize_group: int = 32):
    """The pipeline a card from :func:`load_card` describes: a vgen :class:`Pipeline`, or a registered kind's;
    ``quantize`` as :func:`load_pipeline`'s."""
    from vgen.kernels.quant import check_mode
    quantize = check_mode(quantize, quantize_group)  # before any weights load
    for accepts, load, make_card in loaders():
        if make_card is not None and card.external and accepts(card.model_file):
            return _load_quantized(load, card.model_file, device, dtype, quantize, quantize_group)
    return Pipeline.from_card(card, device=device, dtype=dtype, quantize=quantize, quantize_group=quantize_group)


def load_pipeline(name: str = "photos-gpt", device="cpu", dtype=None, quantize: str | None = None,
                  quantize_group: int = 32, **options):
    """A zoo pipeline by name (``vgen.list_models()``) or a folder holding ``pipeline.json``, on ``device``, its
    model in ``dtype`` (None: as stored). ``quantize="int8" | "int4"`` stores the sampled transformer's weight
    matrices in fewer bits (weight-only: activations, the KV cache and the logits keep ``dtype``; int4 in groups of
    ``quantize_group`` inputs; :mod:`vgen.kernels.quant`). A transformers image generator (Janus, Emu3, Lumina-mGPT,
    Anole: a save_pretrained folder, or ``hf://owner/repo`` in the local cache; :mod:`vgen.hf_pipeline`) takes
    options ``height``, ``width``, ``negative_prompt``."""
    from vgen.kernels.quant import check_mode
    quantize = check_mode(quantize, quantize_group)  # before any weights load
    for accepts, load, _ in loaders():
        if accepts(name):
            return _load_quantized(load, name, device, dtype, quantize, quantize_group, **options)
    if options:
        raise VGenError(f"unknown option(s) {sorted(options)} for a vgen pipeline (they are for hf:// models)")
    return Pipeline.from_pretrained(name, device=device, dtype=dtype, quantize=quantize, quantize_group=quantize_group)


LLAMAGEN_T2I = {  # stage -> (GPT file, tokens per side, pixels per side); FoundationVision/LlamaGen's releases
    1: ("t2i_XL_stage1_256.pt", 16, 256),
    2: ("t2i_XL_stage2_512.pt", 32, 512),
}
LLAMAGEN_T2I_SOURCES = {
    "t2i_XL_stage1_256.pt": "https://huggingface.co/peizesun/llamagen_t2i/resolve/main/t2i_XL_stage1_256.pt",
    "t2i_XL_stage2_512.pt": "https://huggingface.co/peizesun/llamagen_t2i/resolve/main/t2i_XL_stage2_512.pt",
    "vq_ds16_t2i.pt": "https://huggingface.co/peizesun/llamagen_t2i/resolve/main/vq_ds16_t2i.pt",
    "flan-t5-xl": "huggingface-cli download google/flan-t5-xl --local-dir flan-t5-xl",
}


def llamagen_t2i_card(folder, stage: int = 1, text_encoder: str = "flan-t5-xl") -> Path:
    """Write ``pipeline.json`` for the released LlamaGen-T2I files in ``folder`` (loaded unchanged): the stage-1
    (256 px, 16x16 tokens) or stage-2 (512 px, 32x32, ``block_size`` 1024) GPT-XL, ``vq_ds16_t2i.pt`` and the
    FLAN-T5-XL folder (``text_encoder``: a folder name inside ``folder``, an absolute path or a hub id in the local
    cache), with the official sampling defaults (cfg 7.5, top-k 1000). A missing file is named when the pipeline
    loads, with where it comes from."""
    from vgen.io import atomic_write_json
    if stage not in LLAMAGEN_T2I:
        raise VGenError(f"stage must be 1 (256 px) or 2 (512 px), got {stage!r}")
    gpt, side, px = LLAMAGEN_T2I[stage]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    card = {"name": f"llamagen-t2i-xl-stage{stage}", "model_kind": "gpt", "model": gpt, "tokenizer_kind": "vq",
            "tokenizer": "vq_ds16_t2i.pt", "generation": "next-token", "conditioning": "text",
            "text_encoder": text_encoder, "token_shape": [side, side], "vocab_size": 16384, "image_size": px,
            "model_config": {"block_size": side * side, "cls_token_num": 120},
            "sampling": {"cfg_scale": 7.5, "top_k": 1000, "temperature": 1.0, "top_p": 1.0},
            "examples": ["a photo of an astronaut riding a horse on the moon",
                         "a bowl of fruit on a wooden table, oil painting",
                         "a red double-decker bus on a rainy street in London"],
            "sources": {k: v for k, v in LLAMAGEN_T2I_SOURCES.items() if k in (gpt, "vq_ds16_t2i.pt", text_encoder)}}
    atomic_write_json(folder / "pipeline.json", card)
    return folder


def save_pipeline(folder, model, tokenizer, model_kind: str = "gpt", tokenizer_kind: str = "vq",
                  class_names: list[str] | None = None, sampling: dict | None = None, extra: dict | None = None,
                  text_encoder=None, examples: list[str] | None = None) -> Path:
    """Write a pipeline folder (weights in the official key layout, config in the safetensors metadata). A text
    model also needs its ``text_encoder`` (:class:`vgen.models.text.TextEncoder`, saved in ``text/``) and a few
    ``examples`` prompts (calibration, benchmarks, the demo)."""
    from vgen.io import atomic_write_json, save_safetensors
    folder = Path(folder)
    text = kind_of(model).needs_text_encoder
    if text and text_encoder is None:
        raise VGenError("a text model's pipeline needs its text encoder: save_pipeline(..., text_encoder=...)")
    folder.mkdir(parents=True, exist_ok=True)
    mfile, tfile = f"{model_kind}.safetensors", f"{tokenizer_kind}.safetensors"
    save_safetensors(model.state_dict(), folder / mfile, metadata={"config": json.dumps(model.config_dict())})
    save_safetensors(tokenizer.state_dict(), folder / tfile, metadata={"config": json.dumps(tokenizer.config_dict())})
    card = {"model_kind": model_kind, "model": mfile, "tokenizer_kind": tokenizer_kind, "tokenizer": tfile,
            **model_facts(model), "sampling": sampling or {}, **(extra or {})}
    if text:
        text_encoder.save(folder / "text")
        card.update(text_encoder="text", examples=list(examples or ["a photo"]))
    else:
        card["class_names"] = class_names or [str(i) for i in range(model.num_classes)]
    down = getattr(getattr(tokenizer, "config", None), "downsample", None)
    if isinstance(down, int) and len(model.token_shape) > 1:  # pixels per side of an image or frame
        card.setdefault("image_size", model.token_shape[-1] * down)
    atomic_write_json(folder / "pipeline.json", card)
    return folder
