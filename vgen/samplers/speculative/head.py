"""A trained draft head as a draft source (:class:`~vgen.samplers.speculative.scheduler.DraftSource`): its chain
(:class:`HeadChain`) and its static tree (:class:`HeadTree`), with their step functions. ``sampler=eagle``
(:mod:`vgen.samplers.eagle`) composes them with an acceptance rule.

After the target's pass the head catches up on the pass's hidden states at the decided positions (one call over the
window), then proposes a chain of ``window - 1`` tokens, each drawn from its own distribution (guided, filtered and
temperature-scaled exactly as the target's) with the sample's own uniforms: batch-invariant and seeded like every
vgen sampler. The drafter's static cache, like the target's, needs no rollback: slot s holds the pair (target state
after token s-1, token s); slots past the decided prefix are overwritten before any query reads them. A tree is
drafted one depth at a time over that depth's nodes (tree attention mask, scratch slots past the sequence), verified
in one target pass, and the accepted path's keys and values move to their real slots.
"""
from __future__ import annotations

import torch

from vgen.kernels.sampling import cumsum, sample_from_probs
from vgen.kernels.tree import StaticTree, tree_verify
from vgen.kernels.verify import gather_rows, guided_logits, window_target
from vgen.models.drafter import InferenceHead
from vgen.samplers.speculative.step import (
    Chain,
    SlotState,
    StepConfig,
    Verdict,
    keep_path,
    speculative_step,
    tree_forward,
)


