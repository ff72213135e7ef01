"""The ``class`` kind: class ids, one per sample (``labels=``). Samplers read them as they are, a LongTensor (N,)
in 0..num_classes-1; the model's null class is the CFG null condition (``model.null_cond``)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vgen import validate
from vgen.conditions.base import KindBase, register_kind
from vgen.errors import VGenError


@dataclass(frozen=True)
class Labels:
    """Class ids, one per sample."""
    ids: tuple[int, ...]
    kind = "class"

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, idx: list[int]) -> Labels:
        return Labels(tuple(self.ids[i] for i in idx))

    def cycle(self, n: int) -> Labels:
        """Sample i gets entry ``i % len``: the first ``n`` samples of a job."""
        return Labels(tuple(self.ids[i % len(self.ids)] for i in range(n)))

    def record(self) -> dict:
        return {"labels": list(self.ids)}


def labels(value, num_classes: int) -> Labels:
    """Class ids in 0..num_classes-1 (``validate.labels`` for the forms accepted)."""
    ids = validate.labels(value)
    if ids.numel() == 0:
        raise VGenError("no labels given: pass at least one class id")
    bad = ids[(ids < 0) | (ids >= num_classes)]
    if bad.numel():
        raise VGenError(f"class id {int(bad[0])} out of range: this model has classes 0..{num_classes - 1}")
    return Labels(tuple(int(x) for x in ids))


class ClassKind(KindBase):
    """Class ids: ``num_classes`` of them on the card (the default kind: a card that names no ``conditioning``)."""
    name = "class"
    title = "class-conditional"
    noun = "label"
    has_classes = True
    card_keys = ("num_classes",)

    def parse(self, spec, labels_=None, prompts_=None, *, default_all_classes: bool = False) -> Labels:
        if prompts_ is not None:
            raise VGenError(f"{spec.name} is a {self.title} model and reads no text: give labels=[...] (class ids) "
                            "instead of prompts, or choose a text-to-image model")
        if labels_ is None:
            if not default_all_classes:
                raise VGenError("no labels given: pass at least one class id")
            return Labels(tuple(range(spec.num_classes)))
        return labels(labels_, spec.num_classes)

    def examples(self, card, n: int) -> Labels:
        return Labels(tuple(i % max(card.num_classes, 1) for i in range(n)))

    def card_facts(self, model) -> dict:
        return {}  # the default kind: the card's num_classes says it

    def encode(self, pipe, cond: Labels) -> torch.Tensor:
        return torch.tensor(cond.ids, dtype=torch.long, device=pipe.device)

    def check_tensor(self, cond: torch.Tensor, spec) -> None:
        if cond.is_floating_point():
            raise VGenError(f"{spec.name} is a class model: its conditions are class ids, got a {cond.dtype} tensor")
        if cond.dtype in (torch.int32, torch.int64):
            bad = cond[(cond < 0) | (cond >= spec.num_classes)]
            if bad.numel():
                raise VGenError(f"class id {int(bad[0])} out of range: this model has classes "
                                f"0..{spec.num_classes - 1}")

    def fallback(self, model, k: int, device=None) -> torch.Tensor:
        """Class ids spread over the classes."""
        return torch.tensor([i * model.num_classes // k % model.num_classes for i in range(k)], device=device)


CLASS = register_kind(ClassKind())
