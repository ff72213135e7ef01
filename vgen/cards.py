"""The pipeline card (``pipeline.json``), parsed and checked once into a typed :class:`Card`.

    {"model_kind": "gpt", "model": "gpt.safetensors", "tokenizer_kind": "vq", "tokenizer": "vq.safetensors",
     "generation": "next-token", "num_classes": 16, "token_shape": [16, 16], "vocab_size": 1024,
     "class_names": [...], "sampling": {...}, "draft": "<zoo name or folder>", "drafter": "drafter.safetensors", ...}

Everything a pipeline, the bench, the demo and a sampling job read from a card is a field of :class:`Card`; a card
that does not hold what it should is refused by :meth:`Card.load` in one line naming the key, before any weights
load. The file format is ``vgen.pipeline.save_pipeline``'s; :attr:`Card.data` keeps the file's JSON object as read
(keys vgen does not read included), for tools that write a card back.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vgen.conditions import DEFAULT_KIND, card_kinds, condition, kind_of
from vgen.errors import VGenError
from vgen.interfaces import ModelSpec, Order, TokenType

ZOO_DIR = Path(__file__).parent / "zoo"
REQUIRED = ("model_kind", "model", "tokenizer_kind", "tokenizer")  # and num_classes (class) or text_encoder (text)
_REWRITE = "rewrite it with vgen.pipeline.save_pipeline"


def list_models() -> list[str]:
    """Names of the zoo pipelines shipped with vgen."""
    if not ZOO_DIR.exists():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "pipeline.json").exists())


def list_transformers_models() -> list[str]:
    """Names of the zoo's transformers models (``hf_pipeline.json``: :mod:`vgen.hf_pipeline`; ``vgen sample`` and
    ``vgen.load_pipeline`` take them, e.g. photos-emu3)."""
    if not ZOO_DIR.exists():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "hf_pipeline.json").exists())


def resolve(name_or_path: str) -> Path:
    """Zoo name, folder, or Hugging Face Hub reference (``hf://owner/repo[/subfolder]``, resolved from the local HF
    cache) -> folder holding pipeline.json (clear error otherwise)."""
    from vgen import hub
    if hub.is_hub_ref(name_or_path):
        folder = hub.hub_folder(*hub.parse_hub_ref(name_or_path))
        if (folder / "pipeline.json").exists():
            return folder
        raise VGenError(f"{name_or_path}: this Hugging Face Hub folder has no pipeline.json")
    p = Path(name_or_path).expanduser()
    if (p / "pipeline.json").exists():
        return p
    if (ZOO_DIR / name_or_path / "pipeline.json").exists():
        return ZOO_DIR / name_or_path
    if (ZOO_DIR / name_or_path / "hf_pipeline.json").exists():
        raise VGenError(f"{name_or_path} is a transformers model: vgen sample and vgen.load_pipeline take it; "
                        "vgen bench +experiment=transformers times its samplers (this command reads vgen pipelines)")
    avail = ", ".join(list_models()) or "(none installed)"
    raise VGenError(f"unknown model {name_or_path!r}: use a zoo model ({avail}) or a folder containing "
                    "pipeline.json")


def model_facts(model) -> dict:
    """What a card says about a model's tokens, read from the model: generation order, classes, token grid, token
    type (``vocab_size``, or ``token_kind: latents`` and ``latent_channels``)."""
    out = {"generation": str(model.order), "num_classes": model.num_classes, "token_shape": list(model.token_shape)}
    kind = kind_of(model)
    if not kind.has_classes:
        del out["num_classes"]
    out.update(kind.card_facts(model))
    if model.token_type.kind == "latents":
        out.update(token_kind="latents", latent_channels=model.token_type.channels)
    else:
        out["vocab_size"] = model.token_type.vocab_size
    return out


class _Reader:
    """Reads one card's keys with one-line errors naming the file, the key and the fix."""

    def __init__(self, data: dict, where: str):
        self.data, self.where = data, where

    def fail(self, key: str, want: str):
        raise VGenError(f"{self.where}: {key} must be {want}, got {self.data[key]!r}: correct it or {_REWRITE}")

    def text(self, key: str, default: str = "") -> str:
        v = self.data.get(key, default)
        if v is None:
            return default
        if not isinstance(v, str):
            self.fail(key, "a string")
        return v

    def count(self, key: str, default: int | None = None) -> int | None:
        v = self.data.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            self.fail(key, "a whole number >= 1")
        return v

    def counts(self, key: str) -> tuple[int, ...] | None:
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not v or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v):
            self.fail(key, "a list of whole numbers >= 1")
        return tuple(v)

    def texts(self, key: str) -> tuple[str, ...]:
        v = self.data.get(key)
        if v is None:
            return ()
        if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
            self.fail(key, "a list of non-empty strings")
        return tuple(v)

    def mapping(self, key: str) -> dict:
        v = self.data.get(key)
        if v is None:
            return {}
        if not isinstance(v, dict):
            self.fail(key, "a JSON object")
        return v


