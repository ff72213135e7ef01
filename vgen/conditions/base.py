"""The condition-kind Protocol and its registry: every kind of condition (class ids, prompts, ...) is one module
that registers a :class:`ConditionKind` where it is defined (:func:`register_kind` at its bottom); everything else
asks the kind (:func:`kind_of`) instead of comparing names."""
from __future__ import annotations

from typing import Protocol

import torch

from vgen.errors import VGenError

DEFAULT_KIND = "class"  # the kind of a model, spec or card that names none (no ``conditioning``)


class Condition(Protocol):
    """A checked condition, one entry per sample, as one kind parsed it from what a user gave (:class:`Labels`,
    :class:`Prompts`)."""
    kind: str  # the registered name of the kind that reads it back (``kind_of(cond.kind)``)

    def __len__(self) -> int: ...

    def take(self, idx: list[int]) -> Condition:
        """The entries at ``idx``: a batch."""

    def cycle(self, n: int) -> Condition:
        """Sample i gets entry ``i % len``: the first ``n`` samples of a job."""

    def record(self) -> dict:
        """What stats.json and the demo record of it: ``{"labels": [...]}``, ``{"prompts": [...]}``."""


class ConditionKind(Protocol):
    """One kind of condition: what a model reads (``ModelSpec.conditioning`` and a card's ``conditioning`` name it),
    what a user gives for it, and how it becomes the tensor the samplers see. Register one with
    :func:`register_kind`; :class:`KindBase` has the defaults most kinds keep."""
    name: str  # "class", "text", "tokens": the value of ``conditioning``
    title: str  # how errors name a model of this kind: "class-conditional", "text-to-image"
    noun: str  # one condition as the user gives it: "label", "prompt"
    reads_text: bool  # the user gives prompts (prompts=, prompt_file=, the demo's prompt box), not labels=
    needs_text_encoder: bool  # a Pipeline encodes the prompts with its text encoder (the card's text_encoder)
    has_classes: bool  # class ids 0..num_classes-1: the card's num_classes and class_names count
    on_card: bool  # a pipeline card may name it (``conditioning: <name>``)
    card_keys: tuple[str, ...]  # keys a card of this kind must hold besides the model's and tokenizer's (Card.load)

    def parse(self, spec, labels_=None, prompts_=None, *, default_all_classes: bool = False) -> Condition:
        """What a user gave (``labels_`` or ``prompts_``, at most one not None), checked against ``spec`` (its
        ``name``, ``num_classes``): a :class:`Condition`, or a one-line :class:`VGenError` naming the kind."""

    def examples(self, card, n: int) -> Condition:
        """``n`` conditions a model offers for calibration, benchmarks and the demo."""

    def calibration(self, card) -> Condition | None:
        """The conditions a Pipeline encodes onto its model for ``window=auto`` (``model.examples``); None: the
        model's own :meth:`fallback`."""

    def card_facts(self, model) -> dict:
        """The card keys that state this kind (``Card.from_model``, ``save_pipeline``); ``num_classes`` is kept
        only where :attr:`has_classes`."""

    def encode(self, pipe, cond: Condition) -> torch.Tensor:
        """A condition -> the tensor a Pipeline's samplers read (batched and padded on ``pipe.device``)."""

    def as_tensor(self, value, device=None) -> torch.Tensor:
        """What a raw ``vgen.sample(model, value)`` call gives -> the tensor the samplers read."""

    def bind(self, model, cond: torch.Tensor) -> tuple:
        """(model, cond) as the sampler drives them: a model may bind a view to the conditions (prompt ids)."""

    def check_tensor(self, cond: torch.Tensor, spec) -> None:
        """A one-line VGenError when ``cond`` is not what a model of this kind reads."""

    def fallback(self, model, k: int, device=None) -> torch.Tensor:
        """``k`` conditions to calibrate a sampler on a bare model with (no ``model.examples``), or a VGenError."""


_MEMBERS = tuple(sorted(set(ConditionKind.__annotations__)
                        | {k for k, v in vars(ConditionKind).items() if callable(v) and not k.startswith("_")}))
_KINDS: dict[str, ConditionKind] = {}


