"""A pipeline over a transformers image generator: ``vgen.load_pipeline("hf://deepseek-community/Janus-Pro-1B")`` (a
hub repository in the local cache; never downloaded) or ``vgen.load_pipeline("<folder written by save_pretrained>")``.

Prompts go through the model's own processor (Janus: its chat template, ``generation_mode="image"``; Emu3:
``return_for_image_generation=True``, which also gives the grid), each prompt on its own (the same ids in any
batch), left-padded with -1 to one length. Prompt token ids are accepted directly (``input_ids=``), with or
without a processor. Images decode through the model's own VQ.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from vgen import validate
from vgen.cards import Card
from vgen.errors import VGenError
from vgen.models.hf import TransformersModel, from_transformers
from vgen.pipeline import Generation, register_loader

# the model cards' recommended settings (cfg 5 for Janus-Pro's generate; Emu3-Gen's card: guidance 3, top-k 2048;
# Lumina-mGPT's inference solver: cfg 3, image top-k 2000; Chameleon's image options, which Anole keeps: text
# guidance 3, temperature 0.7, top-p 0.9)
DEFAULTS = {"Janus": {"cfg_scale": 5.0}, "Emu3": {"cfg_scale": 3.0, "top_k": 2048},
            "Lumina-mGPT": {"cfg_scale": 3.0, "top_k": 2000},
            "Anole": {"cfg_scale": 3.0, "temperature": 0.7, "top_p": 0.9}}
VQGAN_FILES = ("vqgan.safetensors", "vqgan.ckpt")  # Chameleon's image decoder, beside the model's files
EMU3_NEGATIVE = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
                 "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, blurry.")


def transformers_folder(name) -> Path | None:
    """The folder of a transformers model that ``name`` names, or None: a local folder written by save_pretrained
    (config.json, no vgen pipeline.json), or ``hf://owner/repo[/sub]`` whose snapshot is in the local Hugging Face
    cache and holds such a folder. Never downloads; a vgen pipeline folder (pipeline.json) is not one."""
    from vgen import hub
    if not isinstance(name, str) or not name.strip():
        return None
    if name.startswith(hub.HF_SCHEME):
        try:
            folder = hub.hub_folder(*hub.parse_hub_ref(name), local_only=True)
        except VGenError:
            return None  # not cached: the vgen pipeline path says how to get it
    else:
        folder = Path(name).expanduser()
    if folder.is_dir() and (folder / "config.json").is_file() and not (folder / "pipeline.json").exists():
        return folder
    return None


def model_class(folder: Path):
    kind = json.loads((folder / "config.json").read_text()).get("model_type")
    import transformers
    classes = {"janus": transformers.JanusForConditionalGeneration, "emu3": transformers.Emu3ForConditionalGeneration,
               "chameleon": transformers.ChameleonForConditionalGeneration}
    if kind not in classes:
        raise VGenError(f"{folder} holds a {kind!r} model: vgen drives the transformers image generators "
                        f"{', '.join(classes)} (Chameleon: Lumina-mGPT and Anole)")
    return classes[kind]


def vqgan_file(folder: Path) -> Path:
    """Chameleon's VQGAN decoder in a model folder (``vqgan.safetensors`` or Meta's ``vqgan.ckpt``), or a one-line
    error naming where it comes from."""
    for name in VQGAN_FILES:
        if (folder / name).is_file():
            return folder / name
    raise VGenError(f"{folder} has no vqgan.ckpt: Chameleon models decode through the VQGAN of Meta's Chameleon "
                    "release (tokenizer/vqgan.ckpt; Lumina-mGPT keeps it in ckpts/chameleon/tokenizer/): copy it "
                    "into the model's folder")


def chameleon_grid(name, layout: str) -> tuple[int, int]:
    """The default token grid of a Chameleon release: Anole 32 x 32 (512 px); Lumina-mGPT from the resolution in its
    name (Alpha-VLLM/Lumina-mGPT-7B-512 / -768 / -1024: pixels / 16), 768 px when the name states none."""
    if layout == "anole":
        return 32, 32
    import re
    m = re.search(r"(?<!\d)(512|768|1024)(?!\d)", str(name))
    n = int(m.group(1)) // 16 if m else 48
    return n, n


class TransformersPipeline:
    """A transformers image generator, its processor (None: prompt ids only) and vgen's adapter (``model``)."""

    def __init__(self, hf_model, processor=None, height: int | None = None, width: int | None = None,
                 negative_prompt: str | None = None, name: str = "", tokenize=None, decode_codes=None,
                 defaults: dict | None = None, examples: list[str] | None = None, **family_options):
        """``tokenize`` (a prompt -> ids (L,)) and ``decode_codes`` (codes (1, h, w) -> pixels in [-1, 1]) replace
        the processor and the model's own VQ (the zoo's photos-emu3 uses its caption tokenizer and photos-t2i's
        VQ); ``defaults``: the sampling settings filled in when not given; ``examples``: prompts for window=auto
        and benchmarks."""
        self.hf, self.processor, self.name = hf_model.eval(), processor, name or type(hf_model).__name__
        self._tokenize, self._decode_codes, self.examples = tokenize, decode_codes, list(examples or [])
        self.card: Card | None = None  # set by the loaders (what `vgen sample` checked; the zoo's names a drafter)
        self.tokenizer = None          # the zoo's image tokenizer (photos-t2i's VQ): what a drafter recipe encodes with
        self._heads: dict = {}         # draft heads loaded by draft_for, by path
        kw = dict(family_options)
        is_emu3 = type(hf_model).__name__.startswith("Emu3")
        if is_emu3 and "negative_prompt_ids" not in kw:
            if (height is None or width is None) and processor is not None:
                height, width = processor.calculate_generate_size(processor.ratio if hasattr(processor, "ratio")
                                                                  else "1:1", getattr(processor, "image_area", 518400),
                                                                  processor.downsample_ratio)
            neg = EMU3_NEGATIVE if negative_prompt is None else negative_prompt
            if processor is not None and neg:
                kw["negative_prompt_ids"] = self._tokenize_emu3(neg, height, width)
        elif negative_prompt and processor is not None and type(hf_model).__name__.startswith("Chameleon"):
            tok = getattr(processor, "tokenizer", processor)  # BOS + the text; the family appends the opening
            kw["negative_prompt_ids"] = [hf_model.config.bos_token_id] + tok(negative_prompt,
                                                                             add_special_tokens=False).input_ids
        self.model: TransformersModel = from_transformers(hf_model, height, width, **kw)
        self.defaults = dict(DEFAULTS.get(self.model.family.name, {}) if defaults is None else defaults)

    @property
    def device(self):
        return next(self.hf.parameters()).device

    def sampling_defaults(self, sampler: str) -> dict:
        """The card's settings that ``sampler`` takes (cfg_scale for every token sampler, init for the Jacobi ones)."""
        from vgen.samplers.base import sampler_class
        names = sampler_class(sampler, self.model).Options.names()
        return {k: v for k, v in self.defaults.items() if k in names}

    def _tokenize_emu3(self, text: str, h: int, w: int) -> torch.Tensor:
        p = self.processor
        ids = p.tokenizer(f"{p.tokenizer.bos_token or ''}{text}{p.image_start_token}{h}*{w}"
                          f"{p.fake_token_around_image}", add_special_tokens=False, return_tensors="pt").input_ids
        return ids[0]

    def tokenize(self, prompt: str) -> torch.Tensor:
        """One prompt -> its ids (L,) as the model's processor builds them for image generation (Chameleon: without
        the image's opening tokens, which the adapter appends)."""
        if self._tokenize is not None:
            return torch.as_tensor(self._tokenize(prompt), dtype=torch.long)
        if self.processor is None:
            raise VGenError(f"{self.name} has no processor (tokenizer / processor files missing from its folder): "
                            "pass prompt token ids with input_ids=..., or load a folder that has them")
        family = self.model.family.name
        if family == "Janus":
            msgs = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
            text = self.processor.apply_chat_template(msgs, add_generation_prompt=True)
            return self.processor(text=text, generation_mode="image", return_tensors="pt").input_ids[0]
        h, w = self.model.token_shape
        if family == "Emu3":
            return self._tokenize_emu3(prompt, h, w)
        wrap = self.model.family.prompt_text
        if wrap is None:
            raise VGenError(f"{self.name}: no prompt template for {family}; pass prompt token ids with input_ids=")
        tok = getattr(self.processor, "tokenizer", self.processor)
        ids = tok(wrap(prompt), add_special_tokens=False, return_tensors="pt").input_ids[0]
        return torch.cat([torch.tensor([self.hf.config.bos_token_id]), ids])

    def encode(self, prompts) -> torch.Tensor:
        """Prompts (strings, or a :class:`vgen.conditions.Prompts`) -> ids (N, L), each tokenized alone, left-padded
        with -1."""
        ids = [self.tokenize(p) for p in getattr(prompts, "texts", prompts)]
        L = max(len(x) for x in ids)
        return torch.stack([torch.cat([x.new_full((L - len(x),), -1), x]) for x in ids]).to(self.device)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Codes (N, h*w) -> uint8 pixels (N, 3, H, W), one image at a time through the model's VQ."""
        from vgen.data import to_uint8
        h, w = self.model.token_shape
        dec = self._decode_codes or self.model.decode_image
        return torch.cat([to_uint8(dec(t.view(1, h, w).to(self.device))) for t in tokens]).cpu()

    def generate(self, prompts=None, input_ids=None, sampler: str = "ar", seed: int = 0,
                 batch_size: int | None = None, progress: bool = False, seeds: list[int] | None = None,
                 labels=None, prompt=None, prompt_frames: int = 1, **options):
        """Sample images for ``prompts`` (strings, through the processor) or ``input_ids`` ((N, L), -1 = left
        padding) with any token sampler; the model card's settings fill options not given. Sample i uses seed
        ``seed + i`` or ``seeds[i]`` (any batching: the same bytes). ``labels`` / ``prompt`` (a class id, a video
        prompt) are refused: these models read text."""
        from vgen.conditions import prompts as check_prompts
        if labels is not None or prompt is not None:
            raise VGenError(f"{self.name} is a text-to-image model: give prompts=[...] (no class labels or clips)")
        if (prompts is None) == (input_ids is None):
            raise VGenError("give prompts=[...] or input_ids=<(N, L) tensor>, one of them")
        texts = None
        if prompts is not None:
            texts = list(check_prompts(prompts).texts)
            ids = self.encode(texts)
        else:
            ids = torch.as_tensor(input_ids)
            ids = (ids[None] if ids.dim() == 1 else ids).to(self.device)
        n = ids.shape[0]
        if seeds is None:
            seed = validate.seed(seed, n)
            seeds = [seed + i for i in range(n)]
        elif len(seeds) != n:
            raise VGenError(f"got {len(seeds)} seeds for {n} prompts: give one seed per prompt")
        s = self.make_sampler(sampler, **options).resolved(self.model, n, batch_size or n)  # compile=auto, decided
        t0 = time.perf_counter()
        tokens, stats = self.sample_tokens(s, ids, [validate.seed(x) for x in seeds], batch_size, progress)
        tokens = tokens.cpu()
        step_map = stats.pop("step_map", None)
        t1 = time.perf_counter()
        pixels = self.decode(tokens)
        given = {**options, **({"compile": s.options.compile} if hasattr(s.options, "compile") else {})}
        stats.update(sampler=sampler, options=self.sample_options(sampler, given), num_samples=ids.shape[0],
                     sample_seconds=t1 - t0, decode_seconds=time.perf_counter() - t1)
        return Generation(pixels, tokens, None, list(seeds), stats, None if step_map is None else step_map.cpu(),
                          texts)

    def sample_options(self, sampler: str, options: dict) -> dict:
        """The options given, the model card's settings filled in where not given (what ``generate`` records)."""
        return {**self.sampling_defaults(sampler), **{k: v for k, v in options.items() if v is not None}}

    def make_sampler(self, sampler: str = "ar", **options):
        """The sampler ``generate`` would run (``vgen bench`` times it), with :meth:`sample_options`' settings."""
        from vgen.samplers.base import get_sampler
        return get_sampler(sampler, model=self.model, **self.sample_options(sampler, options))

    def sample_tokens(self, sampler, cond: torch.Tensor, seeds: list[int], batch_size: int | None = None,
                      progress: bool = False, prefix=None):
        """Run ``sampler`` on prompt ids ``cond`` (N, L) with what it needs wired in (the model's codebook, a draft
        head): (tokens (N, h*w), stats). ``generate`` and the bench sample through here."""
        if prefix is not None:
            raise VGenError(f"{self.name} generates images from prompts: it takes no token prefix")
        codebook = self.model.codebook() if sampler.needs_codebook else None
        draft = self.draft_for(sampler) if sampler.needs_draft else None
        return sampler(self.model, cond.to(self.device), seeds, progress, codebook=codebook, batch_size=batch_size,
                       draft=draft)

    def draft_for(self, sampler):
        """The draft head ``sampler`` (eagle) drafts with: its ``drafter`` option, or the file the card names;
        loaded once and kept, checked against this model."""
        if sampler.draft_kind != "head":
            raise VGenError(f"sampler {sampler.name!r} needs a draft model, which transformers pipelines do not take: "
                            "use eagle (a draft head), sjd, scd, gsd, lantern or zipar")
        from vgen.models.drafter import head_for
        given = sampler.options.drafter
        if self.card is not None:
            path = self.card.drafter_path(given)
        elif given:
            path = Path(given).expanduser()
        else:
            raise VGenError(f"{self.name} names no draft head: pass drafter=<drafter.safetensors> (train one with "
                            f"`vgen train recipe=drafter recipe.model=<this model>`)")
        return head_for(self._heads, path, self.model, self.device)


