"""Proactive draft trees with adaptive continuation (SJD-PAC, CVPR 2026), the draft source of ``sampler=pac``.

In SJD about half the passes decide one token: a rejection at position i makes every later draft stale (they were
drawn given the rejected token), and the next pass starts over with one chain. Here every pass verifies a static
tree instead (:mod:`vgen.kernels.tree`): at each of the first ``tree_depth`` positions after the decided prefix it
holds ``tree_width`` candidates (the children of every node one level up), then one chain (rank 0) out to the
window: after the first candidates' path (``chains='main'``, the official tree) or after every leaf (``'leaves'``,
vgen's: a pass that accepts a later sibling goes on down its own chain; every chain holds the same drafts; ``leaf_chain``
caps the other leaves' chains, where a wide first level would otherwise cost a full chain per candidate; ``spine``
puts siblings beside each draft of the main chain past the tree, with chains of ``spine_chain`` drafts). The
candidates of a position are drawn, with no extra forward pass, from the distribution the last pass computed there
(stale, as Jacobi's drafts are) and **without replacement**: candidate r's proposal is that distribution with
candidates 0..r-1 removed, renormalised; the tree is verified by recursive rejection sampling
(:func:`vgen.kernels.tree.tree_verify`: each rejected sibling's proposal mass leaves the residual target before the
next sibling is tried), which keeps every decided token's distribution the target's.

**Adaptive continuation** (``continuation=true``): candidate 0 of a position that held a draft last pass is that draft
where the new (stale) distribution still allows it and a residual draw elsewhere: the maximal coupling of the old
draft's proposal with the new distribution (:func:`vgen.kernels.verify.maximal_coupling`, SCD's ``coupling=maximal``;
the official code does the same: keep the draft where it passes against the stale target, else draw from the
residual). Its law is the new distribution, so it is that candidate's proposal, and the verification stays exact.
``continuation=false`` draws candidate 0 afresh (the ablation).

**The first position after a rejection** (``restart``). The token decided at a rejection is a residual draw, often
one the stale distribution did not favour, so the distribution the last pass computed after the rejected rank-0
candidate (``restart='rank0'``) is a poor guess for the position after it. ``restart='mix'`` draws that column's
candidates from the mean of the distributions after every candidate tried at the rejected position (the decided
path's end's children: 32 at a 32-wide first level): a hedge over the contexts the pass saw, known before any draw,
so it is the candidates' proposal and the verification stays exact.

Positions past the last pass's window get drafts from ``init`` (:func:`~vgen.samplers.speculative.jacobi.fresh_drafts`)
and their other candidates without replacement from the same proposal; a proposal with no mass left for a candidate
(a copy's one-hot, a top-k support smaller than the width) leaves that node empty: it is never accepted.

Unlike the official code, the token at a rejection is decided in the pass that rejects (a residual draw, as SJD and
every vgen sampler), so the tree starts at the first undecided position: the official ``tree_depth`` counts the root
and the rejected position, so its default 3 is ``tree_depth=2`` here (docs/samplers.md).
"""
from __future__ import annotations

import torch

from vgen.kernels.sampling import sample_from_probs
from vgen.kernels.tree import StaticTree, tree_verify
from vgen.kernels.verify import gather_rows, maximal_coupling
from vgen.samplers.speculative.jacobi import fresh_drafts
from vgen.samplers.speculative.step import (
    Chain,
    SlotState,
    StepConfig,
    Verdict,
    keep_path,
    speculative_step,
    tree_forward,
)


def pac_paths(window: int, width: int, depth: int, chains: str = "main", leaf_chain: int = 0, spine: int = 1,
              spine_chain: int = 0) -> tuple[tuple[int, ...], ...]:
    """The tree: every path of ranks < ``width`` up to ``depth``, then a chain (ranks 0) out to ``window - 1``
    drafts: after the main path only (``chains='main'``, the official tree) or after every leaf (``'leaves'``; the
    chains of the leaves other than the main path's hold at most ``leaf_chain`` drafts, 0: out to the window too).
    ``spine`` > 1: every position of the main path's chain (past ``depth``) also holds ``spine - 1`` siblings of its
    rank-0 draft, each with a chain of ``spine_chain`` drafts."""
    level, paths = [()], []
    for _ in range(min(depth, window - 1)):
        level = [p + (r,) for p in level for r in range(width)]
        paths += level
    leaves = level if chains == "leaves" else [level[0]]

    def drafts(leaf: tuple[int, ...]) -> int:  # the chain's drafts after a leaf
        full = window - 1 - len(leaf)
        return full if leaf == level[0] or not leaf_chain else min(full, leaf_chain)
    paths += [leaf + (0,) * d for leaf in leaves for d in range(1, drafts(leaf) + 1)]
    for d in range(len(level[0]) + 1, window):  # the main chain's positions: siblings of its rank-0 drafts
        for r in range(1, spine):
            side = (0,) * (d - 1) + (r,)
            paths += [side + (0,) * c for c in range(min(spine_chain, window - 1 - d) + 1)]
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


