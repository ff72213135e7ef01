"""The ``text`` kind: prompts, one per sample (``prompts=``, ``prompt_file=``), encoded by the pipeline's text
encoder into caption features (N, T, D), left-padded with zero rows (:mod:`vgen.models.text`); each prompt is
encoded on its own, so its features are the same bytes in any batch. The CFG null condition is the model's learned
null caption under the same mask (``model.null_cond``)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vgen.conditions.base import KindBase, register_kind
from vgen.errors import VGenError


@dataclass(frozen=True)
class Prompts:
    """Text prompts, one per sample."""
    texts: tuple[str, ...]
    kind = "text"

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, idx: list[int]) -> Prompts:
        return Prompts(tuple(self.texts[i] for i in idx))

    def cycle(self, n: int) -> Prompts:
        return Prompts(tuple(self.texts[i % len(self.texts)] for i in range(n)))

    def record(self) -> dict:
        return {"prompts": list(self.texts)}


def prompts(value, where: str = "prompts") -> Prompts:
    """A prompt or a list of prompts, each a non-empty string."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or isinstance(value, bool):
        raise VGenError(f"{where} must be a string or a list of strings, got {type(value).__name__}: e.g. "
                        "prompts='[\"a photo of the moon\"]'")
    if not value:
        raise VGenError(f"{where} is empty: give at least one prompt")
    for i, p in enumerate(value):
        if not isinstance(p, str):
            raise VGenError(f"{where}[{i}] must be a string, got {p!r} ({type(p).__name__})")
        if not p.strip():
            raise VGenError(f"{where}[{i}] is an empty prompt: every prompt needs some words")
    return Prompts(tuple(str(p) for p in value))


class TextKind(KindBase):
    """Prompts through the T5 encoder folder the card names (``text_encoder``), with its ``examples`` prompts."""
    name = "text"
    title = "text-to-image"
    noun = "prompt"
    reads_text = True
    needs_text_encoder = True
    card_keys = ("text_encoder",)

    def parse(self, spec, labels_=None, prompts_=None, *, default_all_classes: bool = False) -> Prompts:
        if labels_ is not None:
            raise VGenError(f"{spec.name} is a {self.title} model: give prompts=[...] (or prompt_file=) instead of "
                            "class labels")
        if prompts_ is None:
            raise VGenError(f"{spec.name} is a {self.title} model: give prompts, e.g. "
                            "prompts='[\"a photo of the moon\"]', or prompt_file=<.txt | .jsonl | .csv>")
        return prompts(prompts_)

    def examples(self, card, n: int) -> Prompts:
        ex = tuple(card.examples) or ("a photo",)
        return Prompts(tuple(ex[i % len(ex)] for i in range(n)))

    def calibration(self, card) -> Prompts:
        return self.examples(card, max(len(card.examples), 1))

    def encode(self, pipe, cond: Prompts) -> torch.Tensor:
        feats: dict[str, torch.Tensor] = {}
        for p in cond.texts:
            if p not in feats:
                feats[p] = pipe.text_encoder([p])[0]
        dt = next(pipe.model.parameters()).dtype
        return torch.stack([feats[p] for p in cond.texts]).to(pipe.device, dt)

    def check_tensor(self, cond: torch.Tensor, spec) -> None:
        if not cond.is_floating_point() or cond.dim() != 3:
            raise VGenError(f"{spec.name} is a text model: its conditions are caption features (N, T, D), got a "
                            f"{cond.dtype} tensor of shape {tuple(cond.shape)}: sample through a pipeline with "
                            "prompts=[...]")

    def fallback(self, model, k: int, device=None) -> torch.Tensor:
        raise VGenError("calibrating a sampler on a text model needs example prompts: sample through a pipeline "
                        "(vgen.load_pipeline: its card's examples) or give a fixed window=<int>")


TEXT = register_kind(TextKind())
