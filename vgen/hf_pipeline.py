"""A pipeline over a transformers image generator: ``vgen.load_pipeline("hf://<owner>/<repo>")`` (a hub repository
in the local cache; never downloaded) or ``vgen.load_pipeline("<folder written by save_pretrained>")``.

Prompts go through the model's own processor as its family builds image prompts
(:meth:`vgen.models.hf.TransformersFamily.tokenize`), each prompt on its own (the same ids in any batch), left-padded
with -1 to one length. Prompt token ids are accepted directly (``input_ids=``), with or without a processor. Images
decode through the model's own VQ.

Nothing here names a family: each registers a :class:`vgen.models.hf.TransformersFamily` where it is defined
(``vgen/models/hf/<family>.py``), which says which folders and models are its, how to load them, their card, their
prompts and CFG row.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from vgen import validate
from vgen.cards import Card
from vgen.errors import VGenError
from vgen.models.hf import (
    TransformersFamily,
    TransformersModel,
    family_for_config,
    family_of,
    from_transformers,
    registered_families,
)
from vgen.pipeline import Generation, register_loader, sample_and_decode


def _load_vqgan(path, device="cpu", dtype=None):
    from vgen.tokenizers.vqgan import load_vqgan
    return load_vqgan(path, device=device, dtype=dtype)


# the image decoders a family's ``files`` may name, by the wrap option that takes them: loaded here, since the
# tokenizers sit a layer above the models (a family needing a new decoder adds its loader)
DECODERS = {"vqgan": _load_vqgan}


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


def family_for(folder: Path) -> TransformersFamily:
    """The registered family of a model folder (by its ``config.json``), or a one-line error naming what it holds."""
    conf = json.loads((folder / "config.json").read_text())
    family = family_for_config(conf)
    if family is None:
        known = [f"{f.name} ({f.releases})" if f.releases else f.name for f in registered_families()]
        raise VGenError(f"{folder} holds a {conf.get('model_type')!r} model: vgen drives the transformers image "
                        f"generators {', '.join(known)}")
    return family


def model_class(folder: Path):
    """The transformers class that loads a model folder (its family's)."""
    return family_for(folder).model_class()


def _decoders(family: TransformersFamily, folder: Path, device, dtype) -> dict:
    """The decoders ``family.files`` names in ``folder``, loaded (a missing file: its one-line error)."""
    out = {}
    for option, path in family.files(folder).items():
        if option not in DECODERS:
            raise VGenError(f"{family.name} names a {option!r} file vgen cannot load: add its loader to DECODERS")
        out[option] = DECODERS[option](path, device=device, dtype=dtype)
    return out


class TransformersPipeline:
    """A transformers image generator, its processor (None: prompt ids only) and vgen's adapter (``model``)."""

    def __init__(self, hf_model, processor=None, height: int | None = None, width: int | None = None,
                 negative_prompt: str | None = None, name: str = "", tokenize=None, decode_codes=None,
                 defaults: dict | None = None, examples: list[str] | None = None, **family_options):
        """``tokenize`` (a prompt -> ids (L,)) and ``decode_codes`` (codes (1, h, w) -> pixels in [-1, 1]) replace
        the processor and the model's own VQ (a zoo model trained by vgen uses its caption tokenizer and another
        zoo model's VQ); ``defaults``: the sampling settings filled in when not given; ``examples``: prompts for
        window=auto and benchmarks."""
        self.hf, self.processor, self.name = hf_model.eval(), processor, name or type(hf_model).__name__
        self._tokenize, self._decode_codes, self.examples = tokenize, decode_codes, list(examples or [])
        self.card: Card | None = None  # set by the loaders (what `vgen sample` checked; the zoo's names a drafter)
        self.tokenizer = None          # the zoo's image tokenizer (photos-t2i's VQ): what a drafter recipe encodes with
        self._heads: dict = {}         # draft heads loaded by draft_for, by path
        kw = dict(family_options)
        self.hf_family: TransformersFamily | None = family_of(hf_model)  # None: from_transformers says why
        if self.hf_family is not None:  # the processor's grid, the negative prompt's ids (the CFG row)
            height, width, kw = self.hf_family.prompt_options(hf_model, processor, height, width, negative_prompt, kw)
        self.model: TransformersModel = from_transformers(hf_model, height, width, **kw)
        self.defaults = dict((self.model.family.sampling or {}) if defaults is None else defaults)

    @property
    def device(self):
        return next(self.hf.parameters()).device

    def quantize(self, mode: str, group_size: int = 32) -> dict:
        """The language model's linear layers (the family's ``decoder``: what runs once per token) in int8 / int4
        weights and its text table in int8 (:meth:`vgen.models.hf.adapter.TransformersModel.quantize_weights`); the
        image head, vision towers and the VQ decoder stay as loaded. Returns what changed, kept in
        ``self.quantization``."""
        info = self.model.quantize_weights(mode, group_size)
        self.quantization = {"mode": mode, "group_size": group_size if mode == "int4" else None, **info}
        return self.quantization

    def sampling_defaults(self, sampler: str) -> dict:
        """The card's settings that ``sampler`` takes (cfg_scale for every token sampler, init for the Jacobi ones)."""
        from vgen.samplers.base import sampler_class
        names = sampler_class(sampler, self.model).Options.names()
        return {k: v for k, v in self.defaults.items() if k in names}

    def tokenize(self, prompt: str) -> torch.Tensor:
        """One prompt -> its ids (L,) as the model's processor builds them for image generation (the family's
        :meth:`~vgen.models.hf.TransformersFamily.tokenize`; opening tokens the adapter appends may be left out)."""
        if self._tokenize is not None:
            return torch.as_tensor(self._tokenize(prompt), dtype=torch.long)
        if self.processor is None:
            raise VGenError(f"{self.name} has no processor (tokenizer / processor files missing from its folder): "
                            "pass prompt token ids with input_ids=..., or load a folder that has them")
        ids = self.hf_family.tokenize(self.processor, self.hf, self.model.family, prompt)
        if ids is None:
            raise VGenError(f"{self.name}: no prompt template for {self.model.family.name}; pass prompt token ids "
                            "with input_ids=")
        return ids

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
        s, tokens, pixels, stats, step_map = sample_and_decode(
            self, self.make_sampler(sampler, **options), ids, [validate.seed(x) for x in seeds], batch_size, progress)
        given = {**options, **({"compile": s.options.compile} if hasattr(s.options, "compile") else {})}
        stats.update(sampler=sampler, options=self.sample_options(sampler, given))
        return Generation(pixels, tokens, None, list(seeds), stats, step_map, texts)

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
                            "use eagle (a draft head), sjd, scd, gsd, lantern, zipar or pjd")
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