def draft_dist(logits: torch.Tensor, token_index: torch.Tensor, cfg: bool, cfg_scale: float, cfg_interval: int,
               temperature: float, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The head's distribution at each position (``logits`` (rows, S, V), rows [cond; uncond] under CFG;
    ``token_index`` (B, S) as :func:`window_target`'s), guided, temperature-scaled and filtered as the target's, as
    (probabilities, token ids): with top-k and no top-p, over the k kept tokens only ((B, S, k) each, most likely
    first), so a draw searches k entries, not V (:func:`draw`); otherwise over the vocabulary (ids None). At a
    k-th-place tie it keeps exactly k tokens where the target's filter keeps every tied one: the drafts are drawn
    from this distribution and verified against it (:func:`dense`), so the exact rule stays exact."""
    if top_k <= 0 or top_k >= logits.shape[-1] or top_p < 1.0:
        return window_target(logits, token_index, cfg, cfg_scale, cfg_interval, temperature, top_k, top_p), None
    logits = guided_logits(logits, token_index, cfg, cfg_scale, cfg_interval)
    if temperature != 1.0:  # x / 1.0 is x: the division is skipped, not changed
        logits = logits / max(temperature, 1e-5)
    vals, ids = logits.topk(top_k, dim=-1)
    return vals.softmax(-1), ids


def draw(probs: torch.Tensor, ids: torch.Tensor | None, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws from :func:`draft_dist`'s (probabilities (..., K), ids) with uniforms ``u`` (...) -> token
    ids (...): the first entry whose cumulative mass reaches u * total. Never a zero-probability token: the probs
    are sorted, most likely first, so an entry with none repeats its predecessor's cumulative mass (which reached
    it first), and u < 1 keeps u * total <= total (no entry past the last)."""
    if ids is None:
        return sample_from_probs(probs, u)
    cdf = cumsum(probs)
    return ids.gather(-1, torch.searchsorted(cdf, u[..., None] * cdf[..., -1:])).squeeze(-1)


def dense(probs: torch.Tensor, ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """:func:`draft_dist`'s distribution over the whole vocabulary (..., V), as verification takes it."""
    if ids is None:
        return probs
    return probs.new_zeros(*probs.shape[:-1], vocab_size).scatter_(-1, ids, probs)


def catch_up(model, drafter: InferenceHead, dcache, h, x, pos, kr, length: int | None = None):
    """The head's state after each row's decided token: (rows, 1, d) from the pass's target states ``h`` and tokens
    ``x`` (rows, W) at ``pos``, row r's decided one at column ``kr[r]`` ((rows, 1)). A head that attends writes every
    column into its cache (its later queries read them); one that does not runs on that column alone. ``length``:
    the slots the head's attention reads until the next catch-up (None: all)."""
    if drafter.attends:
        dcache.limit(length)
        g = drafter(model, h, x, pos, dcache)
        return g.gather(1, kr[..., None].expand(-1, 1, g.shape[-1]))
    return drafter(model, h.gather(1, kr[..., None].expand(-1, 1, h.shape[-1])), x.gather(1, kr), pos.gather(1, kr))


def draft_chain(model, drafter: InferenceHead, dcache, g, nxt, uf, L: int, cfg: bool, live, sampling: dict):
    """``D = uf.shape[1]`` drafts from the head's state ``g`` (rows, 1, d), which predicts token ``nxt`` (B,):
    draw token nxt from the head's distribution, feed (g, token) at its slot, and so on. Rows not ``live`` write to
    a junk slot (the last one: it only ever predicts past the end). Returns drafts (B, D) and their distributions
    (B, D, V)."""
    D = uf.shape[1]
    t = nxt[:, None] + torch.arange(D, device=nxt.device)  # the token index of each draft
    pos = torch.where(live[:, None] & (t < L), model.cond_len + t, model.cond_len + L - 1)  # its slot (or junk)
    if cfg:
        pos = torch.cat([pos, pos])
    drafts, ps, ids = [], [], []
    for j in range(D):
        probs, top = draft_dist(drafter.logits(model, g), t[:, j:j + 1], cfg, **sampling)
        ps.append(probs[:, 0])
        ids.append(None if top is None else top[:, 0])
        drafts.append(draw(ps[-1], ids[-1], uf[:, j]))
        if j < D - 1:
            x = drafts[-1][:, None]
            g = drafter(model, g, torch.cat([x, x]) if cfg else x, pos[:, j:j + 1], dcache)
    return torch.stack(drafts, 1), dense(torch.stack(ps, 1), None if ids[0] is None else torch.stack(ids, 1),
                                         model.vocab_size)


def chain_step(model, cache, s: SlotState, wv, it, W: int, c: StepConfig, rule, **args) -> None:
    """One pass of the head's chain (:func:`~vgen.samplers.speculative.step.speculative_step` with
    :class:`HeadChain`'s hooks)."""
    speculative_step(HeadChain, model, cache, s, wv, it, W, c, rule, **args)


def draft_tree(model, drafter: InferenceHead, dcache, tree: StaticTree, g, nxt, uf, L: int, cfg: bool, sampling: dict,
               children: str):
    """A static tree of drafts from the head's state ``g`` (rows, 1, d), which predicts token ``nxt`` (B,): per
    depth, each parent's distribution proposes its children (``sample``: draws with the node's uniform from ``uf``
    (B, N); ``top``: its most likely tokens, one-hot proposals), then the head runs once over the depth's inner
    nodes (scratch slots past the sequence, tree mask) for their children's distributions. Returns node tokens
    (B, N) and proposals (B, N, V)."""
    B, N, V = nxt.shape[0], tree.size, model.vocab_size
    base = model.cond_len + L
    last = model.cond_len + nxt - 1  # the head's decided slots
    if cfg:
        last = torch.cat([last, last])
    f = torch.zeros((B, N), dtype=torch.long, device=nxt.device)
    qn = torch.zeros((B, N, V), device=nxt.device)
    Q, I = draft_dist(drafter.logits(model, g), nxt[:, None], cfg, **sampling)  # (B, 1, k): the root's children's
    G = g
    for d, (nodes, col, ranks, inner, icol) in enumerate(tree.levels, start=1):
        qp, ip = Q[:, col], None if I is None else I[:, col]  # (B, M, k): each node's parent's distribution
        if children == "sample":
            x = draw(qp, ip, uf[:, nodes - 1])
            qx = dense(qp, ip, V)
        else:
            top = dense(Q, I, V).topk(tree.max_children, dim=-1).indices  # (B, parents, most children)
            x = top[:, col, ranks]
            qx = torch.nn.functional.one_hot(x, V).to(qn.dtype)
        f[:, nodes - 1] = x
        qn[:, nodes - 1] = qx
        if inner.numel() == 0:
            break
        tok = x[:, icol]
        pos = model.cond_len + (nxt + d - 1).clamp_max(L - 1)[:, None].expand(-1, inner.numel())
        slot = (base + inner - 1)[None].expand(B, -1)
        if cfg:
            tok, pos, slot = torch.cat([tok, tok]), torch.cat([pos, pos]), torch.cat([slot, slot])
        if not drafter.attends:  # each node reads its parent's state alone
            G = drafter(model, G[:, col[icol]], tok, pos)
        else:
            dcache.write_at(slot)
            G = drafter(model, G[:, col[icol]], tok, pos, dcache, attn_mask=tree.head_mask(inner, last, dcache.slots))
            dcache.write_at(None)
        Q, I = draft_dist(drafter.logits(model, G), (nxt + d)[:, None].expand(-1, inner.numel()), cfg, **sampling)
    return f, qn


def tree_step(model, cache, s: SlotState, wv, it, W: int, c: StepConfig, rule, **args) -> None:
    """One pass of the head's tree (:func:`~vgen.samplers.speculative.step.speculative_step` with
    :class:`HeadTree`'s hooks)."""
    speculative_step(HeadTree, model, cache, s, wv, it, W, c, rule, **args)


def accepted_by_depth(step_map: torch.Tensor, depth: int) -> list[float]:
    """From a sampler's step map (N, L: the pass that decided each token): the fraction of passes whose drafts were
    accepted to depth d, for d = 1..``depth`` (a pass that decides j tokens accepted j - 1 drafts). The prefill's
    token and each sample's last pass (cut short by the end of the image) are left out."""
    sm = step_map.long()
    sm = sm - sm[:, :1]  # the prefill's pass: 0 (tokens are decided left to right: passes never decrease)
    per_pass = torch.zeros(sm.shape[0], int(sm.max()) + 1, dtype=torch.long, device=sm.device).scatter_add_(
        1, sm, torch.ones_like(sm))
    per_pass[:, 0] = 0
    per_pass.scatter_(1, sm[:, -1:], 0)  # the last pass
    passes = int((per_pass > 0).sum())
    reached = [int((per_pass > d + 1).sum()) for d in range(depth)]
    return [r / passes if passes else 0.0 for r in reached]

class HeadChain(Chain):
    """The draft head's chain (:class:`~vgen.samplers.speculative.scheduler.DraftSource`): after each target pass the head
    catches up on the pass's hidden states and drafts ``window - 1`` tokens, each from its own distribution."""
    step_fn = staticmethod(chain_step)

    # the pass (:class:`~vgen.samplers.speculative.step.PassHooks`); step_args: drafter, dcache (and a tree's)
    @staticmethod
    def forward(model, inp, pos, cache, c: StepConfig, **args):
        return model.decode_features(inp, pos, cache)

    @staticmethod
    def draft(model, cache, tokens, s: SlotState, v: Verdict, wv, p, h, us, W: int, c: StepConfig, *,
              drafter: InferenceHead, dcache, **args):
        """The head catches up on this pass (slot n+j gets the target's state after token n+j-1 and token n+j, j =
        0..W-1), then drafts its chain after the decided tokens."""
        n, k, cand, L, D = s.n, v.k, v.cand, c.L, c.D
        dpos = model.cond_len + (n[:, None] + torch.arange(W, device=n.device)).clamp_max(L - 1)
        kk = k[:, None]
        if c.cfg:
            cand, dpos = torch.cat([cand, cand]), torch.cat([dpos, dpos])
        kr = torch.cat([kk, kk]) if c.cfg else kk
        # the head's queries this step sit at most W + D - 1 slots past the target's (catch-up, then the chain);
        # rows parked on the junk slot may read less: their states are never used
        g = catch_up(model, drafter, dcache, h, cand, dpos, kr, cache.length + W + D)  # the state after token n+k
        nxt = n + k + 1
        f, qwin = draft_chain(model, drafter, dcache, g, nxt, us[3], L, c.cfg, n < L, c.sampling)
        return tokens.scatter(1, nxt[:, None] + torch.arange(D, device=n.device), f), qwin

    def __init__(self, model, config: StepConfig, head: InferenceHead, slots: int):
        self.config, self.head = config, head
        self.step_args = {"drafter": head, "dcache": self.head_cache(model, 2 * slots if config.cfg else slots)}

    def head_cache(self, model, rows: int):
        return self.head.new_cache(model, rows)

    def prefill(self, model, cond_in, cache):
        logits, h = model.prefill_features(cond_in, cache)
        return logits[:, None], h[:, None]

    def feed(self, model, x, pos, cache):
        return model.decode_features(x, pos, cache)

    def first_drafts(self, model, tokens, first, p0, uf, feats, refilled):
        """The head catches up on slots 0..P of the refilled rows (the prefill's hidden states and the given and
        first tokens), then drafts; the other rows write to the junk slot."""
        L, P, c = model.seq_len, int(first[0]), self.config
        drafter, dcache = self.step_args["drafter"], self.step_args["dcache"]
        pos = model.cond_len + torch.arange(P + 1, device=tokens.device).expand(tokens.shape[0], -1)
        pos = torch.where(refilled[:, None], pos, model.cond_len + L - 1)
        x = tokens[:, :P + 1]
        if c.cfg:
            x, pos = torch.cat([x, x]), torch.cat([pos, pos])
        if dcache is not None:
            dcache.limit(None)
        g = drafter(model, feats, x, pos, dcache)[:, -1:]
        return self.drafts(model, g, first + 1, uf, refilled)

    def drafts(self, model, g, nxt, uf, refilled):
        return draft_chain(model, self.head, self.step_args["dcache"], g, nxt, uf, model.seq_len, self.config.cfg,
                           refilled, self.config.sampling)


class HeadTree(HeadChain):
    """The draft head's static tree (:mod:`vgen.kernels.tree`): the target verifies every node in one pass, with
    scratch slots past the sequence in both caches."""
    step_fn = staticmethod(tree_step)

    @staticmethod
    def depths(W: int, device, *, tree: StaticTree, **args) -> torch.Tensor:
        return tree.depth  # the root (the last decided token), then every node at its depth

    @staticmethod
    def forward(model, inp, pos, cache, c: StepConfig, *, tree: StaticTree, **args):
        return tree_forward(model, inp, pos, cache, c, tree, features=True)

    @staticmethod
    def decide(p, s: SlotState, wv, us, W: int, c: StepConfig, rule, *, tree: StaticTree, **args) -> Verdict:
        """The whole tree, token by token with ``rule`` (:func:`vgen.kernels.tree.tree_verify`): the accepted path,
        then the token drawn after it."""
        n, N = s.n, tree.size
        ua, ur = us[0], us[1]
        x = s.tokens.gather(1, n[:, None] + torch.arange(N, device=n.device))
        inside = (n - 1)[:, None] + tree.depth[None, 1:] < c.L
        path, k, tok = tree_verify(tree, p, s.qwin[:, :N], x, inside, ua[:, :N], ur[:, 0], rule)
        ar = torch.arange(tree.depth_max + 1, device=n.device)
        pnodes = torch.cat([torch.zeros_like(k[:, None]), path], 1)  # the node before each decided position
        ptok = torch.cat([x.gather(1, (path - 1).clamp_min(0)), torch.zeros_like(k[:, None])], 1)
        return Verdict(k, torch.where(ar < k[:, None], ptok, tok[:, None]), pnodes, (path,))

    @staticmethod
    def draft(model, cache, tokens, s: SlotState, v: Verdict, wv, p, h, us, W: int, c: StepConfig, *,
              drafter: InferenceHead, dcache, tree: StaticTree, children: str = "sample", **args):
        """The accepted path's keys and values move to their real slots, the head catches up on the path (slot n+j
        gets the target's state after the node at depth j and token n+j), then drafts the next tree."""
        n, k, cand, pnodes, (path,) = s.n, v.k, v.cand, v.rows, v.memo
        L, dev = c.L, n.device
        ar = torch.arange(tree.depth_max + 1, device=dev)
        keep_path(model, cache, n, path, c, tree)
        dpos = model.cond_len + (n[:, None] + ar).clamp_max(L - 1)
        if c.cfg:
            pnodes, cand, dpos = torch.cat([pnodes, pnodes]), torch.cat([cand, cand]), torch.cat([dpos, dpos])
        kr = torch.cat([k, k]) if c.cfg else k
        g = catch_up(model, drafter, dcache, gather_rows(h, pnodes), cand, dpos, kr[:, None])
        nxt = n + k + 1
        f, qn = draft_tree(model, drafter, dcache, tree, g, nxt, us[3], L, c.cfg, c.sampling, children)
        return tokens.scatter(1, nxt[:, None] + torch.arange(tree.size, device=dev), f), qn

    @staticmethod
    def span(wv, *, tree: StaticTree, **args):
        return torch.full_like(wv, tree.depth_max + 1)

    def __init__(self, model, config: StepConfig, head: InferenceHead, slots: int, tree: StaticTree, children: str):
        self.tree, self.children = tree, children
        super().__init__(model, config, head, slots)
        self.step_args.update(tree=tree, children=children)

    def head_cache(self, model, rows: int):
        return self.head.new_cache(model, rows, extra=self.tree.size)

    def new_cache(self, model, rows: int):
        return model.new_cache(rows, max_len=model.cond_len + model.seq_len + self.tree.size)  # + scratch slots

    def drafts(self, model, g, nxt, uf, refilled):  # rows not refilled draft into their own scratch slots
        return draft_tree(model, self.head, self.step_args["dcache"], self.tree, g, nxt, uf, model.seq_len,
                          self.config.cfg, self.config.sampling, self.children)
