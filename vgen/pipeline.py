"""Pipelines: a token model + its tokenizer + recommended sampling settings, loaded from the embedded zoo
(``vgen/zoo/<name>/``) or from any folder with the same layout:

    pipeline.json        {"model_kind": "gpt", "model": "gpt.safetensors", "tokenizer_kind": "vq",
                          "tokenizer": "vq.safetensors", "class_names": [...], "sampling": {...}}
    gpt.safetensors      official key layout, config in the safetensors metadata
    vq.safetensors
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vgen import validate
from vgen.errors import VGenError
from vgen.interfaces import ModelSpec
from vgen.kinds import load_official
from vgen.samplers import check_fits, get_sampler, plain_sampler, sampler_class

ZOO_DIR = Path(__file__).parent / "zoo"


def list_models() -> list[str]:
    """Names of the zoo pipelines shipped with vgen."""
    if not ZOO_DIR.exists():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "pipeline.json").exists())


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
    avail = ", ".join(list_models()) or "(none installed)"
    raise VGenError(f"unknown model {name_or_path!r}: use a zoo model ({avail}) or a folder containing "
                    "pipeline.json")


CARD_KEYS = ("model_kind", "model", "tokenizer_kind", "tokenizer", "num_classes")


def read_card(name_or_path: str) -> dict:
    """The pipeline card (pipeline.json), checked: a JSON object with the keys a pipeline needs."""
    folder = resolve(name_or_path)
    path = folder / "pipeline.json"
    try:
        card = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise VGenError(f"{path} is not valid JSON ({e}): rewrite it with vgen.pipeline.save_pipeline") from None
    if not isinstance(card, dict):
        raise VGenError(f"{path} holds a {type(card).__name__}, not a JSON object: rewrite it with "
                        "vgen.pipeline.save_pipeline")
    missing = [k for k in CARD_KEYS if k not in card]
    if missing:
        raise VGenError(f"{path} lacks {', '.join(missing)}: a pipeline card names the model and tokenizer files and "
                        "kinds and the number of classes (vgen.pipeline.save_pipeline writes one)")
    card["_folder"] = str(folder)
    return card


def card_sampling_defaults(card: dict, sampler: str) -> dict:
    """A card's recommended options, restricted to what ``sampler`` accepts, aliases resolved (e.g. an old card's
    VAR ``cfg``). Options naming files (``*_calibration``) are resolved against the card's folder."""
    Options = sampler_class(sampler, card).Options
    out = Options.normalize({k: v for k, v in (card.get("sampling") or {}).items() if k in Options.names()})
    for k, v in out.items():
        if k.endswith("_calibration") and isinstance(v, str) and "_folder" in card and not Path(v).is_absolute():
            out[k] = str(Path(card["_folder"]) / v)
    return out


def resolve_sampler(card: dict, sampler: str, **options):
    """The sampler a pipeline would run: card defaults, overridden by the non-None ``options``, checked against
    the card (order, vocabulary, classes). Needs only the card: callers check input before any weights load."""
    check_fits(sampler, card)
    given = sampler_class(sampler, card).Options.normalize({k: v for k, v in options.items() if v is not None})
    s = get_sampler(sampler, card, **{**card_sampling_defaults(card, sampler), **given})
    s.validate(card)
    if s.needs_draft and s.draft_kind == "head":
        drafter_path(card, s.options.drafter)
    elif s.needs_draft:
        check_draft_card(card, s.options.draft or card.get("draft", ""))
    return s


def drafter_path(card: dict, path: str = "") -> Path:
    """The draft head a ``draft_kind="head"`` sampler (eagle) uses: ``path``, or the file the card lists next to the
    pipeline (``"drafter"``); a one-line error saying how to make one when there is none."""
    name = ModelSpec.from_card(card).name
    if path:
        p = Path(path).expanduser()
    elif card.get("drafter") and card.get("_folder"):
        p = Path(card["_folder"]) / card["drafter"]
    else:
        raise VGenError(f"{name} ships no draft head: train one with `vgen train recipe=drafter recipe.model={name} "
                        "recipe.install=true`, or pass drafter=<drafter.safetensors>")
    if not p.is_file():
        raise VGenError(f"draft head {p} does not exist: train one with `vgen train recipe=drafter "
                        f"recipe.model={name}` and pass the drafter.safetensors it writes")
    return p


