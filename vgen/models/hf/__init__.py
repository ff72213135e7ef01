"""transformers' image-generating AR models as vgen next-token models, weights untouched (Janus / Janus-Pro, Emu3,
Chameleon weights as Lumina-mGPT and Anole).

``from_transformers(hf_model, height=None, width=None)`` wraps a loaded transformers model in
:class:`TransformersModel`, a :class:`vgen.interfaces.NextTokenModel` every vgen token sampler drives (``ar``, ``sjd``,
``scd``, ``gsd``, ``lantern``, ``zipar``, ``pjd``). Nothing is copied or converted: the adapter calls the model's own decoder
(``LlamaModel`` inside Janus, ``Emu3TextModel`` inside Emu3) with what speculative samplers need and transformers'
``generate`` never asks for:

* **vgen's static cache.** The decoder's attention layers call ``cache.update(k, v, layer_idx)``; the adapter hands them
  a view of a :class:`TransformersCache` (a :class:`vgen.kernels.kv_cache.KVCache` whose slots are positions) that
  writes the new keys at the slots the sampler chose and returns the filled prefix. Rollback is free: a slot past the
  accepted prefix is masked until it is overwritten.
* **Explicit 4-D boolean masks and per-row positions.** Windows, ZipAR's row-parallel masks and ragged rows go in as
  the attention mask (transformers returns a 4-D mask unchanged) and ``position_ids`` (B, S).
* **Batched CFG rows.** Rows [cond; null] share one forward pass, Emu3's negative prompt included (transformers runs
  Emu3's unconditional branch as a second, unbatched forward per token).

This keeps every sampler exact against the model's own forward (the same modules compute every logit) and costs one
decoder call per pass; re-implementing each family's attention in vgen would be faster to compile but would have to
track each family's RoPE and norm variants by hand.

**Conditions** are prompt token ids (``conditioning = "tokens"``): an int64 tensor (B, L), the prompts of one call
left-padded to one length with **negative ids** (-1) for padding. A padded row reads as the prompt alone (padding keys
hidden, positions counted from its first real token). ``model.prepare(cond)`` (called by every sampler) binds a view
of the model to the call's prompt length (``cond_len``) and checks the prompts before any forward pass.

**Forced tokens.** A family may force a token after each grid row (Emu3's row end). The sampler never sees it: token
i of the grid sits at vgen slot ``cond_len + i``; the adapter keeps the model's own slot layout underneath (row ends
included), feeds the row end in the same pass as the row's last token and returns the logits after it. A forced
token is never a draft to verify.

Families register where they are defined: each module of this package that defines one ends with
``register_family(...)`` (a :class:`TransformersFamily`: :mod:`vgen.models.hf.janus`, :mod:`vgen.models.hf.emu3`,
:mod:`vgen.models.hf.chameleon`), and every module here is imported on first use, so a new family is one new file.
"""
from __future__ import annotations

import importlib
import pkgutil

import torch.nn as nn

from vgen.errors import VGenError
from vgen.models.hf.adapter import (  # noqa: F401
    Family,
    FamilyBase,
    TransformersCache,
    TransformersFamily,
    TransformersModel,
    register_family,
    registered,
    registered_families,
)

_loaded = False


def _load_families() -> None:
    """Import every module of this package once (each family module registers itself; the others register
    nothing)."""
    global _loaded
    if not _loaded:
        for info in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{info.name}")
        _loaded = True


def families() -> list[str]:
    _load_families()
    return [f.name for f in registered_families()]


def family_of(hf_model: nn.Module) -> TransformersFamily | None:
    """The registered family of a loaded transformers model, or None."""
    _load_families()
    return next((f for f in registered_families() if f.detect(hf_model)), None)


def family_for_config(config: dict) -> TransformersFamily | None:
    """The registered family whose folders have this ``config.json``, or None."""
    _load_families()
    return next((f for f in registered_families() if f.matches(config)), None)


def from_transformers(hf_model: nn.Module, height: int | None = None, width: int | None = None,
                      **family_options) -> TransformersModel:
    """A vgen next-token model over a transformers image generator (the same modules, no copy). ``height`` /
    ``width``: the token grid (Emu3, Lumina-mGPT: required; Janus: its fixed grid; Anole: 32 x 32 unless given).
    Family options: Emu3's and Chameleon's ``negative_prompt_ids`` (the CFG row; default: Emu3 the prompt's last
    token, as transformers does; Chameleon its layout's, see :mod:`vgen.models.hf.chameleon`), Chameleon's
    ``layout`` ("lumina" / "anole") and ``vqgan`` (the decoder of its images: ``vgen.tokenizers.vqgan.load_vqgan`` of
    Meta's ``tokenizer/vqgan.ckpt``)."""
    _load_families()
    if not isinstance(hf_model, nn.Module):
        raise VGenError(f"from_transformers takes a loaded transformers model, got {type(hf_model).__name__}: "
                        "load it with e.g. JanusForConditionalGeneration.from_pretrained(<folder>)")
    family = family_of(hf_model)
    if family is not None:
        return TransformersModel(family.wrap(hf_model, height, width, **family_options), hf_model)
    kind = type(hf_model).__name__
    classes = []
    for f in registered_families():
        try:
            classes.append(f.model_class().__name__)
        except VGenError:  # registered for from_transformers alone: no class named
            pass
    raise VGenError(f"{kind} is not an image generator vgen can drive: supported are {', '.join(families())} "
                    f"({', '.join(classes)})")