def load_zoo(folder: Path, device="cpu", dtype=None) -> TransformersPipeline:
    """A zoo folder holding ``hf_pipeline.json`` (photos-emu3): the save_pretrained model (stored float16, loaded as
    ``dtype``, default float32), its caption tokenizer and the VQ it decodes with."""
    from transformers import AutoTokenizer, Emu3ForConditionalGeneration

    from vgen.kinds import load_official
    from vgen.models.hf.emu3_zoo import Layout
    device, dtype = validate.device(device), validate.dtype(dtype)
    card = json.loads((folder / "hf_pipeline.json").read_text())
    missing = [f for f in (card["hf"], card["text_tokenizer"], card["tokenizer"]) if not (folder / f).exists()]
    if missing:
        raise VGenError(f"{folder} misses {', '.join(missing)}: train it again with `vgen train recipe=emu3 "
                        "recipe.install=true`")
    model = Emu3ForConditionalGeneration.from_pretrained(folder / card["hf"], local_files_only=True,
                                                         dtype=dtype or torch.float32).to(device)
    tok = AutoTokenizer.from_pretrained(str(folder / card["text_tokenizer"]))
    vq = load_official(card["tokenizer_kind"], str(folder / card["tokenizer"]), device=device).eval()
    h, w = card["token_shape"]
    layout = Layout(tok, card["special"], card["vocab_size"], (h, w), card["caption_tokens"])
    pipe = TransformersPipeline(model, None, h, w, name=card.get("name", folder.name),
                                tokenize=layout.prompt, decode_codes=lambda c: vq.decode(c).clamp(-1, 1),
                                defaults=dict(card.get("sampling") or {}), examples=card.get("examples"),
                                negative_prompt_ids=torch.tensor(layout.prompt(None)))
    pipe.card, pipe.tokenizer = zoo_card(folder), vq
    return pipe


