"""SJD-PAC (Kang et al., CVPR 2026): speculative Jacobi decoding with proactive draft trees and adaptive
continuation; training-free and exact.

Each pass verifies a static tree (:mod:`vgen.samplers.speculative.pac`): ``tree_width`` candidates at each of the
first ``tree_depth`` undecided positions, drawn without replacement from the distributions the last pass computed
there, then one chain out to ``window - 1`` drafts (after the first candidates' path, or with ``chains=leaves`` after
every leaf; ``spine``: siblings beside each draft of the main chain). Siblings are checked by recursive rejection
sampling, so every token has the AR sampler's distribution; ``continuation`` keeps last pass's drafts where the new
distribution allows them (a maximal coupling, as ``scd``'s ``coupling=maximal``); ``restart=mix`` draws the first
position after a rejection from the mean of the distributions after every candidate tried there. ``window=auto``
times this tree and each of ``trees`` (narrower ones: every node is a row of the pass) at ``max_window`` against AR's
loop and runs the fastest.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass

import torch

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec
from vgen.kernels.kv_cache import static_all
from vgen.kernels.tree import static_tree
from vgen.samplers.base import option, register_sampler
from vgen.samplers.speculative import SpeculativeOptions, SpeculativeSampler
from vgen.samplers.speculative.jacobi import FRESH_Q, INITS, check_init
from vgen.samplers.speculative.pac import PacTables, PacTree, pac_paths
from vgen.samplers.speculative.step import StepConfig

MAX_NODES = 512  # one pass feeds every node of the tree


@dataclass
class PacOptions(SpeculativeOptions):
    """The tree (``tree_width`` x ``tree_depth``, then a chain to ``window - 1`` drafts), the continuation and the
    drafts of new positions (``init``, ``fresh_q``, as sjd's)."""
    window: int | str = option("auto", "the main path's tokens per pass: the last decided one plus window-1 drafts "
                               "(the tree's branches sit on its first tree_depth positions); auto: this tree or one "
                               "of trees at max_window, or AR's own loop, whichever is fastest (timed once per model, "
                               "device, settings and the job's batch size)")
    tree_width: int = option(3, "candidates at each branched position (1: a chain, sjd with the continuation)")
    tree_depth: int = option(2, "positions after the decided prefix that branch (each node has tree_width children)")
    trees: str = option("2x1", "window=auto: narrower trees (width x depth, comma-separated) timed beside tree_width x "
                        "tree_depth at max_window, the fastest that beats AR's loop running the job (every node is a "
                        "row of the pass: where rows cost, as on a CPU, a narrow tree can pay when the wide one "
                        "cannot); '': that tree only")
    chains: str = option("main", "which leaves the chain to window-1 drafts hangs from: main (the first candidate's "
                         "path, the official tree) or leaves (every leaf: a pass that accepts a later sibling goes on "
                         "down its own chain, at the cost of one row per leaf and draft)", choices=("main", "leaves"))
    leaf_chain: int = option(0, "chains=leaves: drafts on the chain of each leaf off the main path (0: out to the "
                             "window, as the main path's); a pass that accepts a later sibling mostly ends within a "
                             "few of them, so a short chain keeps most of their gain at far fewer rows")
    spine: int = option(1, "candidates at each position of the main path's chain past the tree (1: its draft alone): "
                        "a pass whose chain is rejected there can still accept a sibling")
    spine_chain: int = option(0, "drafts on the chain after each of spine's siblings")
    continuation: bool = option(True, "keep last pass's drafts where the new distribution allows them (a maximal "
                                "coupling); false: fresh draws (the ablation)")
    restart: str = option("rank0", "the first position after a rejection: its candidates drawn from the distribution after "
                          "the rejected rank-0 candidate (rank0, the official) or from the mean of those after every "
                          "candidate tried there (mix)", choices=("rank0", "mix"))
    init: str = option("random", "drafts for new positions, as sjd's", choices=INITS)
    fresh_q: str = option("proposal", "draft distribution of new drafts, as sjd's", choices=FRESH_Q)

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.tree_width < 1 or self.tree_depth < 1:
            raise VGenError(f"tree_width and tree_depth must be >= 1, got {self.tree_width} and {self.tree_depth}")
        if self.leaf_chain < 0:
            raise VGenError(f"leaf_chain must be >= 0 (0: the leaves' chains run out to the window), got "
                            f"{self.leaf_chain}")
        if self.spine < 1 or self.spine_chain < 0:
            raise VGenError(f"spine must be >= 1 (1: the main chain without siblings) and spine_chain >= 0, got "
                            f"{self.spine} and {self.spine_chain}")
        if self.spine_chain and self.spine == 1:
            raise VGenError(f"spine_chain={self.spine_chain} is the chain after each sibling on the main path: it "
                            "needs spine >= 2 (with spine=1 there are none)")
        if self.leaf_chain and self.chains != "leaves":
            raise VGenError(f"leaf_chain={self.leaf_chain} caps the chains on the leaves off the main path: it needs "
                            "chains=leaves (with chains=main no leaf but the main path's carries a chain)")
        window = self.window if self.window != "auto" else self.max_window
        for width, depth in [(self.tree_width, self.tree_depth), *map(parse_tree, tree_list(self.trees))]:
            nodes = len(pac_paths(window, width, depth, self.chains, self.leaf_chain, self.spine, self.spine_chain))
            if nodes > MAX_NODES:
                raise VGenError(f"a tree of width {width} and depth {depth} with chains={self.chains}"
                                + (f", leaf_chain={self.leaf_chain}" if self.leaf_chain else "")
                                + (f", spine={self.spine}, spine_chain={self.spine_chain}" if self.spine > 1 else "")
                                + " at window "
                                f"{window} has {nodes} nodes: one pass would feed them all; use a narrower or "
                                f"shallower tree, a shorter window or leaf_chain, chains=main or a narrower spine (<= {MAX_NODES} "
                                "nodes)")
        check_init(self.init, spec)


def tree_list(text: str) -> list[str]:
    """``'2x1, 3x1'`` -> ['2x1', '3x1'] (each checked by :func:`parse_tree`)."""
    trees = [t.strip() for t in text.split(",") if t.strip()]
    for t in trees:
        parse_tree(t)
    return trees


def parse_tree(text: str) -> tuple[int, int]:
    """``'2x1'`` -> (tree_width 2, tree_depth 1)."""
    try:
        width, depth = (int(x) for x in text.lower().split("x"))
    except ValueError:
        width = depth = 0
    if width < 1 or depth < 1:
        raise VGenError(f"trees must look like '2x1,3x1' (tree_width x tree_depth, each >= 1), got {text!r}")
    return width, depth


def pac_tables(window: int, width: int, depth: int, device: torch.device, chains: str = "main",
               leaf_chain: int = 0, spine: int = 1, spine_chain: int = 0) -> PacTables:
    """A tree's tables, once per shape and device (the same tensors at every run: on CUDA static addresses, so the
    recorded graphs replay). Read-only."""
    return static_all(_pac_tables(window, width, depth, torch.device(device), chains, leaf_chain, spine, spine_chain))


@functools.lru_cache(maxsize=32)
def _pac_tables(window: int, width: int, depth: int, device: torch.device, chains: str, leaf_chain: int, spine: int,
                spine_chain: int) -> PacTables:
    return PacTables(static_tree(pac_paths(window, width, depth, chains, leaf_chain, spine, spine_chain), device),
                     device)


@register_sampler
class PacSampler(SpeculativeSampler):
    """``sampler=pac``: proactive draft trees (:class:`~vgen.samplers.speculative.pac.PacTree`) verified exactly by
    recursive rejection sampling (:class:`~vgen.samplers.speculative.rules.TokenRule`)."""
    name = "pac"
    Options = PacOptions

    def tables(self, model, window: int) -> PacTables:
        o = self.options
        return pac_tables(window, o.tree_width, o.tree_depth, next(model.parameters()).device, o.chains,
                          o.leaf_chain, o.spine, o.spine_chain)

    def step_config(self, model, widest: int) -> StepConfig:
        t = self.tables(model, widest)
        config = super().step_config(model, t.tree.size + 1)  # a pass feeds the last decided token and every node
        return dataclasses.replace(config, extra=PacTree.extra_uniforms(t))

    def draft_source(self, model, config: StepConfig, slots: int, draft=None):
        o = self.options
        window = o.window if o.window != "auto" else o.max_window
        return PacTree(model, config, slots, self.tables(model, window), o.init, o.fresh_q, o.continuation, o.restart)

    def tree(self) -> str:
        """This sampler's tree, ``'<tree_width>x<tree_depth>'``."""
        return f"{self.options.tree_width}x{self.options.tree_depth}"

    def with_tree(self, tree: str) -> PacSampler:
        """This sampler with the tree ``tree`` (``'2x1'``) and no other to time."""
        width, depth = parse_tree(tree)
        run = copy.copy(self)
        run.options = dataclasses.replace(self.options, tree_width=width, tree_depth=depth, trees="")
        return run

    def timed_widths(self) -> list[int | str]:
        """window=auto times this tree at max_window, and each of ``trees`` (keys ``'2x1'``) at max_window."""
        return [self.options.max_window, *[t for t in dict.fromkeys(tree_list(self.options.trees)) if t != self.tree()]]

    def run_width(self, window, model, cond, seeds, batch_size: int, progress: bool = False, codebook=None,
                  prefix=None, draft=None):
        if isinstance(window, str):  # one of ``trees``, at max_window
            return self.with_tree(window).run_width(self.options.max_window, model, cond, seeds, batch_size, progress,
                                                    codebook, prefix, draft)
        return super().run_width(window, model, cond, seeds, batch_size, progress, codebook, prefix, draft)

    def run_chosen(self, w, rule: str, model, cond, seeds, progress, batch_size, codebook=None, prefix=None,
                   draft=None):
        """As every speculative sampler's, ``w`` may be one of ``trees`` (run at max_window); the stats name the
        tree that ran (``tree``, with ``window``) unless AR's loop did."""
        if isinstance(w, str):
            return self.with_tree(w).run_chosen(self.options.max_window, rule, model, cond, seeds, progress,
                                                batch_size, codebook, prefix, draft)
        tokens, stats = super().run_chosen(w, rule, model, cond, seeds, progress, batch_size, codebook, prefix, draft)
        return tokens, stats if w == 1 else {**stats, "tree": self.tree()}