class PacTables:
    """A tree's index tables for drafting: the candidates of every column (``widths``; column j:
    depth j + 1), each node's candidate among :func:`candidates`' draws (``source``), and the node that continues a
    decided path at every later depth."""

    def __init__(self, tree: StaticTree, device):
        paths = tree.paths
        index = {p: i + 1 for i, p in enumerate(paths)}
        self.tree, self.columns = tree, tree.depth_max
        self.widths = tuple(1 + max(p[-1] for p in paths if len(p) == j + 1) for j in range(tree.depth_max))
        self.rank_uniforms = sum(w - 1 for w in self.widths)  # one per candidate past rank 0
        offset = [tree.depth_max]  # where each column's ranks past 0 sit in candidates' list (after the rank 0s)
        for w in self.widths[:-1]:
            offset.append(offset[-1] + w - 1)
        self.source = torch.tensor([len(p) - 1 if p[-1] == 0 else offset[len(p) - 1] + p[-1] - 1 for p in paths],
                                   device=device)  # each node's candidate in that list
        main = [0] + [index[(0,) * d] for d in range(1, tree.depth_max + 1)]
        # the node continuing a decided path that ends at node a (0: the root) at every depth d past a's: its rank-0
        # descendants while they last, then the main path
        first = [0] + [index.get(p + (0,), 0) for p in paths]
        cont = [[0] * (tree.depth_max + 1) for _ in range(len(paths) + 1)]
        for a, pa in enumerate([()] + list(paths)):
            cur = a
            for d in range(len(pa) + 1, tree.depth_max + 1):
                cur = first[cur] or main[d]
                cont[a][d] = cur
        self.cont = torch.tensor(cont, device=device)  # (nodes + 1, depth_max + 1)


def candidates(base: torch.Tensor, rank0: torch.Tensor, u: torch.Tensor, t: PacTables):
    """Node tokens (B, N) and proposals (B, N, V) of a tree whose column j's candidate 0 is ``rank0[:, j]``, drawn from
    ``base[:, j]`` (B, J, V), and whose other ``t.widths[j] - 1`` candidates are drawn without replacement from it,
    in rank order, with uniforms ``u`` (B, >= t.rank_uniforms), column by column."""
    toks, props = [rank0], [base]  # rank 0 of every column, then the other ranks column by column
    for j, w in enumerate(t.widths):
        if w == 1:
            continue
        left, prev = base[:, j].clone(), rank0[:, j]
        for _ in range(1, w):
            left.scatter_(1, prev[:, None], 0.0)  # without replacement: the earlier candidates are gone
            mass = left.sum(-1, keepdim=True)
            props.append(torch.where(mass > 0, left / mass.clamp_min(1e-30), torch.zeros_like(left))[:, None])
            prev = sample_from_probs(torch.where(mass > 0, left, base[:, j]), u[:, len(toks) - 1])
            toks.append(prev[:, None])
    return torch.cat(toks, 1)[:, t.source], torch.cat(props, 1)[:, t.source]


def pac_step(model, cache, s: SlotState, wv, it, W: int, c: StepConfig, rule, **args) -> None:
    """One pass of the proactive tree (:func:`~vgen.samplers.speculative.step.speculative_step` with
    :class:`PacTree`'s hooks)."""
    speculative_step(PacTree, model, cache, s, wv, it, W, c, rule, **args)


