"""What a sample is conditioned on: class ids, text prompts, or another registered kind of condition.

A model says which kind it reads (``ModelSpec.conditioning``: ``class``, ``text`` or ``tokens``, from its card before
any weights load, or from the model). Each kind is one module that registers a :class:`ConditionKind` where it is
defined (:func:`register_kind`): :mod:`vgen.conditions.classes` (``class``: class ids),
:mod:`vgen.conditions.text` (``text``: prompts) and :mod:`vgen.conditions.tokens` (``tokens``: a transformers
model's prompt token ids, given as prompts); :mod:`vgen.conditions.base` holds the Protocol and the registry. The
rest of vgen asks the kind (:func:`kind_of`) and never compares names.

:func:`condition` turns what a user gave (``labels=``, ``prompts=``, a prompt file's lines) into a checked
:class:`Labels` or :class:`Prompts`, with a one-line error for the wrong kind, an empty prompt, a class id out of
range. A pipeline turns it into the tensor the samplers see (``Pipeline.encode``: the kind's ``encode``): class ids
(N,) as they are; prompts through the pipeline's text encoder into caption features (N, T, D), left-padded with zero
rows (:mod:`vgen.models.text`). Both have a null condition for classifier-free guidance (``model.null_cond``) and a
few examples a model offers for calibration, benchmarks and the demo (:func:`examples`).
"""
from vgen.conditions.base import (
    DEFAULT_KIND,
    Condition,
    ConditionKind,
    KindBase,
    as_cond,
    card_kinds,
    condition,
    examples,
    kind_of,
    list_kinds,
    register_kind,
    unregister_kind,
)
from vgen.conditions.classes import ClassKind, Labels, labels
from vgen.conditions.text import Prompts, TextKind, prompts
from vgen.conditions.tokens import TokensKind

KINDS = tuple(card_kinds())  # the kinds a card may name, as registered at import ("class", "text"): card_kinds()

__all__ = ["DEFAULT_KIND", "KINDS", "ClassKind", "Condition", "ConditionKind", "KindBase", "Labels", "Prompts",
           "TextKind", "TokensKind", "as_cond", "card_kinds", "condition", "examples", "kind_of", "labels", "list_kinds", "prompts",
           "register_kind", "unregister_kind"]