def load_zoo(folder: Path, device="cpu", dtype=None, quantize: str | None = None,
             quantize_group: int = 32) -> TransformersPipeline:
    """A zoo folder holding ``hf_pipeline.json`` (a transformers model vgen trained): the save_pretrained model
    (stored float16, loaded as ``dtype``, default float32; ``quantize``: its decoder quantized as it loads, see
    :func:`load`), its caption tokenizer, the VQ it decodes with and its family's prompt layout
    (:meth:`~vgen.models.hf.TransformersFamily.zoo_prompt`)."""
    from transformers import AutoTokenizer

    from vgen.kinds import load_official
    device, dtype = validate.device(device), validate.dtype(dtype)
    card = json.loads((folder / "hf_pipeline.json").read_text())
    missing = [f for f in (card["hf"], card["text_tokenizer"], card["tokenizer"]) if not (folder / f).exists()]
    if missing:
        raise VGenError(f"{folder} misses {', '.join(missing)}: train it again with the recipe that wrote it "
                        "(`vgen train recipe=<recipe> recipe.install=true`; docs/zoo.md names each zoo model's)")
    family = family_for(folder / card["hf"])
    model = family.model_class().from_pretrained(folder / card["hf"], local_files_only=True,
                                                 dtype=dtype or torch.float32,
                                                 **_quantizing(quantize, quantize_group)).to(device)
    tok = AutoTokenizer.from_pretrained(str(folder / card["text_tokenizer"]))
    vq = load_official(card["tokenizer_kind"], str(folder / card["tokenizer"]), device=device).eval()
    h, w = card["token_shape"]
    prompt = family.zoo_prompt(tok, card)
    pipe = TransformersPipeline(model, None, h, w, name=card.get("name", folder.name),
                                tokenize=prompt, decode_codes=lambda c: vq.decode(c).clamp(-1, 1),
                                defaults=dict(card.get("sampling") or {}), examples=card.get("examples"),
                                negative_prompt_ids=torch.tensor(prompt(None)))
    pipe.card, pipe.tokenizer = zoo_card(folder), vq
    return _finish(pipe, quantize, quantize_group)