class PacTree(Chain):
    """SJD-PAC's tree as a draft source (module docstring); ``step_args``: the tree's tables, ``init``, ``fresh_q``
    and ``continuation``."""
    step_fn = staticmethod(pac_step)

    @staticmethod
    def depths(W: int, device, *, tables: PacTables, **args) -> torch.Tensor:
        return tables.tree.depth

    @staticmethod
    def forward(model, inp, pos, cache, c: StepConfig, *, tables: PacTables, **args):
        return tree_forward(model, inp, pos, cache, c, tables.tree, features=False)

    @staticmethod
    def decide(p, s: SlotState, wv, us, W: int, c: StepConfig, rule, *, tables: PacTables, **args) -> Verdict:
        """Recursive rejection over the tree (:func:`vgen.kernels.tree.tree_verify`); an empty node (no proposal
        mass) is never accepted."""
        tree = tables.tree
        n, N = s.n, tree.size
        ua, ur = us[0], us[1]
        x = s.tokens.gather(1, n[:, None] + torch.arange(N, device=n.device))
        q = s.qwin[:, :N]
        inside = ((n - 1)[:, None] + tree.depth[None, 1:] < c.L) & (q.gather(-1, x[..., None]).squeeze(-1) > 0)
        path, k, tok = tree_verify(tree, p, q, x, inside, ua[:, :N], ur[:, 0], rule)
        ar = torch.arange(tree.depth_max + 1, device=n.device)
        pnodes = torch.cat([torch.zeros_like(k[:, None]), path], 1)  # the node before each decided position
        ptok = torch.cat([x.gather(1, (path - 1).clamp_min(0)), torch.zeros_like(k[:, None])], 1)
        return Verdict(k, torch.where(ar < k[:, None], ptok, tok[:, None]), pnodes, (path, x, inside))

    @staticmethod
    def draft(model, cache, tokens, s: SlotState, v: Verdict, wv, p, h, us, W: int, c: StepConfig, *,
              tables: PacTables, init: str, fresh_q: str, continuation: bool, restart: str, **args):
        """The accepted path's keys and values move to their slots; the next tree's candidates come from the
        distributions this pass computed after the nodes that continue the decided path (rank 0 from the deepest
        decided node, the main path where that runs out), positions past the tree from ``init``."""
        tree = tables.tree
        n, k, (path, x, inside) = s.n, v.k, v.memo
        J, dev = tables.columns, n.device
        keep_path(model, cache, n, path, c, tree)
        ex = us[4]
        keep_u, redraw_u = ex[:, :J], ex[:, J:2 * J]
        rank_u, fresh_u = ex[:, 2 * J:2 * J + tables.rank_uniforms], ex[:, -(J + 1):]
        # the node continuing the decided path at every depth d = 1..J (path, then rank 0, then the main path)
        end = torch.where(k > 0, path.gather(1, (k - 1).clamp_min(0)[:, None]).squeeze(1), 0)
        d = torch.arange(1, J + 1, device=dev)
        cont = torch.where(d <= k[:, None], path[:, :J], tables.cont[end][:, 1:])  # (B, J)
        nn = n + k + 1  # the next tree's column j sits at position nn + j = depth k + 2 + j of this tree
        ar = torch.arange(J, device=dev)
        dg = k[:, None] + 1 + ar  # depth of the node whose target is column j's distribution
        dx = dg + 1  # depth of the old draft at column j
        stale = dg <= J
        g = gather_rows(p, torch.where(stale, cont.gather(1, (dg - 1).clamp_max(J - 1)), 0))  # (B, J, V)
        if restart == "mix":  # column 0: the mean of the distributions after every candidate tried after the path
            w = ((tree.parent[None, 1:] == end[:, None]) & inside).float()  # (B, N): the path end's children
            mass = w.sum(-1, keepdim=True)
            mix = torch.bmm((w / mass.clamp_min(1)).unsqueeze(1), p[:, 1:tree.size + 1]).squeeze(1)
            g[:, 0] = torch.where(mass > 0, mix, g[:, 0])
        # new positions (past this tree): drafts from init after the node continuing the decided path at the last
        # depth, proposals as Jacobi's
        last = n - 1 + J
        p_last = gather_rows(p, cont[:, J - 1:])[:, 0]
        f, fq = fresh_drafts(tokens, last, p_last, fresh_u, init=init, fresh_q=fresh_q, grid=c.grid)
        fj = (dg - J).clamp(0, J)  # column j's index among the new positions (from position n + J)
        base = torch.where(stale[..., None], g, gather_rows(fq, fj))
        r0 = sample_from_probs(g, redraw_u)
        if continuation:  # the old draft where the new distribution allows it, else a residual draw
            old = dx <= J
            node = cont.gather(1, (dx - 1).clamp_max(J - 1))
            xo = x.gather(1, (node - 1).clamp_min(0))
            qo = gather_rows(s.qwin, (node - 1).clamp_min(0))
            r0 = torch.where(old, maximal_coupling(g, qo, xo, keep_u, redraw_u), r0)
        r0 = torch.where(stale, r0, f.gather(1, fj))
        toks, qn = candidates(base, r0, rank_u, tables)
        tokens = tokens.scatter(1, nn[:, None] + torch.arange(tree.size, device=dev), toks)
        return tokens, qn

    @staticmethod
    def span(wv, *, tables: PacTables, **args):
        return torch.full_like(wv, tables.tree.depth_max + 1)

    def __init__(self, model, config: StepConfig, slots: int, tables: PacTables, init: str, fresh_q: str,
                 continuation: bool, restart: str):
        self.config, self.tables, self.init, self.fresh_q = config, tables, init, fresh_q
        self.step_args = dict(tables=tables, init=init, fresh_q=fresh_q, continuation=continuation, restart=restart)

    @staticmethod
    def extra_uniforms(tables: PacTables) -> int:
        return 3 * tables.columns + 1 + tables.rank_uniforms

    def new_cache(self, model, rows: int):
        return model.new_cache(rows, max_len=model.cond_len + model.seq_len + self.tables.tree.size)  # + scratch

    def first_drafts(self, model, tokens, first, p0, uf, feats, refilled):
        """The first tree after a prefill: every column from ``init``, its other candidates without replacement."""
        t = self.tables
        J = t.columns
        f, fq = fresh_drafts(tokens, first, p0, uf[:, :J], init=self.init, fresh_q=self.fresh_q, grid=self.config.grid)
        return candidates(fq, f, uf[:, J:], t)  # node j at offset j - 1 after the first token
