"""Speculative sampling with a draft model (Leviathan et al., ICML 2023; Chen et al., 2023), for image tokens: a
second model over the target's tokens drafts ``window - 1`` tokens per pass, the target verifies them in one pass,
and every decided token has the target's distribution (AR's, with its guidance, temperature and filtering).

The draft (``draft``) is a zoo name or pipeline folder of a model trained on the same tokenizer and grid, or the
target itself in fewer bits: ``self@int4`` (the default) or ``self@int8`` is a copy of the target's weights quantized
when the pipeline first needs it (:mod:`vgen.kernels.quant`), so no second checkpoint is trained or stored. A name
takes ``@int8`` / ``@int4`` too. The draft runs ``window - 1`` times per pass (:mod:`vgen.samplers.speculative.model`),
so it pays where a draft step costs much less than a target step: a smaller draft, or quantized weights on hardware
whose int4 kernels beat its float ones (on this project's CPU they do not: docs/quantization.md, and window=auto
then runs AR's loop).

A chain drawn draft by draft is checked jointly by default (``verify=block``: block verification, as ``eagle``'s
chain) or draft by draft (``token``); both exact.
"""
from __future__ import annotations

from dataclasses import dataclass

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec
from vgen.samplers.base import option, register_sampler
from vgen.samplers.speculative import SpeculativeOptions, SpeculativeSampler
from vgen.samplers.speculative.model import ModelChain
from vgen.samplers.speculative.rules import BlockRule, TokenRule
from vgen.samplers.speculative.step import StepConfig

VERIFY = ("block", "token")


@dataclass
class SpsOptions(SpeculativeOptions):
    """The draft model and how its chain is checked."""
    window: int | str = option("auto", "tokens per forward pass: the last decided one plus window-1 drafts from the "
                               "draft model; auto: the width 2 / 4 / 8 (or AR's loop) with the most tokens per second, "
                               "timed once per model, device, settings and the job's batch size")
    draft: str = option("self@int4", "the draft model: self@int4 / self@int8 (this model's weights quantized, made "
                        "at load), self (the model itself: every draft passes; a check), or a zoo name / pipeline "
                        "folder trained on the same tokenizer and grid, optionally @int8 / @int4")
    verify: str = option("block", "check the chain jointly (block: never fewer drafts kept in expectation) or draft "
                         "by draft (token); both exact", choices=VERIFY)

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if not self.draft:
            raise VGenError("draft is empty: name the draft model (self@int4, self@int8, or a zoo name / folder)")


@register_sampler
class SpsSampler(SpeculativeSampler):
    """``sampler=sps``: a draft model proposes a chain, the target verifies it exactly."""
    name = "sps"
    Options = SpsOptions
    needs_draft = True
    draft_kind = "model"

    def acceptance(self, model, codebook):
        return BlockRule() if self.options.verify == "block" else TokenRule()

    def draft_source(self, model, config: StepConfig, slots: int, draft=None):
        return ModelChain(model, config, draft, slots)

    def check_draft(self, model, draft):
        draft = super().check_draft(model, draft)
        for what in ("vocab_size", "seq_len", "cond_len"):
            if getattr(draft, what, None) != getattr(model, what):
                raise VGenError(f"the draft model's {what} ({getattr(draft, what, None)}) is not the target's "
                                f"({getattr(model, what)}): a draft must read the same condition and make the same "
                                "tokens (draft=self@int4 always does)")
        if not callable(getattr(draft, "decode", None)) or not callable(getattr(draft, "new_cache", None)):
            raise VGenError(f"{type(draft).__name__} cannot draft: sampler 'sps' feeds tokens through a draft with "
                            "decode and a static cache (a GPT-style model)")
        return draft