def load(src: str, device="cpu", dtype=None, height: int | None = None, width: int | None = None,
         negative_prompt: str | None = None) -> TransformersPipeline:
    """A transformers image generator's folder, or ``hf://owner/repo`` in the local cache (:func:`transformers_folder`),
    with its processor when it has one."""
    device, dtype = validate.device(device), validate.dtype(dtype)
    folder = transformers_folder(src)
    if folder is None:
        raise VGenError(f"{src} is not a transformers model folder (config.json, written by save_pretrained) nor a "
                        "hub id in the local cache: download it first (`huggingface-cli download <id>`)")
    cls = model_class(folder)
    kw = {}
    if cls.__name__.startswith("Chameleon"):  # before the model's weights: its decoder (a missing file stops here)
        from vgen.models.hf.chameleon import default_layout
        from vgen.tokenizers.vqgan import load_vqgan
        kw["vqgan"] = load_vqgan(vqgan_file(folder), device=device, dtype=dtype)
        layout = default_layout(json.loads((folder / "config.json").read_text()).get("architectures"))
        if height is None and width is None:
            height, width = chameleon_grid(src, layout)
    model = cls.from_pretrained(folder, local_files_only=True, **({"dtype": dtype} if dtype else {}))
    model = model.to(device)
    processor = None
    try:
        from transformers import AutoProcessor
        processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
    except Exception:  # noqa: BLE001 - no processor files: a tokenizer alone, or prompt ids only
        try:
            from transformers import AutoTokenizer
            processor = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except Exception:  # noqa: BLE001 - no tokenizer either: prompts get a one-line error
            processor = None
    gen = folder / "generation_config.json"  # transformers drops its generation_kwargs on load: read them here
    if cls.__name__.startswith("Janus") and gen.is_file():
        boi = (json.loads(gen.read_text()).get("generation_kwargs") or {}).get("boi_token_id")
        if boi is not None:
            kw["boi_token_id"] = int(boi)
    pipe = TransformersPipeline(model, processor, height, width, negative_prompt, name=src, **kw)
    pipe.card = card(src)
    return pipe


