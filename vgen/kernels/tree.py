"""Static draft trees: their shape, the attention masks that verify a whole tree in one forward pass, and the
vectorised multi-candidate verification (the tree counterpart of :func:`vgen.kernels.verify.verify`).

A tree is a list of paths from the root (the last decided token): ``(0,)`` is the root's first child, ``(0, 1)``
that child's second child, and so on (EAGLE's "tree choices" format). Node 0 is the root; nodes 1..N follow the
paths sorted by depth, then by ranks. A node at depth d sits at sequence position ``root + d``; all nodes of one
depth share that position, so in a static KV cache (slot == position) they cannot share a slot: a tree pass writes
node j at scratch slot ``base + j - 1`` (past the sequence) and masks attention so that each node sees the decided
prefix and its own ancestors only. After verification the accepted path's scratch keys and values move to their
real slots (:meth:`vgen.kernels.kv_cache.KVCache.move`); everything else is left to be overwritten.

Verification (exact): the children of a node are candidates c_1..c_m, each drawn independently from its own
proposal q_i (``children=sample``: i.i.d. draws from the head's distribution q, so q_i = q; ``children=top``:
the head's m most likely tokens, fixed given the context, so q_i = one-hot). Candidate i is accepted with the rule's
probability against the residual target r_i, with r_1 = p (the target at the parent) and, after a rejection,
r_{i+1} = norm(max(0, r_i - q_i)); the first accepted child becomes the new parent; when every child is rejected,
the token is drawn from r_{m+1}; at a leaf, a bonus token is drawn from its p. With the exact rule
min(1, r_i(x) / q_i(x)) every decided token has the target's distribution: rejection i leaves exactly r_{i+1}
(SpecInfer's multi-round speculative sampling; with one child per node this is standard speculative sampling).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from vgen.errors import VGenError
from vgen.kernels.sampling import sample_from_probs

# EAGLE's static tree "mc_sim_7b_63" (25 nodes, depth 5): the default ``tree_choices`` of the LANTERN /
# LANTERN++ code.
LANTERN_PP = ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
              (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
              (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1))
PRESETS = {"lantern++": LANTERN_PP}


def parse_tree(spec: str) -> tuple[tuple[int, ...], ...]:
    """A tree option -> its paths. ``lantern++``: the preset; ``3,2,1`` (or ``3-2-1``, where commas separate
    options): branching per depth (every node at depth d-1 has b_d children: 3 + 6 + 6 nodes); ``0|1|0.0|0.0.0``:
    explicit paths (ranks joined by dots)."""
    s = spec.strip().lower()
    if s in PRESETS:
        return PRESETS[s]
    try:
        if "|" in s or "." in s:
            paths = tuple(tuple(int(r) for r in item.split(".")) for item in s.split("|") if item.strip())
        else:
            branching = [int(b) for b in s.replace("-", ",").split(",") if b.strip()]
            if not branching or any(b < 1 for b in branching):
                raise ValueError
            level, paths = [()], []
            for b in branching:
                level = [p + (r,) for p in level for r in range(b)]
                paths += level
            paths = tuple(paths)
    except ValueError:
        paths = ()
    if not paths:
        raise VGenError(f"tree must be a preset ({', '.join(PRESETS)}), a branching per depth like '3,2,1' / '3-2-1' or "
                        f"paths like '0|1|0.0', got {spec!r}")
    known = set(paths)
    for p in paths:
        if p[:-1] and p[:-1] not in known or any(p[:-1] + (r,) not in known for r in range(p[-1])) or min(p) < 0:
            raise VGenError(f"tree path {'.'.join(map(str, p))} needs its parent and its lower-ranked siblings in "
                            f"the tree too (ranks count 0, 1, ... under each node), got {spec!r}")
    if len(known) != len(paths):
        raise VGenError(f"tree {spec!r} lists a path twice")
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


@dataclass
class StaticTree:
    """Index tables of one tree (N nodes plus the root, node 0), on ``device``."""
    paths: tuple[tuple[int, ...], ...]
    parent: torch.Tensor      # (N + 1,) parent node (the root's: 0)
    depth: torch.Tensor       # (N + 1,) 0 for the root
    anc: torch.Tensor         # (N + 1, N + 1) bool: column j is an ancestor of row i or i itself
    earlier: torch.Tensor     # (N, N) float: column j is an earlier sibling of row i (nodes 1..N)
    n_children: torch.Tensor  # (N + 1,)
    last_child: torch.Tensor  # (N + 1,) each node's last child (0 for a leaf)
    max_children: int         # the most children any node has
    by_rank: list             # [(nodes of rank r, their previous siblings (rank r-1) or None)], r = 0..
    levels: list              # per depth d = 1..: (nodes, each one's parent among the inner nodes of depth d-1,
    #                           its rank, the depth's inner nodes (those with children), their places among nodes)

    @property
    def size(self) -> int:
        return len(self.paths)

    @property
    def depth_max(self) -> int:
        return len(self.levels)

    @classmethod
    def build(cls, paths, device=None) -> StaticTree:
        index = {(): 0, **{p: i + 1 for i, p in enumerate(paths)}}
        N = len(paths)
        parent = [0] + [index[p[:-1]] for p in paths]
        depth = [0] + [len(p) for p in paths]
        anc = torch.zeros(N + 1, N + 1, dtype=torch.bool)
        for p, i in index.items():
            for d in range(len(p) + 1):
                anc[i, index[p[:d]]] = True
        earlier = torch.zeros(N, N)
        for p in paths:
            for r in range(p[-1]):
                earlier[index[p] - 1, index[p[:-1] + (r,)] - 1] = 1.0
        kids = [[index[c] for c in paths if c[:-1] == p] for p in [()] + list(paths)]
        by_rank = []
        for r in range(max(p[-1] for p in paths) + 1):
            nodes = [index[p] for p in paths if p[-1] == r]
            prev = None if r == 0 else [index[p[:-1] + (r - 1,)] for p in paths if p[-1] == r]
            by_rank.append((torch.tensor(nodes, device=device),
                            None if prev is None else torch.tensor(prev, device=device)))
        levels, parents = [], [0]
        for d in range(1, max(depth) + 1):
            nodes = [i for i in range(1, N + 1) if depth[i] == d]
            inner = [i for i in nodes if kids[i]]
            levels.append(tuple(torch.tensor(t, dtype=torch.long, device=device) for t in (
                nodes, [parents.index(parent[i]) for i in nodes], [paths[i - 1][-1] for i in nodes], inner,
                [nodes.index(i) for i in inner])))
            parents = inner
        return cls(tuple(paths), torch.tensor(parent, device=device), torch.tensor(depth, device=device),
                   anc.to(device), earlier.to(device), torch.tensor([len(k) for k in kids], device=device),
                   torch.tensor([k[-1] if k else 0 for k in kids], device=device), max(len(k) for k in kids),
                   by_rank, levels)

    def target_mask(self, real: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Attention mask of a tree pass: queries = the root then nodes 1..N, keys = the cache's slots. ``real``
        (rows,) is each row's root slot (keys at slots <= it are the decided prefix); the scratch slots hold the
        nodes. (rows, 1, N + 1, len(slots)) bool, True = attend."""
        N = self.size
        base = slots.shape[0] - N
        prefix = slots[None, :base] <= real[:, None]  # (rows, base)
        rows = real.shape[0]
        return torch.cat([prefix[:, None, None, :].expand(rows, 1, N + 1, base),
                          self.anc[None, None, :, 1:].expand(rows, 1, N + 1, N)], -1)

    def head_mask(self, nodes: torch.Tensor, last: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Attention mask of a draft-head call over ``nodes`` (M,): the head's decided slots (<= ``last``, (rows,))
        and the nodes' ancestors and themselves among the scratch slots. (rows, 1, M, len(slots))."""
        N = self.size
        base = slots.shape[0] - N
        prefix = slots[None, :base] <= last[:, None]
        rows, M = last.shape[0], nodes.shape[0]
        return torch.cat([prefix[:, None, None, :].expand(rows, 1, M, base),
                          self.anc[nodes][None, None, :, 1:].expand(rows, 1, M, N)], -1)


def tree_verify(tree: StaticTree, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, inside: torch.Tensor,
                ua: torch.Tensor, ur: torch.Tensor, rule):
    """Verify a whole tree per sample. p (B, N + 1, V): the target after the root and after every node; q
    (B, N, V): each node's proposal; x (B, N): node tokens; ``inside`` (B, N): the node's position is in the
    image; ua (B, N), ur (B,) uniforms; ``rule(p, q, x, px, qx) -> a`` the acceptance rule (each candidate checked
    against its residual target; token by token, never ``block``). Returns (path (B, depth_max): the accepted node per depth, 0 past the
    end; k (B,): drafts accepted; the token decided after the path (B,))."""
    B, N1, V = p.shape
    # residual target each candidate is checked against: r_1 = p(parent), r_{i+1} = norm(max(0, r_i - q_i))
    r = p.new_empty(B, N1 - 1, V)
    for nodes, prev in tree.by_rank:
        if prev is None:
            r[:, nodes - 1] = p[:, tree.parent[nodes]]
        else:
            r[:, nodes - 1] = _residual(r[:, prev - 1], q[:, prev - 1])
    rx = r.gather(-1, x[..., None]).squeeze(-1)
    qx = q.gather(-1, x[..., None]).squeeze(-1)
    a = rule(r, q, x, rx, qx)
    acc = (ua < a) & (rx > 0) & inside
    first = acc & ~((acc.float() @ tree.earlier.T) > 0)  # accepted, every earlier sibling rejected
    ok = torch.cat([torch.ones_like(first[:, :1]), first], 1)  # the root is always on the path
    on_path = (ok[:, None, :] | ~tree.anc[None]).all(-1)  # (B, N + 1): every ancestor-or-self passed
    k = on_path[:, 1:].sum(1)
    depth_of = tree.depth[None, 1:].expand(B, -1)
    hit = on_path[:, 1:, None] & (depth_of[..., None] == torch.arange(1, tree.depth_max + 1, device=p.device))
    path = (hit * torch.arange(1, N1, device=p.device)[None, :, None]).sum(1)  # (B, depth_max)
    end = torch.cat([torch.zeros_like(k[:, None]), path], 1).gather(1, k[:, None]).squeeze(1)  # deepest node
    # the token after the path: from r_{m+1} of the end node's children (all rejected), or p at a leaf
    leaf = tree.n_children[end] == 0
    idx = (tree.last_child[end] - 1).clamp_min(0)
    at = lambda t, i: t.gather(1, i[:, None, None].expand(B, 1, V)).squeeze(1)  # noqa: E731
    r_end = torch.where(leaf[:, None], at(p, end), _residual(at(r, idx), at(q, idx)))
    return path, k, sample_from_probs(r_end, ur)


def _residual(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, r - q)); r itself where nothing is left (r == q: its candidate was accepted for sure)."""
    d = (r - q).clamp_min(0)
    s = d.sum(-1, keepdim=True)
    return torch.where(s > 0, d / s.clamp_min(1e-30), r)


def static_tree(paths: tuple[tuple[int, ...], ...], device: torch.device) -> StaticTree:
    """:meth:`StaticTree.build`, once per tree and device: every run's compiled step reads the same tables (static
    addresses on CUDA, so the recorded graphs replay). Treat it as read-only."""
    from vgen.kernels.kv_cache import static_all
    return static_all(_built(tuple(paths), torch.device(device)))


@functools.lru_cache(maxsize=32)
def _built(paths, device) -> StaticTree:
    return StaticTree.build(paths, device)