def _sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_draft_card(card: dict, draft: str) -> None:
    """A draft must make the target's tokens: the same tokenizer (file contents), token grid, token type and
    classes. Checked from the two cards, before any weights load."""
    if not draft:
        raise VGenError(f"{ModelSpec.from_card(card).name} names no draft model: pass draft=<zoo name or folder>")
    dcard = read_card(draft)
    bad = ModelSpec.from_card(card).token_mismatch(ModelSpec.from_card(dcard))
    if bad:
        raise VGenError(f"draft {draft!r} has another {bad[0]} ({bad[1]}) than the target ({bad[2]}): a draft must "
                        "be trained on the target's tokenizer and grid")
    if "_folder" in card and "_folder" in dcard:
        tf, df = Path(card["_folder"]) / card["tokenizer"], Path(dcard["_folder"]) / dcard["tokenizer"]
        if tf.exists() and df.exists() and tf.stat().st_size + df.stat().st_size < 2 ** 28 and _sha256(tf) != _sha256(df):
            raise VGenError(f"draft {draft!r} comes with another tokenizer than the target ({df} differs from {tf}): "
                            "its tokens mean something else; train the draft on the target's tokenizer")


def check_prompt(card: dict, prompt, frames: int) -> None:
    """Frame-conditioned generation, checked from the card (before weights load): a video model, a uint8 clip
    of the model's frame size with at least ``frames`` frames, and at least one frame left to generate."""
    spec = ModelSpec.from_card(card)
    if not spec.is_video:
        raise VGenError(f"prompt frames condition video models, but {spec.name} makes images: drop the prompt")
    total = spec.token_shape[0]
    if not isinstance(frames, int) or isinstance(frames, bool) or not 1 <= frames < total:
        raise VGenError(f"prompt_frames must be 1..{total - 1} (the model makes {total} frames and needs at least "
                        f"one to generate), got {frames!r}")
    if not isinstance(prompt, torch.Tensor) or prompt.dtype != torch.uint8 or prompt.dim() not in (4, 5) \
            or prompt.shape[-3] != 3:
        got = tuple(prompt.shape) if isinstance(prompt, torch.Tensor) else type(prompt).__name__
        raise VGenError(f"a prompt is a uint8 clip (T, 3, H, W) or clips (N, T, 3, H, W), got {got}")
    if prompt.shape[-4] < frames:
        raise VGenError(f"the prompt has {prompt.shape[-4]} frame(s) but prompt_frames={frames}: give a longer clip "
                        "or fewer prompt frames")
    size = card.get("image_size")
    if size is not None and tuple(prompt.shape[-2:]) != (size, size):
        raise VGenError(f"prompt frames are {prompt.shape[-2]}x{prompt.shape[-1]} pixels but this model makes "
                        f"{size}x{size} frames: resize the clip to {size}x{size}")


