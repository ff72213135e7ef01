"""CLIP score: how well images match their text prompts, the way text-to-image papers compute it.

    vgen.eval.clip_score(images, prompts)                         # ViT-B/32 from the HF cache or $VGEN_CLIP_WEIGHTS
    vgen.eval.clip_score("samples/", prompts, model="ViT-L/14", weights="/path/clip-vit-large-patch14")

The definition is torchmetrics' ``CLIPScore`` (Hessel et al. 2021 with w = 100): for image i and its prompt i,
``100 * max(cos(E_I, E_T), 0)`` with E the CLIP image and text embeddings (the projected, L2-normalised
features), averaged over the pairs. Preprocessing is the CLIP processor's (``CLIPImageProcessor``: resize the
shortest side to 224 bicubic, center crop 224, scale to [0, 1], normalise with the OpenAI mean / std); prompts are
tokenized by the CLIP tokenizer and truncated to the model's 77 tokens (start token, 75 tokens, end token, as
OpenAI's ``clip.tokenize(truncate=True)``).

The weights are OpenAI's CLIP in Hugging Face format (``openai/clip-vit-base-patch32``,
``openai/clip-vit-large-patch14``), read through transformers' ``CLIPModel`` from a local folder
(``weights=``, else ``$VGEN_CLIP_WEIGHTS``, else the model's snapshot in the local Hugging Face cache). vgen never
downloads them: a missing folder or file is a one-line error naming it and the download command.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from vgen.errors import VGenError, VGenWarning


@dataclasses.dataclass(frozen=True)
class ClipModel:
    """One of the CLIP models papers report, with the shapes its config.json must have."""
    repo: str  # the Hugging Face repo of OpenAI's weights
    patch: int
    width: int  # the vision transformer's width
    layers: int  # the vision transformer's depth
    image_size: int
    embed: int  # the joint embedding's size (projection_dim)

    def arch(self) -> tuple:
        return self.patch, self.width, self.layers, self.image_size, self.embed


MODELS = {
    "ViT-B/32": ClipModel("openai/clip-vit-base-patch32", 32, 768, 12, 224, 512),
    "ViT-L/14": ClipModel("openai/clip-vit-large-patch14", 14, 1024, 24, 224, 768),
}
DEFAULT_MODEL = "ViT-B/32"
ENV = "VGEN_CLIP_WEIGHTS"
# what `hf download` fetches: the model (safetensors only), its config, the tokenizer and the processor's config
DOWNLOAD_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.json",
                  "merges.txt", "special_tokens_map.json", "preprocessor_config.json")


def _check_model(model: str) -> ClipModel:
    if model not in MODELS:
        raise VGenError(f"unknown CLIP model {model!r}: use one of {', '.join(MODELS)}")
    return MODELS[model]


def clip_weights_folder(weights: str | os.PathLike | None = None, model: str = DEFAULT_MODEL) -> Path:
    """The local folder of ``model``'s weights (config.json, model.safetensors, tokenizer files), checked file by
    file: ``weights`` (a folder, or ``hf://owner/repo`` in the local HF cache), else ``$VGEN_CLIP_WEIGHTS``, else
    the model's repo in the local Hugging Face cache (never downloaded). A one-line error names what is missing,
    where it was looked for and the command that fetches it."""
    from vgen import hub
    info = _check_model(model)
    repo = info.repo
    if weights is not None and os.fspath(weights) != "":
        src, origin = os.fspath(weights), "weights= / clip_weights="
    elif os.environ.get(ENV):
        src, origin = os.environ[ENV], f"${ENV}"
    else:
        src, origin = None, None
    if src is None or src.startswith(hub.HF_SCHEME):
        if src is not None:
            repo, sub = hub.parse_hub_ref(src)
        else:
            sub = ""
        fix = hub.download_command(repo, DOWNLOAD_FILES)
        try:
            folder = hub.hub_folder(repo, sub, local_only=True)
        except VGenError as e:
            if "not in the local Hugging Face cache" in str(e):
                raise VGenError(f"CLIP {model} weights: {repo} is not in the local Hugging Face cache (vgen reads "
                                f"it from there, never downloading): fetch it once with `{fix}`, or point "
                                f"clip_weights= / ${ENV} at a folder holding those files") from None
            raise VGenError(f"CLIP {model} weights: {e}") from None
        origin = f"the Hugging Face cache's {repo}"
    else:
        folder = Path(src).expanduser()
        fix = hub.download_command(repo, DOWNLOAD_FILES, local_dir=folder)
        if not folder.exists():
            raise VGenError(f"CLIP weights folder {folder} (from {origin}) does not exist: fetch {model}'s weights "
                            f"with `{fix}`, or point {origin} at the folder that holds them")
        if not folder.is_dir():
            raise VGenError(f"CLIP weights {folder} (from {origin}) is a file: give the folder holding config.json, "
                            f"model.safetensors and the tokenizer files (`{fix}` makes one)")
    missing = [f for f in ("config.json",) if not (folder / f).is_file()]
    if not ((folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()):
        missing.append("model.safetensors")
    if not ((folder / "tokenizer.json").is_file() or
            ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file())):
        missing.append("tokenizer.json (or vocab.json and merges.txt)")
    if missing:
        found = "pytorch_model.bin only: vgen reads safetensors; " if (
            "model.safetensors" in missing and (folder / "pytorch_model.bin").exists()) else ""
        raise VGenError(f"CLIP weights folder {folder} (from {origin}) has no {' and no '.join(missing)}: "
                        f"{found}fetch them with `{fix}`")
    return folder


def read_config(folder: str | os.PathLike, model: str = DEFAULT_MODEL):
    """(the folder's ``CLIPConfig``, the model name it is): ``model`` when its shapes are ``model``'s, ``custom
    (...)`` when they are neither of ``MODELS``; the other model of ``MODELS`` is an error (its numbers would be
    labelled with the wrong model)."""
    _check_model(model)
    cfg_file = Path(folder) / "config.json"
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as e:
        raise VGenError(f"{cfg_file} is not readable JSON ({str(e).splitlines()[0]}): fetch it again") from None
    if not isinstance(raw, dict) or raw.get("model_type") != "clip":
        kind = raw.get("model_type") if isinstance(raw, dict) else type(raw).__name__
        raise VGenError(f"{cfg_file} is not a CLIP model's config (model_type {kind!r}, not 'clip'): give the "
                        f"folder of {MODELS[model].repo}")
    _need_transformers()
    from transformers import CLIPConfig
    try:
        cfg = CLIPConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise VGenError(f"{cfg_file} is not a readable CLIP config ({_first_line(e)}): fetch it again") from None
    v = cfg.vision_config
    arch = (v.patch_size, v.hidden_size, v.num_hidden_layers, v.image_size, cfg.projection_dim)
    desc = f"patch {arch[0]}, width {arch[1]}, {arch[2]} layers, {arch[3]} px, embedding {arch[4]}"
    if arch == MODELS[model].arch():
        return cfg, model
    for other, info in MODELS.items():
        if arch == info.arch():
            raise VGenError(f"CLIP weights folder {folder} holds {other} ({desc}), not {model}: pass "
                            f"clip_model={other}, or the folder of {model} ({MODELS[model].repo})")
    return cfg, f"custom ({desc})"


def _need_transformers() -> None:
    import importlib.util
    if importlib.util.find_spec("transformers") is None:
        raise VGenError("CLIP score runs OpenAI's CLIP through transformers: pip install 'transformers>=4.40'")


@contextlib.contextmanager
def _quiet_transformers():
    """transformers without its progress bars and info / warning logs (vgen checks what they would say)."""
    from transformers.utils import logging as hf_logging
    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def load_clip(folder: str | os.PathLike, cfg, device="cpu", model: str = DEFAULT_MODEL):
    """(CLIPModel in float32 eval mode on ``device``, tokenizer, image processor) from a folder that
    :func:`clip_weights_folder` checked, ``cfg`` its config (:func:`read_config`). Every weight must be in the file
    (a missing one would silently stay random)."""
    _need_transformers()
    from transformers import CLIPImageProcessor, CLIPModel, CLIPTokenizerFast

    from vgen import hub
    folder = Path(folder)
    fix = hub.download_command(MODELS.get(model, MODELS[DEFAULT_MODEL]).repo, DOWNLOAD_FILES, local_dir=folder)
    with _quiet_transformers():
        try:
            net, info = CLIPModel.from_pretrained(str(folder), config=cfg, local_files_only=True,
                                                  use_safetensors=True, output_loading_info=True)
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            raise VGenError(f"CLIP weights in {folder} could not be loaded ({_first_line(e)}): fetch them again "
                            f"with `{fix}`") from None
        missing = [k for k in info.get("missing_keys", ()) if not k.endswith("position_ids")]
        bad = missing + [str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys", ())]
        if bad:
            raise VGenError(f"CLIP weights in {folder} lack or misshape {len(bad)} tensors ({bad[0]}, ...): not "
                            f"the weights config.json describes; fetch them again with `{fix}`")
        try:
            tok = CLIPTokenizerFast.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            raise VGenError(f"CLIP tokenizer in {folder} could not be loaded ({_first_line(e)}): fetch it again "
                            f"with `{fix}`") from None
        size = cfg.vision_config.image_size
        if (folder / "preprocessor_config.json").is_file():
            try:
                proc = CLIPImageProcessor.from_pretrained(str(folder), local_files_only=True)
            except (OSError, ValueError, KeyError) as e:
                raise VGenError(f"{folder / 'preprocessor_config.json'} could not be read ({_first_line(e)})") \
                    from None
        else:  # the OpenAI settings (what their preprocessor_config.json says), at the model's input size
            proc = CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    return net.float().eval().requires_grad_(False).to(device), tok, proc


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(e).__name__


def _pooled(out) -> torch.Tensor:
    """transformers 4 returns the projected features, 5 a model output holding them in ``pooler_output``."""
    return out if torch.is_tensor(out) else out.pooler_output


def check_prompts(prompts) -> list[str]:
    """``prompts`` as a list of non-empty strings, or a one-line error naming the first bad one."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)):
        raise VGenError(f"prompts must be a list of strings (one per image), got {type(prompts).__name__}")
    if not prompts:
        raise VGenError("prompts is empty: give one prompt per image")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise VGenError(f"prompts[{i}] is {type(p).__name__}, not a string")
        if not p.strip():
            raise VGenError(f"prompts[{i}] is empty: every image needs its prompt")
    return list(prompts)


def clip_score(images: torch.Tensor | str | os.PathLike, prompts: Sequence[str], model: str = DEFAULT_MODEL,
               weights: str | os.PathLike | None = None, batch_size: int = 64,
               device: str | torch.device = "cpu", progress: bool = False) -> dict:
    """CLIP score of ``images`` against ``prompts`` (image i with prompt i): torchmetrics' ``CLIPScore``,
    ``100 * max(cos(image embedding, text embedding), 0)`` per pair, averaged.

    Args:
        images: uint8 (N, 3, H, W) tensor or array, a folder of images (sorted file order; ``grid.png`` skipped),
            or an ADM ``.npz`` (``arr_0``); streamed in batches.
        prompts: N strings.
        model: ``"ViT-B/32"`` (``openai/clip-vit-base-patch32``) or ``"ViT-L/14"``
            (``openai/clip-vit-large-patch14``).
        weights: a folder with the model's config.json, model.safetensors and tokenizer files (or
            ``hf://owner/repo`` in the local HF cache); None: ``$VGEN_CLIP_WEIGHTS``, else ``model``'s repo in
            the local Hugging Face cache. Nothing is downloaded.
        batch_size: image-prompt pairs per forward pass (the score does not depend on it).
        device: where the model runs.
        progress: a progress bar over the images.

    Returns:
        ``{"mean", "std" (over pairs, ddof 0), "scores" (per pair, in order), "n", "model", "weights",
        "clamped" (pairs whose cosine was negative, scored 0), "truncated" (prompts cut to 77 tokens)}``.

    Every input (model name, weights folder and files, prompts, image count and dtype, device) is checked, each
    with a one-line ``VGenError``, before the model is loaded."""
    from vgen import validate
    from vgen.eval.sources import ImageSource
    _check_model(model)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise VGenError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    prompts = check_prompts(prompts)
    folder = clip_weights_folder(weights, model)
    cfg, name = read_config(folder, model)
    src = images if isinstance(images, ImageSource) else ImageSource(images, "samples")
    if len(src) != len(prompts):
        raise VGenError(f"samples: {len(src)} images but {len(prompts)} prompts: image i is scored against prompt i, "
                        "give one prompt per image")
    dev = validate.device(device)
    net, tok, proc = load_clip(folder, cfg, dev, model)
    max_len = cfg.text_config.max_position_embeddings
    size = cfg.vision_config.image_size
    scores, clamped, truncated = [], 0, 0
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(src), desc=f"CLIP score {name}", unit="image")
    with _quiet_transformers(), torch.inference_mode():
        start = 0
        for batch in src.batches(batch_size):
            texts = prompts[start:start + len(batch)]
            start += len(batch)
            pixels = proc(images=list(batch), return_tensors="pt")["pixel_values"]
            if tuple(pixels.shape[-2:]) != (size, size):
                raise VGenError(f"the CLIP processor of {folder} gives {tuple(pixels.shape[-2:])} px images, the "
                                f"model takes {size}: check preprocessor_config.json's crop_size")
            lengths = tok(texts, truncation=False)["input_ids"]
            truncated += sum(len(ids) > max_len for ids in lengths)
            enc = tok(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
            img = _pooled(net.get_image_features(pixel_values=pixels.to(dev, torch.float32)))
            txt = _pooled(net.get_text_features(input_ids=enc["input_ids"].to(dev),
                                                attention_mask=enc["attention_mask"].to(dev)))
            img = torch.nn.functional.normalize(img.float(), dim=-1)
            txt = torch.nn.functional.normalize(txt.float(), dim=-1)
            cos = (img * txt).sum(-1)
            clamped += int((cos < 0).sum())
            scores.append(100 * cos.clamp(min=0).cpu())
            if bar is not None:
                bar.update(len(batch))
    if bar is not None:
        bar.close()
    s = torch.cat(scores).double()
    if truncated:
        warnings.warn(f"{truncated} of {len(s)} prompts are longer than CLIP's {max_len} tokens: scored on their "
                      f"first {max_len} (start token, {max_len - 2} tokens, end token)", VGenWarning, stacklevel=2)
    return {"mean": float(s.mean()), "std": float(s.std(correction=0)), "scores": [float(x) for x in s],
            "n": len(s), "model": name, "weights": str(folder), "clamped": clamped, "truncated": truncated}
