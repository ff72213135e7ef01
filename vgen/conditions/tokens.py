"""The ``tokens`` kind: prompt token ids (B, L), -1 = left padding, what a transformers image generator reads
(:mod:`vgen.models.hf`). The user gives prompts as for ``text`` (a transformers card says ``conditioning: text``;
``Card.model_conditioning`` is ``tokens``); the transformers pipeline's processor turns them into ids, and the model
binds a view to their length (``model.prepare``), which also holds its null (CFG) condition."""
from __future__ import annotations

import torch

from vgen.conditions.base import register_kind
from vgen.conditions.text import TextKind
from vgen.errors import VGenError


class TokensKind(TextKind):
    """Prompt token ids: read like ``text`` from the user's side; no text encoder, never named by a card."""
    name = "tokens"
    needs_text_encoder = False
    on_card = False
    card_keys = ()

    def calibration(self, card):
        return None  # the model's view holds its prompts' ids (model.prepare)

    def card_facts(self, model) -> dict:
        return {"conditioning": "text"}  # what the user gives: a transformers card names text

    def encode(self, pipe, cond) -> torch.Tensor:
        raise VGenError("prompt token ids come from a transformers pipeline's processor (vgen.load_pipeline of a "
                        "transformers model), not from a text encoder")

    def as_tensor(self, value, device=None) -> torch.Tensor:
        cond = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        if cond.dim() == 1:
            cond = cond[None]
        return cond.to(device) if device is not None else cond

    def bind(self, model, cond):
        return model.prepare(cond)

    def check_tensor(self, cond: torch.Tensor, spec) -> None:
        return None  # the model's prepare checks its ids

    def fallback(self, model, k: int, device=None) -> torch.Tensor:
        raise VGenError("calibrating a sampler on a transformers model needs its prompts' ids: sample through "
                        "vgen.load_pipeline or give a fixed window=<int>")


TOKENS = register_kind(TokensKind())