@dataclass
class Generation:
    """What ``Pipeline.generate`` returns. ``pixels``: uint8 images (N, 3, H, W) or videos (N, T, 3, H, W);
    ``tokens``: codes (int64) (N, seq_len) or latents (float) (N, seq_len, channels), in raster order."""
    pixels: torch.Tensor
    tokens: torch.Tensor
    labels: torch.Tensor  # (N,)
    seeds: list[int]
    stats: dict = field(default_factory=dict)
    step_map: torch.Tensor | None = None  # (N, seq_len): forward pass at which each token was decided (0 = prefill)

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
        folder = Path(folder)
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
    """A model, its tokenizer and the card (recommended settings, class names)."""

    def __init__(self, model, tokenizer, card: dict | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer.eval()
        self.card = card or {}
        if hasattr(model, "attach_tokenizer"):  # next-scale models build each scale's input with the tokenizer
            model.attach_tokenizer(tokenizer)
        self.card.setdefault("generation", str(model.order))

    @classmethod
    def from_pretrained(cls, name_or_path: str = "photos-gpt", device="cpu", dtype=None) -> Pipeline:
        device = validate.device(device)
        card = read_card(name_or_path)
        folder = Path(card["_folder"])
        model = load_official(card["model_kind"], folder / card["model"], device=device, dtype=dtype)
        tok = load_official(card["tokenizer_kind"], folder / card["tokenizer"], device=device)
        return cls(model, tok, card)

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    @property
    def class_names(self) -> list[str]:
        return list(self.card.get("class_names") or [str(i) for i in range(self.num_classes)])

    @property
    def device(self):
        return next(self.model.parameters()).device

    def make_sampler(self, sampler: str | None = None, **options):
        """The sampler ``generate`` would run (default: the model's plain one), card settings filled in."""
        s = resolve_sampler(self.card, sampler or plain_sampler(self.model), **options)
        s.validate(self.model)
        return s

    def check_labels(self, labels) -> torch.Tensor:
        cond = validate.labels(labels)
        if cond.numel() == 0:
            raise VGenError("no labels given: pass at least one class id")
        bad = cond[(cond < 0) | (cond >= self.num_classes)]
        if bad.numel():
            raise VGenError(f"class id {int(bad[0])} out of range: this model has classes 0..{self.num_classes - 1}")
        return cond

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
            path = drafter_path(self.card, sampler.options.drafter)
            heads = self.__dict__.setdefault("_heads", {})
            if str(path) not in heads:
                from vgen.models.drafter import load_drafter
                heads[str(path)] = load_drafter(path, device=self.device)
                heads[str(path)].check_target(self.model, f"draft head {path}")
            return heads[str(path)]
        return self.draft_model(sampler.options.draft)

    def draft_model(self, name: str = ""):
        """The draft model a speculative sampler runs next to this one: ``name`` (a zoo name or pipeline folder;
        '' = the card's ``draft``), loaded once and kept."""
        name = name or self.card.get("draft", "")
        drafts = self.__dict__.setdefault("_drafts", {})
        if name not in drafts:
            check_draft_card(self.card, name)
            drafts[name] = Pipeline.from_pretrained(name, device=self.device).model
        return drafts[name]

    @torch.inference_mode()
    def encode_prompt(self, prompt, frames: int, n: int) -> torch.Tensor:
        """The first ``frames`` frames of a clip (uint8 (T, 3, H, W)) or of one clip per sample ((n, T, 3, H, W))
        -> the token prefix (n, frames * h * w) that frame-conditioned generation continues."""
        from vgen.data import to_model_range
        check_prompt(self.card, prompt, frames)
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

    def generate(self, labels, sampler: str | None = None, seed: int = 0, batch_size: int | None = None,
                 progress: bool = False, seeds: list[int] | None = None, prompt: torch.Tensor | None = None,
                 prompt_frames: int = 1, **options) -> Generation:
        """Sample for ``labels`` with ``sampler`` (default: the model's plain one); sample i uses seed
        ``seed + i`` (or ``seeds[i]``) whatever the batching. Video models: ``prompt`` (uint8 (T, 3, H, W), one
        clip for all samples, or (N, T, 3, H, W)) gives the first ``prompt_frames`` frames; the rest is
        generated from them (frame-conditioned generation, the video-prediction protocol)."""
        cond = self.check_labels(labels)
        prefix = None if prompt is None else self.encode_prompt(prompt, prompt_frames, cond.shape[0])
        sampler = sampler or plain_sampler(self.model)
        s = self.make_sampler(sampler, **options)
        n = cond.shape[0]
        if seeds is not None and len(seeds) != n:
            raise VGenError(f"got {len(seeds)} seeds for {n} labels: give one seed per label")
        if seeds is None:
            seed = validate.seed(seed, n)
            seeds = [seed + i for i in range(n)]
        else:
            seeds = [validate.seed(x) for x in seeds]
        s = s.resolved(self.model, n, batch_size or n)  # compile=auto decided here, so stats say what ran
        t0 = time.perf_counter()
        codebook = self.tokenizer.codebook() if s.needs_codebook else None
        draft = self.draft_for(s) if s.needs_draft else None
        tokens, stats = s(self.model, cond.to(self.device), seeds, progress=progress,
                          codebook=codebook, batch_size=batch_size, prefix=prefix, draft=draft)
        tokens = tokens.cpu()
        step_map = stats.pop("step_map", None)
        t1 = time.perf_counter()
        pixels = self.decode(tokens)
        stats.update(sampler=sampler, options=dataclasses.asdict(s.options), num_samples=n,
                     sample_seconds=t1 - t0, decode_seconds=time.perf_counter() - t1)
        return Generation(pixels, tokens, cond.cpu(), seeds, stats, None if step_map is None else step_map.cpu())


def load_pipeline(name: str = "photos-gpt", device="cpu", dtype=None) -> Pipeline:
    return Pipeline.from_pretrained(name, device=device, dtype=dtype)


def save_pipeline(folder, model, tokenizer, model_kind: str = "gpt", tokenizer_kind: str = "vq",
                  class_names: list[str] | None = None, sampling: dict | None = None, extra: dict | None = None) -> Path:
    """Write a pipeline folder (weights in the official key layout, config in the safetensors metadata)."""
    from vgen.io import atomic_write_json, save_safetensors
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    mfile, tfile = f"{model_kind}.safetensors", f"{tokenizer_kind}.safetensors"
    save_safetensors(model.state_dict(), folder / mfile, metadata={"config": json.dumps(model.config_dict())})
    save_safetensors(tokenizer.state_dict(), folder / tfile, metadata={"config": json.dumps(tokenizer.config_dict())})
    card = {"model_kind": model_kind, "model": mfile, "tokenizer_kind": tokenizer_kind, "tokenizer": tfile,
            "generation": str(model.order), "num_classes": model.num_classes,
            "token_shape": list(model.token_shape),
            "class_names": class_names or [str(i) for i in range(model.num_classes)],
            "sampling": sampling or {}, **(extra or {})}
    if model.token_type.kind == "latents":
        card.update(token_kind="latents", latent_channels=model.token_type.channels)
    else:
        card["vocab_size"] = model.token_type.vocab_size
    down = getattr(getattr(tokenizer, "config", None), "downsample", None)
    if isinstance(down, int) and len(model.token_shape) > 1:  # pixels per side of an image or frame
        card.setdefault("image_size", model.token_shape[-1] * down)
    atomic_write_json(folder / "pipeline.json", card)
    return folder
