"""Speculative sampling with a trained draft head (EAGLE; the drafter LANTERN and LANTERN++ use).

Each pass the target verifies ``window - 1`` drafts in one forward pass (the last decided token plus the drafts,
at every sample's own positions) on the one verification core every speculative sampler shares
(:func:`vgen.kernels.verify.verify`), with the rule ``accept`` names:

* ``exact`` (default): speculative sampling against the drafter's own distribution q, every token with AR's
  distribution. A chain is checked jointly by default (``verify=block``: block verification, Sun et al., ICLR
  2025, :func:`vgen.kernels.verify.block_accepts`: a draft the target likes less than the head can be carried by
  later ones it likes more; never fewer drafts kept in expectation); ``verify=token`` checks draft by draft,
  min(1, p(x) / q(x)) with the residual norm(max(0, p - q)) after the first rejection.
* ``lantern``: LANTERN's relaxed rule (latent neighbours' mass in the numerator, drift <= ``delta`` per token).
* ``gsd``: GSD's grouped rule (not lossless).

The drafts come from the draft head (:mod:`vgen.models.drafter`; its chain and tree as a draft source in
:mod:`vgen.samplers.speculative.head`), not from Jacobi iteration: after the target's
pass the head catches up on the pass's hidden states at the decided positions (one call over the window), then
proposes a chain of ``window - 1`` tokens, each drawn from its own distribution (guided, filtered and
temperature-scaled exactly as the target's) with the sample's own uniforms: batch-invariant and seeded like every
vgen sampler. The drafter's static cache, like the target's, needs no rollback: slot s holds the pair (target state
after token s-1, token s); slots past the decided prefix are overwritten before any query reads them.

``tree=...`` drafts a static tree instead of a chain (:mod:`vgen.kernels.tree`: LANTERN++'s preset, a branching
per depth, or explicit paths): the head runs once per depth over that depth's nodes (tree attention mask, scratch
slots past the sequence), the target verifies every node in one pass (tree mask over its static cache), siblings
are tried in rank order against the residual target, and the accepted path's keys and values move to their real
slots. ``children`` says how siblings are proposed: ``sample`` (i.i.d. draws from the head's distribution) or
``top`` (its most likely tokens, verified as one-hot proposals); both keep ``accept=exact`` exact.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from vgen.errors import VGenError
from vgen.interfaces import FeatureModel, ModelSpec, satisfies
from vgen.kernels.tree import parse_tree, static_tree
from vgen.models.drafter import Drafter
from vgen.samplers.base import option, register_sampler
from vgen.samplers.speculative import SpeculativeOptions, SpeculativeSampler
from vgen.samplers.speculative.head import HeadChain, HeadTree, accepted_by_depth
from vgen.samplers.speculative.rules import BlockRule, GSDRuleOptions, LanternRuleOptions, TokenRule
from vgen.samplers.speculative.step import StepConfig

ACCEPT = ("exact", "lantern", "gsd")
VERIFY = ("block", "token")
CHILDREN = ("sample", "top")
# The chain windows window=auto times (those <= max_window, and max_window itself): every width to 4, then 6 and 8
# (a wide window pays when most drafts pass, e.g. under LANTERN's rule; docs/lab/benchmarks-log.md "Wide windows")
TIMED_WINDOWS = (2, 3, 4, 6, 8)


@dataclass
class EagleOptions(GSDRuleOptions, LanternRuleOptions, SpeculativeOptions):
    """The head's chain or tree, the rule (``accept``), and that rule's options (LANTERN's ``k``, ``delta``,
    ``lam``; GSD's ``group_size``, ``p_threshold``, ``d_threshold``: used by their rule only)."""
    window: int | str = option("auto", "tokens per forward pass: the last decided one plus window-1 drafts from "
                               "the draft head; auto: the width (or AR's loop) with the most tokens per second, "
                               "timed once per model, device, settings and the job's batch size")
    max_window: int = option(8, "window=auto: the widest window it tries (it times 2, 3, 4, 6 and 8 up to this, and "
                             "this one)")
    delta: float = option(0.2, "accept=lantern: total-variation budget per token (the speed and FID-photo it trades "
                          "are in docs/samplers.md; the LANTERN paper's and the lantern sampler's default is 0.1)")
    accept: str = option("exact", "acceptance rule: exact (speculative sampling, AR's distribution), lantern "
                         "(relaxed, drift <= delta per token) or gsd (grouped, not lossless)", choices=ACCEPT)
    verify: str = option("block", "accept=exact with a chain: check the drafts jointly (block: block verification, "
                         "never fewer kept in expectation) or one by one (token); both exact", choices=VERIFY)
    drafter: str = option("", "the draft head: a drafter.safetensors file ('' = the one the model card names)")
    tree: str = option("", "draft a static tree instead of a chain: lantern++ (LANTERN++'s 25-node preset), a "
                       "branching per depth ('3,2,1'), or paths ('0|1|0.0'); '' = a chain of window - 1 drafts. "
                       "With a tree, window=auto chooses between the tree and AR's loop (timed), and any fixed "
                       "window runs the tree every pass")
    children: str = option("sample", "tree: how a node's children are proposed: sample (i.i.d. draws from the head) "
                           "or top (the head's most likely tokens)", choices=CHILDREN)

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.tree:
            parse_tree(self.tree)


@register_sampler
class EagleSampler(SpeculativeSampler):
    """``sampler=eagle``: a trained draft head proposes, the target verifies (exact by default)."""
    name = "eagle"
    Options = EagleOptions
    needs_draft = True
    draft_kind = "head"

    @property
    def needs_codebook(self) -> bool:
        return self.options.accept in ("lantern", "gsd")

    def acceptance(self, model, codebook):
        o = self.options
        if o.accept == "lantern":
            return o.lantern_rule(codebook)
        if o.accept == "gsd":
            return o.gsd_rule(codebook)
        return BlockRule() if o.verify == "block" and not o.tree else TokenRule()

    def draft_source(self, model, config: StepConfig, slots: int, draft=None):
        o = self.options
        if o.tree:
            tree = static_tree(parse_tree(o.tree), next(model.parameters()).device)
            return HeadTree(model, config, draft, slots, tree, o.children)
        return HeadChain(model, config, draft, slots)

    def check_draft(self, model, draft):
        if not satisfies(model, FeatureModel):
            raise VGenError(f"sampler 'eagle' reads the target's hidden states and {type(model).__name__} does not "
                            "expose them (vgen.interfaces.FeatureModel): use sjd, scd, gsd, lantern, zipar or pjd")
        if self.options.tree and self.options.children == "top":
            wide = max(Counter(p[:-1] for p in parse_tree(self.options.tree)).values())  # most children of a node
            if wide > model.vocab_size:
                raise VGenError(f"tree {self.options.tree!r} gives a node {wide} children but the model has "
                                f"{model.vocab_size} codes: children=top needs distinct codes (use children=sample "
                                "or a narrower tree)")
        if not isinstance(draft, Drafter):
            raise VGenError("sampler 'eagle' needs a draft head: pass drafter=<drafter.safetensors> (a Pipeline loads "
                            "the one its card names; train one with `vgen train recipe=drafter`)")
        draft.check_target(model)
        return draft.inference(model)  # the head's few-op path, built once per call (timed widths included)

    def tree_window(self) -> int | None:
        """With a tree: the base's window (the tree's nodes plus the last decided token)."""
        return len(parse_tree(self.options.tree)) + 1 if self.options.tree else None

    def timing_ident(self, draft) -> tuple:
        return (draft.drafter.digest(),)

    def _run(self, model, cond, seeds, progress, batch_size, codebook=None, prefix=None, draft=None):
        if self.options.window == "auto":  # one width for the job (the tree, with one), or AR's loop
            return self.run_auto(model, cond, seeds, progress, batch_size, codebook, prefix, draft)
        w = self.tree_window() or self.options.window  # a fixed window: the chain's, or the tree whatever its value
        return self.run_chosen(w, "fixed", model, cond, seeds, progress, batch_size, codebook, prefix, draft)

    def pass_depth(self, window: int) -> int:
        return max(map(len, parse_tree(self.options.tree))) + 1 if self.options.tree else window

    def decode(self, model, cond, seeds, progress, batch_size, codebook=None, prefix=None, draft=None, width=None,
               max_seconds=None):
        """The scheduler's run, plus the fraction of passes whose drafts were accepted to each depth."""
        tokens, stats = super().decode(model, cond, seeds, progress, batch_size, codebook, prefix, draft, width,
                                       max_seconds)
        o = self.options
        depth = max(map(len, parse_tree(o.tree))) if o.tree else o.window - 1  # a tree's deepest path
        stats["accepted_by_depth"] = accepted_by_depth(stats["step_map"], depth)
        return tokens, stats

    def timed_widths(self) -> list[int]:
        if self.options.tree:
            return [self.tree_window()]
        m = self.options.max_window
        return sorted({w for w in TIMED_WINDOWS if w <= m} | {m})
