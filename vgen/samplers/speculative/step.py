"""The one step every speculative pass runs, whatever proposes its drafts: feed each slot's last decided token and its
drafts, read the target, verify with the run's rule, write the decided tokens, their log-probabilities and the pass
that decided them, draft anew, advance (:func:`speculative_step`).

A draft source fills in the parts that are its own (:class:`PassHooks`): which positions a pass feeds (a chain's
window, a tree's depths), how the target is read (logits alone, hidden states too, a tree's attention mask), how the
fed drafts are decided (the rule over a chain, Jacobi's redraws after a rejection, a tree's paths) and what it
proposes next. The hooks are static methods, so a source's step function (``step_fn``) is a two-line module-level
function, compiled once per source and shared by every run.

The step's state lives in place (gpt-fast's way): :class:`SlotState` holds every tensor a pass reads and writes (the
tokens and drafts, their distributions, log-probabilities, step map, counts, each slot's uniforms), the pass counter
is a device scalar it advances, and the step writes its results over them and returns nothing. On a static device
(CUDA) every one of them is a static address, so a compiled step is one recorded CUDA graph whose inputs are never
copied in and whose outputs are never cloned out: the host launches it and reads the counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from vgen.kernels.sampling import sample_from_probs
from vgen.kernels.verify import verify, window_target


@dataclass(frozen=True)
class StepConfig:
    """What every pass of one run needs besides its state: the sequence, the drafts kept and the target's
    distribution (guidance, temperature, filtering), exactly as the AR sampler builds it."""
    L: int                    # tokens per sample
    D: int                    # drafts kept per slot: the widest pass's width - 1
    grid: tuple[int, ...]     # the model's token grid ((h, w) or (t, h, w))
    cfg: bool                 # rows [cond; uncond]
    cfg_scale: float
    cfg_interval: int
    temperature: float
    top_k: int
    top_p: float
    extra: int = 0            # uniforms per pass a source needs beyond the shared layout (:meth:`uniforms`)

    @property
    def uniform_width(self) -> int:
        """Uniforms per sample and pass: 3D + 2, plus the source's ``extra``."""
        return 3 * self.D + 2 + self.extra

    @property
    def sampling(self) -> dict:
        return dict(cfg_scale=self.cfg_scale, cfg_interval=self.cfg_interval, temperature=self.temperature,
                    top_k=self.top_k, top_p=self.top_p)

    def target(self, logits: torch.Tensor, token_index: torch.Tensor) -> torch.Tensor:
        """Logits (rows, W, V) -> the target distribution (B, W, V) of image tokens ``token_index`` (B, W)."""
        return window_target(logits, token_index, self.cfg, **self.sampling)

    def uniforms(self, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A pass's uniforms (B, :attr:`uniform_width`) -> (acceptance (B, D), residual (B, 1), a draw at every fed
        position (B, D + 1: Jacobi's redraws), new drafts (B, D), the source's extra ones (B, extra)). Every source
        gets this one layout and reads the parts it uses."""
        D = self.D
        return u.split([D, 1, D + 1, D, self.extra], dim=1)


def buffer_length(L: int, D: int) -> int:
    """Tokens held per slot for a sequence of L and D drafts per pass: drafts may run past the end of the image, and a
    pass after a slot's window writes its next drafts after that."""
    return L + 2 * (D + 1)


class SlotState(NamedTuple):
    """The slots' state on the device: what the step reads and updates in place (on a static device, every tensor
    is a static address: the step runs as one recorded CUDA graph, with nothing copied in or out)."""
    tokens: torch.Tensor   # (S, buffer) long: decided tokens, then drafts
    n: torch.Tensor        # (S,) long: tokens decided (L: finished or empty)
    qwin: torch.Tensor     # (S, D, V): the drafts' distributions
    logp: torch.Tensor     # (S, buffer): log-probability of each decided token under the target
    smap: torch.Tensor     # (S, buffer) long: the pass that decided each token
    counts: torch.Tensor   # (S, 3) long: passes, drafts checked, drafts accepted
    u: torch.Tensor        # (S, L, uniform_width): each slot's sample's uniforms, one row per pass of that sample
    start: torch.Tensor    # (S,) long: the pass at which each slot's sample was prefilled (its rows of u count from it)

    @classmethod
    def empty(cls, slots: int, c: StepConfig, vocab_size: int, device, n: torch.Tensor | None = None,
              owner=None) -> SlotState:
        """A state of ``slots`` slots for a run of ``c`` (n: L, finished, unless given), buffers
        :func:`buffer_length` long. On a static device every tensor is a static address, pooled for ``owner``'s
        lifetime (:func:`vgen.kernels.kv_cache.static_buffer`: the next run replays the recorded graphs)."""
        from vgen.kernels.kv_cache import static, static_buffer
        B, L, D = buffer_length(c.L, c.D), c.L, c.D
        shapes = {"tokens": ((slots, B), torch.long), "n": ((slots,), torch.long),
                  "qwin": ((slots, D, vocab_size), torch.float32), "logp": ((slots, B), torch.float32),
                  "smap": ((slots, B), torch.long), "counts": ((slots, 3), torch.long),
                  "u": ((slots, L, c.uniform_width), torch.float32), "start": ((slots,), torch.long)}
        if owner is None:
            st = cls(*(static(torch.zeros(shape, dtype=dt, device=device)) for shape, dt in shapes.values()))
        else:
            st = cls(*(static_buffer(owner, f"slot_state.{k}", shape, dt, device) for k, (shape, dt) in shapes.items()))
        if n is None:
            st.n.fill_(L)
        else:
            st.n.copy_(n)
        return st

    def store(self, tokens, n, qwin, logp, smap, counts) -> None:
        """A pass's results written over this state, in place (the step's only outputs; eager, the copies cost about
        2% of a pass on photos-gpt)."""
        for dst, src in zip(self, (tokens, n, qwin, logp, smap, counts)):
            if dst is not src:
                dst.copy_(src)


class Verdict(NamedTuple):
    """What a pass decided for every slot."""
    k: torch.Tensor                # (B,) drafts accepted
    cand: torch.Tensor             # (B, T): tokens n .. n + k decided (the accepted drafts, then one drawn); past k
    #                                written now and rewritten when decided
    rows: torch.Tensor | None      # (B, T): the row of the target each decided token was read at (None: row j)
    memo: tuple = ()               # what the source's ``draft`` reads (a tree's path, ...)


class PassHooks(Protocol):
    """A draft source's parts of :func:`speculative_step` (static methods; ``**args`` are the source's
    ``step_args``)."""

    @staticmethod
    def depths(W: int, device, **args) -> torch.Tensor:
        """(W,) how far past the last decided token each fed token sits (a chain: 0, 1, ...; a tree: its depths)."""

    @staticmethod
    def forward(model, inp: torch.Tensor, pos: torch.Tensor, cache, c: StepConfig,
                **args) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target's pass over the fed tokens: (logits (rows, W, V), hidden states or None)."""

    @staticmethod
    def decide(p: torch.Tensor, s: SlotState, wv: torch.Tensor, us: tuple, W: int, c: StepConfig, rule,
               **args) -> Verdict:
        """Verify the fed drafts against the target ``p`` (B, W, V) with ``rule``; ``us``: the pass's uniforms
        (:meth:`StepConfig.uniforms`)."""

    @staticmethod
    def draft(model, cache, tokens: torch.Tensor, s: SlotState, v: Verdict, wv: torch.Tensor, p: torch.Tensor,
              h: torch.Tensor | None, us: tuple, W: int, c: StepConfig, **args) -> tuple[torch.Tensor, torch.Tensor]:
        """The next drafts written into ``tokens`` (the decided ones already there) and their distributions:
        (tokens, qwin (B, D, V))."""

    @staticmethod
    def span(wv: torch.Tensor, **args) -> torch.Tensor:
        """(B,) the widest pass each slot ran: the drafts it checked are at most this minus one."""


def speculative_step(hooks: type[PassHooks], model, cache, s: SlotState, wv, it, W: int, c: StepConfig, rule,
                     **args) -> None:
    """One forward pass of width W for every slot: target pass -> verify -> write tokens, log-probabilities and step
    map -> next drafts -> advance, all written over ``s`` in place (nothing is returned: a compiled step's tensors
    are its inputs, read and updated where they lie). ``hooks``: the source's :class:`PassHooks`; ``wv`` (B,): each
    slot's own width (<= W); ``it``: the pass counter (a 0-d tensor, advanced here); ``args``: the source's
    ``step_args``. Each slot reads its own sample's uniforms for this pass from ``s.u``."""
    it.add_(1)
    tokens, n = s.tokens, s.n
    u = s.u[torch.arange(n.shape[0], device=n.device), (it - s.start).clamp(0, c.L - 1)]
    depth = hooks.depths(W, n.device, **args)
    inp = tokens.gather(1, (n - 1)[:, None] + torch.arange(depth.shape[0], device=n.device))  # the last decided, drafts
    tpos = (n - 1)[:, None] + depth  # each fed token's index in the sequence
    pos = model.cond_len + tpos.clamp_max(c.L - 1)  # past the end: junk rows, parked on a slot no real query reads
    if c.cfg:
        inp, pos = torch.cat([inp, inp]), torch.cat([pos, pos])
    logits, h = hooks.forward(model, inp, pos, cache, c, **args)
    p = c.target(logits, tpos + 1)  # (B, W, V): the target after each fed token
    us = c.uniforms(u)
    v = hooks.decide(p, s, wv, us, W, c, rule, **args)
    read = (p.gather(-1, v.cand[..., None]).squeeze(-1) if v.rows is None
            else p.flatten(1).gather(1, v.rows * p.shape[-1] + v.cand))
    lp = read.clamp_min(1e-30).log()
    widx = n[:, None] + torch.arange(v.cand.shape[1], device=n.device)
    tokens = tokens.scatter(1, widx, v.cand)
    logp = s.logp.scatter(1, widx, lp)  # positions past n + k are rewritten when they are decided
    smap = s.smap.scatter(1, widx, it.expand_as(widx))
    tokens, qwin = hooks.draft(model, cache, tokens, s, v, wv, p, h, us, W, c, **args)
    n, counts = advance(n, v.k, hooks.span(wv, **args), c.L, s.counts)
    s.store(tokens, n, qwin, logp, smap, counts)


def advance(n, k, wv, L: int, counts):
    """After a pass that accepted k drafts per sample: the new decided counts (k + 1 tokens, never past L, none for
    finished samples) and the running (passes, drafts checked, drafts accepted) per sample."""
    left = L - n  # n never passes L: a finished (or empty) slot has none left, so it emits, checks, accepts nothing
    emitted = torch.minimum(k + 1, left)
    checked = torch.minimum(emitted, wv - 1)
    accepted = torch.minimum(k, left)
    return n + emitted, counts + torch.stack([(left > 0).long(), checked, accepted], 1)


def tree_forward(model, inp, pos, cache, c: StepConfig, tree, features: bool):
    """A static tree's pass (:mod:`vgen.kernels.tree`): every node reads the decided prefix and its own ancestors
    (tree mask) and is written to a scratch slot past the sequence. (logits, hidden states if ``features`` else
    None)."""
    nodes = torch.arange(1, tree.size + 1, device=pos.device)
    slot = torch.cat([pos[:, :1], (model.cond_len + c.L + nodes - 1)[None].expand(pos.shape[0], -1)], 1)
    cache.limit(None)
    cache.write_at(slot)
    mask = tree.target_mask(pos[:, 0], cache.slots)
    out = model.decode_features(inp, pos, cache, attn_mask=mask) if features else (
        model.decode(inp, pos, cache, attn_mask=mask), None)
    cache.write_at(None)
    return out


def keep_path(model, cache, n: torch.Tensor, path: torch.Tensor, c: StepConfig, tree) -> None:
    """After a tree pass: the accepted path's keys and values move from their scratch slots to their real ones (the
    node at depth d to the slot of position n - 1 + d)."""
    base = model.cond_len + c.L
    src = torch.where(path > 0, base + path - 1, base - 1)
    dst = model.cond_len + (n[:, None] + torch.arange(tree.depth_max, device=n.device)).clamp_max(c.L - 1)
    if c.cfg:
        src, dst = torch.cat([src, src]), torch.cat([dst, dst])
    cache.move(src, dst)


class Chain:
    """A draft source whose drafts form a chain (each pass: the last decided token and W - 1 drafts, verified in
    order by the run's rule), with the model's own cache, prefill and first token. A chain source subclasses it and
    writes its ``step_fn`` (``speculative_step`` with itself as the hooks), :meth:`draft` and :meth:`first_drafts`
    (:class:`~vgen.samplers.speculative.scheduler.DraftSource`); it overrides the other parts where it differs."""
    step_args: dict = {}

    @staticmethod
    def depths(W: int, device, **args) -> torch.Tensor:
        return torch.arange(W, device=device)

    @staticmethod
    def forward(model, inp, pos, cache, c: StepConfig, **args):
        return model.decode(inp, pos, cache), None

    @staticmethod
    def decide(p, s: SlotState, wv, us, W: int, c: StepConfig, rule, **args) -> Verdict:
        """Every slot checks all W - 1 drafts (one width for the whole run, so wv == W): the accepted ones, then the
        token drawn at the first rejection (from the rule's residual) or after the last draft."""
        n = s.n
        ua, ur = us[0], us[1]
        didx = n[:, None] + torch.arange(W - 1, device=n.device)
        x = s.tokens.gather(1, didx)
        k, tok_k = verify(p, s.qwin, x, didx < c.L, None, ua, ur[:, 0], rule)
        tk = tok_k[:, None]
        return Verdict(k, torch.cat([x, tk], 1).scatter_(1, k[:, None], tk), None)  # past k: never read

    @staticmethod
    def span(wv, **args):
        return wv

    def new_cache(self, model, rows: int):
        return model.new_cache(rows)

    def prefill(self, model, cond_in, cache):
        return model.prefill(cond_in, cache)[:, None], None

    def feed(self, model, x, pos, cache):
        return model.decode(x, pos, cache), None

    def fill(self, slot: int, seed: int) -> None:
        pass

    def first_token(self, p0, u, index: int):
        return sample_from_probs(p0, u)
