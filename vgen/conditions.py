"""What a sample is conditioned on: class ids or text prompts, one type for both.

A model says which it reads (``ModelSpec.conditioning``: ``class`` or ``text``, from its card before any weights
load, or from the model). :func:`condition` turns what a user gave (``labels=``, ``prompts=``, a prompt file's lines)
into a checked :class:`Labels` or :class:`Prompts`, with a one-line error for the wrong kind, an empty prompt, a class
id out of range. A pipeline turns it into the tensor the samplers see (``Pipeline.encode``): class ids (N,) as they
are; prompts through the pipeline's text encoder into caption features (N, T, D), left-padded with zero rows
(:mod:`vgen.models.text`). Both have a null condition for classifier-free guidance (``model.null_cond``) and a few
examples a model offers for calibration, benchmarks and the demo (:func:`examples`).
"""
from __future__ import annotations

from dataclasses import dataclass

from vgen import validate
from vgen.errors import VGenError

KINDS = ("class", "text")


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


Condition = Labels | Prompts


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


def labels(value, num_classes: int) -> Labels:
    """Class ids in 0..num_classes-1 (``validate.labels`` for the forms accepted)."""
    ids = validate.labels(value)
    if ids.numel() == 0:
        raise VGenError("no labels given: pass at least one class id")
    bad = ids[(ids < 0) | (ids >= num_classes)]
    if bad.numel():
        raise VGenError(f"class id {int(bad[0])} out of range: this model has classes 0..{num_classes - 1}")
    return Labels(tuple(int(x) for x in ids))


def condition(spec, labels_=None, prompts_=None, *, default_all_classes: bool = False) -> Condition:
    """The condition a user gave, checked against ``spec`` (a :class:`vgen.interfaces.ModelSpec`): labels for a
    class model, prompts for a text model, not both. ``default_all_classes``: no labels given means every class
    (a class model's sampling job)."""
    kind = getattr(spec, "conditioning", "class")
    if labels_ is not None and prompts_ is not None:
        raise VGenError("give labels or prompts, not both")
    if kind in ("text", "tokens"):  # caption features or prompt token ids: either way the user gives prompts
        if labels_ is not None:
            raise VGenError(f"{spec.name} is a text-to-image model: give prompts=[...] (or prompt_file=) instead of "
                            "class labels")
        if prompts_ is None:
            raise VGenError(f"{spec.name} is a text-to-image model: give prompts, e.g. "
                            "prompts='[\"a photo of the moon\"]', or prompt_file=<.txt | .jsonl | .csv>")
        return prompts(prompts_)
    if prompts_ is not None:
        raise VGenError(f"{spec.name} is a class-conditional model and reads no text: give labels=[...] (class ids) "
                        "instead of prompts, or choose a text-to-image model")
    if labels_ is None:
        if not default_all_classes:
            raise VGenError("no labels given: pass at least one class id")
        return Labels(tuple(range(spec.num_classes)))
    return labels(labels_, spec.num_classes)


def examples(card, n: int) -> Condition:
    """``n`` conditions a model offers for calibration and benchmarks: the classes in turn (``i % classes``), or
    the card's example prompts in turn."""
    if getattr(card, "conditioning", "class") == "text":
        ex = tuple(card.examples) or ("a photo",)
        return Prompts(tuple(ex[i % len(ex)] for i in range(n)))
    return Labels(tuple(i % max(card.num_classes, 1) for i in range(n)))