def as_cond(labels, device=None) -> torch.Tensor:
    """Class ids (an int, a list, an integer tensor) or a text model's caption features (a float tensor)."""
    from vgen import validate
    if isinstance(labels, torch.Tensor) and labels.is_floating_point():
        t = labels
    else:
        t = validate.labels(labels)
    if t.dim() == 0:
        t = t[None]
    if not t.is_floating_point():
        t = t.long()
    return t.to(device) if device is not None else t


class KindBase:
    """Defaults for a :class:`ConditionKind`: a subclass sets ``name`` and writes ``parse``, ``examples`` and
    ``encode``."""
    name = ""
    title = ""
    noun = "condition"
    reads_text = False
    needs_text_encoder = False
    has_classes = False
    on_card = True
    card_keys: tuple[str, ...] = ()

    def calibration(self, card):
        return None

    def card_facts(self, model) -> dict:
        return {"conditioning": self.name}

    def as_tensor(self, value, device=None):
        return as_cond(value, device)

    def bind(self, model, cond):
        return model, cond

    def check_tensor(self, cond, spec) -> None:
        return None

    def fallback(self, model, k: int, device=None):
        raise VGenError(f"calibrating a sampler on a {self.title or self.name} model needs example conditions: "
                        "sample through a pipeline (vgen.load_pipeline: its card's examples) or give a fixed "
                        "window=<int>")


def register_kind(kind: ConditionKind, replace: bool = False) -> ConditionKind:
    """Register a condition kind (an instance) under ``kind.name``; returns it. A name already taken by another
    kind is refused unless ``replace``."""
    missing = [m for m in _MEMBERS if not hasattr(kind, m)]
    if missing:
        raise VGenError(f"condition kind {getattr(kind, 'name', kind)!r} lacks {', '.join(missing)}: see "
                        "vgen.conditions.ConditionKind (vgen.conditions.KindBase has the defaults)")
    if not isinstance(kind.name, str) or not kind.name:
        raise VGenError(f"a condition kind's name must be a non-empty string, got {kind.name!r}")
    old = _KINDS.get(kind.name)
    if old is not None and old is not kind and not replace:
        raise VGenError(f"condition kind {kind.name!r} is already registered ({type(old).__name__}): choose "
                        "another name, or register_kind(kind, replace=True)")
    _KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    """Forget the kind registered as ``name`` (a test's toy kind)."""
    _KINDS.pop(name, None)


def list_kinds() -> list[str]:
    """The registered kinds' names, in registration order."""
    return list(_KINDS)


def card_kinds() -> list[str]:
    """The kinds a pipeline card may name (``conditioning``), in registration order."""
    return [n for n, k in _KINDS.items() if k.on_card]


def kind_of(what) -> ConditionKind:
    """The kind ``what`` names: a name, or a model, :class:`vgen.interfaces.ModelSpec` or card (its
    ``conditioning``; the default kind, ``class``, when it has none). A one-line error for an unknown name."""
    name = what if isinstance(what, str) else getattr(what, "conditioning", DEFAULT_KIND)
    kind = _KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise VGenError(f"unknown condition kind {name!r}: the registered kinds are {', '.join(_KINDS)} "
                        "(vgen.conditions.register_kind adds one)")
    return kind


def condition(spec, labels_=None, prompts_=None, *, default_all_classes: bool = False) -> Condition:
    """The condition a user gave, checked against ``spec`` (a :class:`vgen.interfaces.ModelSpec`) by its kind:
    labels for a class model, prompts for a text model, not both. ``default_all_classes``: no labels given means
    every class (a class model's sampling job)."""
    kind = kind_of(spec)
    if labels_ is not None and prompts_ is not None:
        raise VGenError("give labels or prompts, not both")
    return kind.parse(spec, labels_, prompts_, default_all_classes=default_all_classes)


def examples(card, n: int) -> Condition:
    """``n`` conditions a model offers for calibration and benchmarks (its kind's :meth:`ConditionKind.examples`):
    the classes in turn (``i % classes``), or the card's example prompts in turn."""
    return kind_of(card).examples(card, n)