def load(src: str, device="cpu", dtype=None, height: int | None = None, width: int | None = None,
         negative_prompt: str | None = None, quantize: str | None = None,
         quantize_group: int = 32) -> TransformersPipeline:
    """A transformers image generator's folder, or ``hf://owner/repo`` in the local cache (:func:`transformers_folder`),
    with its processor when it has one. ``quantize="int8" | "int4"``: the decoder's linear layers quantized as the
    checkpoint loads (:mod:`vgen.models.hf.quantizer`: one layer's float weights held at a time), its input table
    after; the same model, byte for byte, as loading in float and calling ``pipe.quantize``."""
    device, dtype = validate.device(device), validate.dtype(dtype)
    folder = transformers_folder(src)
    if folder is None:
        raise VGenError(f"{src} is not a transformers model folder (config.json, written by save_pretrained) nor a "
                        "hub id in the local cache: download it first (`huggingface-cli download <id>`)")
    family = family_for(folder)
    # before the model's weights: its decoder files (a missing file stops here), the release's grid, other files
    kw = _decoders(family, folder, device, dtype)
    height, width, more = family.load_options(src, folder, json.loads((folder / "config.json").read_text()),
                                              height, width)
    kw.update(more)
    model = family.model_class().from_pretrained(folder, local_files_only=True, **({"dtype": dtype} if dtype else {}),
                                                 **_quantizing(quantize, quantize_group))
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
    pipe = TransformersPipeline(model, processor, height, width, negative_prompt, name=src, **kw)
    pipe.card = card(src)
    return _finish(pipe, quantize, quantize_group)


def _quantizing(quantize: str | None, group_size: int) -> dict:
    """``from_pretrained``'s arguments that quantize the family's decoder as it loads (a family that names no decoder
    before loading is quantized after, by :func:`_finish`)."""
    if quantize is None:
        return {}
    from vgen.models.hf.quantizer import quantization_config
    return {"quantization_config": quantization_config(quantize, group_size)}


def _finish(pipe: TransformersPipeline, quantize: str | None, group_size: int) -> TransformersPipeline:
    """The rest of ``quantize``: what loading left in float (the input table, or a family quantized after loading)."""
    if quantize is not None:
        pipe.quantize(quantize, group_size)
    return pipe


def _zoo_folder(name) -> Path | None:
    """A zoo name or folder holding ``hf_pipeline.json`` (a zoo transformers model, or a recipe's export)."""
    from vgen.cards import ZOO_DIR
    if not isinstance(name, str) or not name.strip() or name.startswith("hf://"):
        return None
    for folder in (ZOO_DIR / name, Path(name).expanduser()):
        if (folder / "hf_pipeline.json").is_file():
            return folder
    return None


CARD_FILE = "hf_pipeline.json"


def zoo_card(folder: Path) -> Card:
    """The card of a folder holding ``hf_pipeline.json`` (a zoo transformers model): its grid, codes, examples,
    sampling and draft head (``drafter``), with the folder (where a drafter recipe installs its head)."""
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
    family = family_for(folder)  # a folder of no family: the one-line error naming what it holds
    data = dict(family.card_fields(str(name), folder, json.loads((folder / "config.json").read_text())))
    data.update(name=str(name), examples=["a photo of a cat sitting on a windowsill"])
    data.update(generation="next-token", conditioning="text", model_kind="transformers", model=str(name),
                tokenizer_kind="transformers", tokenizer="")
    return Card.from_dict({k: v for k, v in data.items() if v is not None}, None, f"the card of {name}")


register_loader(lambda name: transformers_folder(name) is not None, load, card)
register_loader(lambda name: _zoo_folder(name) is not None,
                lambda name, device="cpu", dtype=None, quantize=None, quantize_group=32:
                load_zoo(_zoo_folder(name), device=device, dtype=dtype, quantize=quantize, quantize_group=quantize_group),
                card)