def split_draft(draft: str) -> tuple[str, str | None]:
    """A draft model's name -> (the model: a zoo name, a folder or ``self``; its weight format or None):
    ``self@int4`` -> ("self", "int4"); ``photos-gpt@int8`` -> ("photos-gpt", "int8"); ``@float``: None. A suffix
    that is no weight format stays part of the name (a folder may hold an @)."""
    name, at, mode = str(draft).rpartition("@")
    if not at or mode not in ("int8", "int4", "float"):
        return str(draft), None
    return name, None if mode == "float" else mode


@dataclass(frozen=True)
class Card:
    """A pipeline card, checked. ``folder`` is None for a pipeline built in memory (no files: kinds and file names
    are then ''). ``sampling``: the recommended sampler options (any sampler's; each takes the ones it knows);
    ``draft``: the draft pipeline speculative samplers (cspd) run beside this one; ``drafter``: the trained draft
    head (eagle) next to it; ``compare_to``: the model whose AR the bench compares this one with. ``conditioning``:
    ``class`` (``num_classes`` class ids) or ``text`` (prompts through the T5 encoder folder ``text_encoder``, with
    ``examples`` prompts for calibration, benchmarks and the demo)."""
    name: str
    order: Order
    num_classes: int
    token_type: TokenType
    token_shape: tuple[int, ...] | None = None
    class_names: tuple[str, ...] = ()
    folder: Path | None = None
    model_kind: str = ""
    model_file: str = ""
    tokenizer_kind: str = ""
    tokenizer_file: str = ""
    sampling: dict = field(default_factory=dict)
    draft: str = ""
    drafter: str = ""
    compare_to: str = ""
    image_size: int | None = None  # pixels per side of an image or frame
    frames: int | None = None
    fps: int | None = None
    patch_nums: tuple[int, ...] | None = None
    metrics: dict = field(default_factory=dict)
    conditioning: str = "class"
    text_encoder: str = ""
    examples: tuple[str, ...] = ()
    model_config: dict = field(default_factory=dict)  # config fields the weights cannot tell (e.g. block_size)
    sources: dict = field(default_factory=dict)  # file -> where it comes from (named when the file is missing)
    data: dict = field(default_factory=dict, repr=False, compare=False)  # the JSON object as read

    @classmethod
    def load(cls, name_or_path: str | Path) -> Card:
        """The card of a zoo name, pipeline folder or Hub reference, checked (one-line errors)."""
        folder = resolve(str(name_or_path))
        path = folder / "pipeline.json"
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise VGenError(f"{path} is not valid JSON ({e}): {_REWRITE}") from None
        if not isinstance(data, dict):
            raise VGenError(f"{path} holds a {type(data).__name__}, not a JSON object: {_REWRITE}")
        given = data.get("conditioning") or DEFAULT_KIND
        kind = kind_of(given if given in card_kinds() else DEFAULT_KIND)  # a kind no card names: from_dict says so
        missing = [k for k in REQUIRED + tuple(kind.card_keys) if k not in data]
        if missing:
            raise VGenError(f"{path} lacks {', '.join(missing)}: a pipeline card names the model and tokenizer files "
                            "and kinds and the number of classes, or a text model's text_encoder folder "
                            "(vgen.pipeline.save_pipeline writes one)")
        return cls.from_dict(data, folder, str(path))

    @classmethod
    def from_model(cls, model, data: dict | None = None) -> Card:
        """The card of a pipeline built in memory: the model's facts, then ``data``'s keys (e.g. ``sampling``)."""
        return cls.from_dict({**model_facts(model), **(data or {})}, None, "the pipeline card")

    @classmethod
    def from_dict(cls, data: dict, folder: Path | None, where: str) -> Card:
        r = _Reader(data, where)
        try:
            order = Order(data.get("generation", Order.NEXT_TOKEN))
        except ValueError:
            r.fail("generation", "one of " + ", ".join(o.value for o in Order))
        num_classes = r.count("num_classes", 0)
        conditioning = r.text("conditioning", DEFAULT_KIND)
        if conditioning not in card_kinds():
            r.fail("conditioning", " or ".join(card_kinds()))
        if not kind_of(conditioning).has_classes:
            num_classes = 0
        kind = r.text("token_kind", "codes")
        if kind == "latents":
            if "latent_channels" not in data:
                raise VGenError(f"{where}: token_kind latents needs latent_channels (the values per token): "
                                f"add it or {_REWRITE}")
            token_type = TokenType.latents(r.count("latent_channels"))
        elif kind == "codes":
            vocab = r.count("vocab_size")
            token_type = TokenType.codes(vocab) if vocab is not None else TokenType("codes")
        else:
            r.fail("token_kind", "codes or latents")
        names = data.get("class_names")
        if names is None:
            names = [str(i) for i in range(num_classes)]
        elif not isinstance(names, list) or not all(isinstance(x, str) for x in names):
            r.fail("class_names", "a list of strings")
        elif len(names) != num_classes:
            r.fail("class_names", f"a list of num_classes ({num_classes}) names")
        return cls(name=r.text("name") or (folder.name if folder is not None else "?"), order=order,
                   num_classes=num_classes, token_type=token_type, token_shape=r.counts("token_shape"),
                   class_names=tuple(names), folder=folder, model_kind=r.text("model_kind"),
                   model_file=r.text("model"), tokenizer_kind=r.text("tokenizer_kind"),
                   tokenizer_file=r.text("tokenizer"), sampling=r.mapping("sampling"), draft=r.text("draft"),
                   drafter=r.text("drafter"), compare_to=r.text("compare_to"), image_size=r.count("image_size"),
                   frames=r.count("frames"), fps=r.count("fps"), patch_nums=r.counts("patch_nums"),
                   metrics=r.mapping("metrics"), conditioning=conditioning, text_encoder=r.text("text_encoder"),
                   examples=r.texts("examples"), model_config=r.mapping("model_config"),
                   sources=r.mapping("sources"), data=data)

    @property
    def model_conditioning(self) -> str:
        """What the model itself reads (:attr:`ModelSpec.conditioning`): prompt token ids (``tokens``) for a
        transformers model, whose processor turns the prompts into them; else ``conditioning``."""
        return "tokens" if self.model_kind == "transformers" else self.conditioning

    @property
    def own_forward(self) -> bool:
        """Whether the model's forward pass is vgen's own code. A transformers model's is transformers' (minutes to
        compile at its released size), so a bench-wide ``compile=true`` leaves it at ``compile=auto``; a setting
        that names ``compile=true`` itself still compiles it."""
        return self.model_kind != "transformers"

    @property
    def external(self) -> bool:
        """Whether a loader registered with :func:`vgen.pipeline.register_loader` builds this card's pipeline from
        ``model_file`` (a transformers model: :mod:`vgen.hf_pipeline`), not :meth:`vgen.pipeline.Pipeline.from_card`."""
        return self.model_kind == "transformers"

    @property
    def spec(self) -> ModelSpec:
        """What samplers check their options against (:meth:`ModelSpec.from_card`)."""
        return ModelSpec.from_card(self)

    @property
    def model_path(self) -> Path:
        return self._file(self.model_file)

    @property
    def tokenizer_path(self) -> Path:
        return self._file(self.tokenizer_file)

    def _file(self, name: str) -> Path:
        if self.folder is None:
            raise VGenError(f"{self.name} was built in memory and has no files: save it with "
                            "vgen.pipeline.save_pipeline first")
        return self.folder / name

    def check_files(self) -> None:
        """Every file the pipeline reads is there: one line naming each missing one and where it comes from (the
        card's ``sources``), before any weights load."""
        if self.folder is None:
            return
        missing = [w for w in (self.model_file, self.tokenizer_file) if w and not (self.folder / w).exists()]
        te = self.text_encoder
        hub_id = te.count("/") == 1 and not Path(te).expanduser().is_absolute()  # looked up in the local hub cache
        if te and not hub_id and not Path(self.text_encoder_path).exists():
            missing.append(te)
        if missing:
            said = [f"{m} ({self.sources[m]})" if m in self.sources else m for m in missing]
            raise VGenError(f"{self.folder} lacks {', '.join(said)}: put the file(s) there, or correct pipeline.json")

    @property
    def text_encoder_path(self) -> str:
        """The text encoder's folder (relative names resolved against the card's folder) or a hub id in the local
        cache; '' for a class model."""
        if not self.text_encoder:
            return ""
        p = Path(self.text_encoder).expanduser()
        if not p.is_absolute() and self.folder is not None and (self.folder / p).exists():
            return str(self.folder / p)
        return str(p) if p.is_absolute() or p.exists() else self.text_encoder

    def condition(self, labels=None, prompts=None, default_all_classes: bool = False):
        """``labels`` or ``prompts`` checked against this card, before any weights load (:mod:`vgen.conditions`)."""
        return condition(self.spec, labels, prompts, default_all_classes=default_all_classes)

    def sampling_options(self, options_cls) -> dict:
        """The recommended options a sampler's ``Options`` class accepts, aliases resolved (e.g. an old card's VAR
        ``cfg``); options naming files (``*_calibration``) resolved against the card's folder."""
        out = options_cls.normalize({k: v for k, v in self.sampling.items() if k in options_cls.names()})
        for k, v in out.items():
            if k.endswith("_calibration") and isinstance(v, str) and self.folder is not None \
                    and not Path(v).is_absolute():
                out[k] = str(self.folder / v)
        return out

    def drafter_path(self, path: str = "") -> Path:
        """The draft head a ``draft_kind="head"`` sampler (eagle) uses: ``path``, or the file the card lists next to
        the pipeline (``drafter``); a one-line error saying how to make one when there is none."""
        name = self.name
        if path:
            p = Path(path).expanduser()
        elif self.drafter and self.folder is not None:
            p = self.folder / self.drafter
        else:
            raise VGenError(f"{name} ships no draft head: train one with `vgen train recipe=drafter "
                            f"recipe.model={name} recipe.install=true`, or pass drafter=<drafter.safetensors>")
        if not p.is_file():
            raise VGenError(f"draft head {p} does not exist: train one with `vgen train recipe=drafter "
                            f"recipe.model={name}` and pass the drafter.safetensors it writes")
        return p

    def draft_card(self, draft: str = "") -> Card:
        """The card of the draft model ``draft`` ('' = the one this card names; ``self``: this card; a weight format
        after ``@`` is left out, :func:`split_draft`), checked to make this model's tokens: the same tokenizer (file
        contents), token grid, token type and classes. Before any weights load."""
        draft, mode = split_draft(draft or self.draft)
        if not draft:
            raise VGenError(f"{self.spec.name} names no draft model: pass draft=<zoo name or folder>")
        if draft == "self":
            if self.model_kind == "transformers":
                raise VGenError(f"draft={draft}{'@' + mode if mode else ''}: transformers pipelines take no draft "
                                "model; use eagle (a draft head), sjd, scd, gsd, lantern, zipar or pjd")
            return self
        dcard = Card.load(draft)
        self.spec.check_draft(dcard.spec, f"draft {draft!r}")
        if self.folder is not None and self.tokenizer_file and dcard.tokenizer_file:
            tf, df = self.tokenizer_path, dcard.tokenizer_path
            if tf.exists() and df.exists() and tf.stat().st_size + df.stat().st_size < 2 ** 28 \
                    and _sha256(tf) != _sha256(df):
                raise VGenError(f"draft {draft!r} comes with another tokenizer than the target ({df} differs from "
                                f"{tf}): its tokens mean something else; train the draft on the target's tokenizer")
        return dcard

    def check_prompt(self, prompt, frames: int) -> None:
        """Frame-conditioned generation, checked from the card (before weights load): a video model, a uint8 clip
        of the model's frame size with at least ``frames`` frames, and at least one frame left to generate."""
        spec = self.spec
        if not spec.is_video:
            raise VGenError(f"prompt frames condition video models, but {spec.name} makes images: drop the prompt")
        total = spec.token_shape[0]
        if not isinstance(frames, int) or isinstance(frames, bool) or not 1 <= frames < total:
            raise VGenError(f"prompt_frames must be 1..{total - 1} (the model makes {total} frames and needs at "
                            f"least one to generate), got {frames!r}")
        if not isinstance(prompt, torch.Tensor) or prompt.dtype != torch.uint8 or prompt.dim() not in (4, 5) \
                or prompt.shape[-3] != 3:
            got = tuple(prompt.shape) if isinstance(prompt, torch.Tensor) else type(prompt).__name__
            raise VGenError(f"a prompt is a uint8 clip (T, 3, H, W) or clips (N, T, 3, H, W), got {got}")
        if prompt.shape[-4] < frames:
            raise VGenError(f"the prompt has {prompt.shape[-4]} frame(s) but prompt_frames={frames}: give a longer "
                            "clip or fewer prompt frames")
        size = self.image_size
        if size is not None and tuple(prompt.shape[-2:]) != (size, size):
            raise VGenError(f"prompt frames are {prompt.shape[-2]}x{prompt.shape[-1]} pixels but this model makes "
                            f"{size}x{size} frames: resize the clip to {size}x{size}")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