def _zoo_folder(name) -> Path | None:
    """A zoo name or folder holding ``hf_pipeline.json`` (photos-emu3, or a ``vgen train recipe=emu3`` export)."""
    from vgen.cards import ZOO_DIR
    if not isinstance(name, str) or not name.strip() or name.startswith("hf://"):
        return None
    for folder in (ZOO_DIR / name, Path(name).expanduser()):
        if (folder / "hf_pipeline.json").is_file():
            return folder
    return None


CARD_FILE = "hf_pipeline.json"


def zoo_card(folder: Path) -> Card:
    """The card of a folder holding ``hf_pipeline.json`` (photos-emu3): its grid, codes, examples, sampling and
    draft head (``drafter``), with the folder (where a drafter recipe installs its head)."""
    c = json.loads((folder / CARD_FILE).read_text())
    data = {"name": c.get("name", folder.name), "token_shape": c["token_shape"], "vocab_size": c["vocab_size"],
            "examples": c.get("examples") or ["a photo"], "sampling": c.get("sampling") or {},
            "image_size": c.get("image_size"), "drafter": c.get("drafter"), "generation": "next-token",
            "conditioning": "text", "model_kind": "transformers", "model": c.get("name", folder.name),
            "tokenizer_kind": "transformers", "tokenizer": ""}
    return Card.from_dict({k: v for k, v in data.items() if v is not None}, folder, f"{folder / CARD_FILE}")


def card(name) -> Card:
    """The card of a transformers model folder, cached hf:// repo or zoo model, read without loading weights (what
    ``vgen sample`` checks before it loads): prompts in, codes of the model's grid out, the model card's defaults."""
    zoo = _zoo_folder(name)
    if zoo is not None:
        return zoo_card(zoo)
    folder = transformers_folder(name)
    conf = json.loads((folder / "config.json").read_text())
    kind = conf.get("model_type")
    if kind == "janus":
        n = int((conf.get("vision_config") or {}).get("num_image_tokens", 576))
        g = int(round(n ** 0.5))
        data = {"token_shape": [g, g], "vocab_size": int((conf.get("vq_config") or {}).get("num_embeddings", 16384)),
                "sampling": DEFAULTS["Janus"]}
    elif kind == "emu3":
        vocab = conf.get("vocabulary_map") or {}
        data = {"token_shape": [90, 90], "vocab_size": sum(k.startswith("<|visual token") for k in vocab),
                "sampling": DEFAULTS["Emu3"]}
    elif kind == "chameleon":
        from vgen.models.hf.chameleon import default_layout
        vqgan_file(folder)  # the decoder's file, named before anything loads
        layout = default_layout(conf.get("architectures"))
        vocab = conf.get("vocabulary_map") or {}
        data = {"token_shape": list(chameleon_grid(name, layout)),
                "vocab_size": sum(k.startswith("IMGIMG") for k in vocab),
                "sampling": DEFAULTS["Lumina-mGPT" if layout == "lumina" else "Anole"]}
    else:
        model_class(folder)  # the one-line error naming what it holds
    data.update(name=str(name), examples=["a photo of a cat sitting on a windowsill"])
    data.update(generation="next-token", conditioning="text", model_kind="transformers", model=str(name),
                tokenizer_kind="transformers", tokenizer="")
    return Card.from_dict({k: v for k, v in data.items() if v is not None}, None, f"the card of {name}")


register_loader(lambda name: transformers_folder(name) is not None, load, card)
register_loader(lambda name: _zoo_folder(name) is not None,
                lambda name, device="cpu", dtype=None: load_zoo(_zoo_folder(name), device=device, dtype=dtype), card)
