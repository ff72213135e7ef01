"""The model drafts for itself: Jacobi iteration (SJD's drafts), the draft source of ``sjd``, ``gsd``, ``lantern``
and ``scd``.

Each pass feeds, for every sample, its last decided token and ``window - 1`` drafts. Positions after the first
rejection keep a fresh Jacobi sample from the target p there as their next draft, with p as its draft distribution;
new positions at the end of the window get drafts from ``init``. ``coupling`` says how the drafts after a rejection
are redrawn: independent draws from p, ``maximal`` (each old draft kept where the target still allows it, SCD-MC),
or ``gumbel`` (every draw at a position is Gumbel-max with noise fixed per position; a draft passes when it equals
the target's own draw, so no acceptance rule is used; :mod:`vgen.samplers.scd`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec
from vgen.kernels.gumbel import gumbel_draw, gumbel_keys
from vgen.kernels.kv_cache import static_buffer
from vgen.kernels.sampling import sample_from_probs
from vgen.kernels.verify import gather_rows, maximal_coupling, verify
from vgen.samplers.base import Options, option
from vgen.samplers.speculative.step import Chain, SlotState, StepConfig, Verdict, buffer_length, speculative_step
from vgen.samplers.speculative.widths import parse_costs

INITS = ("random", "horizontal", "vertical", "sample", "temporal")
FRESH_Q = ("proposal", "onehot")
COUPLINGS = ("independent", "maximal", "gumbel")


@dataclass
class JacobiOptions(Options):
    """The Jacobi draft source's options. ``fresh_q=proposal`` verifies drafts against what they were really drawn
    from (uniform for random, the sampled distribution for sample; copies are deterministic, so one-hot);
    ``onehot`` is the official SJD code's choice. Both are lossless; the proposal accepts more."""
    costs: str = option("", "window=auto: one sample's relative pass costs per width, e.g. '1:1,2:1.3,4:1.8': "
                        "widths chosen per sample and pass from them (never dependent on the batch size or the "
                        "machine); empty: the timed rule")
    init: str = option("random", "drafts for new positions: random (uniform), horizontal (copy the left token), "
                       "vertical (copy the token above; left in the first row), sample (draw from the target), "
                       "temporal (video: copy the token at the same place in the previous frame; vertical in the "
                       "first frame)", choices=INITS)
    fresh_q: str = option("proposal", "draft distribution used to verify new drafts: proposal | onehot",
                          choices=FRESH_Q)
    coupling: str = option("independent", "how drafts after a rejection are redrawn: independent (a fresh draw "
                           "from the target), maximal (each old draft kept where the target still allows it, SCD-MC) "
                           "or gumbel (scd only: every draw at a position shares that position's Gumbel noise)",
                           choices=COUPLINGS)
    couplings = ("independent", "maximal")  # class attribute (not a field): the couplings this sampler's rule takes

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.costs:
            parse_costs(self.costs)
        if self.coupling not in self.couplings:
            raise VGenError(f"coupling={self.coupling} does not fit this sampler (it takes "
                            f"{' or '.join(self.couplings)}): Gumbel coupling accepts a draft only when it equals the "
                            "target's own draw, which is sampler=scd")
        check_init(self.init, spec)


def check_init(init: str, spec: ModelSpec | None) -> None:
    """``init=temporal`` needs a video model (a one-line error before any weights load)."""
    if init == "temporal" and spec is not None and spec.token_shape is not None and not spec.is_video:
        raise VGenError(f"init=temporal copies drafts from the previous frame, but {spec.name} makes images "
                        f"(token grid {spec.token_shape}): use init=vertical")


def copy_source(last: torch.Tensor, off: torch.Tensor, stride: int) -> torch.Tensor:
    """Raster index ``stride`` positions before each new position ``last + off`` -- or, for the positions after
    ``last`` whose source is itself new, the nearest multiple of ``stride`` back that is already placed. (B, D)."""
    t = last[:, None] + off
    return t - ((off + stride - 1) // stride) * stride


def fresh_drafts(tokens: torch.Tensor, last: torch.Tensor, p_last: torch.Tensor, u: torch.Tensor, *, init: str,
                 fresh_q: str, grid: tuple[int, ...], with_q: bool = True):
    """Drafts for the D = u.shape[1] positions after ``last`` (B,), and their draft distributions (B, D, V)
    (None with ``with_q=False``: a rule that checks drafts by equality needs none).

    ``tokens`` holds the current token (accepted or draft) at every position up to ``last``; ``p_last`` (B, V) is
    the target distribution at ``last``; ``grid`` is the model's token grid ((h, w) or (t, h, w))."""
    B, D = u.shape
    V = p_last.shape[-1]
    off = torch.arange(1, D + 1, device=u.device)
    if init == "random":
        f = (u * V).long().clamp_max(V - 1)
        if fresh_q == "proposal":
            return f, p_last.new_full((B, D, V), 1.0 / V) if with_q else None
    elif init == "sample":
        dist = p_last[:, None].expand(B, D, V)
        f = sample_from_probs(dist, u)
        if fresh_q == "proposal":
            return f, dist
    else:
        left = last[:, None].expand(B, D)
        if init == "horizontal":
            src = left
        else:  # vertical: the nearest token straight above that is already placed
            src = copy_source(last, off, grid[-1])
            src = torch.where(src >= 0, src, left)  # first row: nothing above, copy the left neighbour
            if init == "temporal":  # the same (h, w) in the nearest earlier frame; vertical in the first frame
                back = copy_source(last, off, grid[-1] * grid[-2] if len(grid) > 2 else grid[-1])
                src = torch.where(back >= 0, back, src)
        f = tokens.gather(1, src)
    return f, F.one_hot(f, V).to(p_last.dtype) if with_q else None


def jacobi_step(model, cache, s: SlotState, wv, it, W: int, c: StepConfig, rule, **args) -> None:
    """One pass of the Jacobi source (:func:`~vgen.samplers.speculative.step.speculative_step` with
    :class:`JacobiDrafts`' hooks)."""
    speculative_step(JacobiDrafts, model, cache, s, wv, it, W, c, rule, **args)


class JacobiDrafts(Chain):
    """The Jacobi draft source (:class:`vgen.samplers.speculative.scheduler.DraftSource`) for one run of ``slots`` slots."""
    step_fn = staticmethod(jacobi_step)

    # the pass (:class:`~vgen.samplers.speculative.step.PassHooks`); step_args: init, fresh_q, coupling, gkeys (B,
    # buffer length: every position's Gumbel key per slot, coupling=gumbel, :func:`vgen.kernels.gumbel.gumbel_keys`)
    @staticmethod
    def decide(p, s: SlotState, wv, us, W: int, c: StepConfig, rule, *, coupling: str = "independent",
               gkeys: torch.Tensor | None = None, **args) -> Verdict:
        """Each slot checks its first wv - 1 drafts; after the first rejection come the Jacobi redraws from p (or,
        ``maximal``, each old draft kept where p still allows it), which are the next pass's drafts there.
        ``gumbel``: drafts pass while they equal the target's own draw (no rule)."""
        tokens, n, qwin = s.tokens, s.n, s.qwin
        L = c.L
        ua, ur, uj = us[0], us[1], us[2]
        ar = torch.arange(W, device=n.device)
        didx = n[:, None] + ar[:-1]
        x = tokens.gather(1, didx)
        mine = ar[:-1] < (wv - 1)[:, None]  # the drafts each sample checks
        if coupling == "gumbel":  # the target's own draw at every position; drafts pass while they equal it
            t = gumbel_draw(p, gkeys.gather(1, n[:, None] + ar))
            k = (((x == t[:, :-1]) & (didx < L) & mine).long().cumprod(1).sum(1) if W > 1 else torch.zeros_like(n))
            return Verdict(k, t, None)  # accepted drafts (equal to t), t at the mismatch, then coupled Jacobi drafts
        k, tok_k = verify(p, qwin, x, didx < L, mine, ua, ur[:, 0], rule)
        kk = k[:, None]
        if W == 1:
            return Verdict(k, tok_k[:, None], None)
        y = sample_from_probs(p, uj[:, :W])  # Jacobi update at every position: next drafts after the rejection
        if coupling == "maximal":  # keep each old draft where p still allows it (ua past k is unused above)
            y = torch.cat([maximal_coupling(p[:, :-1], qwin[:, :W - 1], x, ua[:, :W - 1], uj[:, :W - 1]),
                           y[:, -1:]], 1)
        cand = torch.where(ar < kk, torch.cat([x, tok_k[:, None]], 1), torch.where(ar == kk, tok_k[:, None], y))
        return Verdict(k, cand, None)

    @staticmethod
    def draft(model, cache, tokens, s: SlotState, v: Verdict, wv, p, h, us, W: int, c: StepConfig, *, init: str,
              fresh_q: str, coupling: str = "independent", gkeys: torch.Tensor | None = None, **args):
        """New drafts after each slot's window end (over what a wider pass wrote), from ``init``; the Jacobi
        redraws inside the window keep p as their draft distribution."""
        n, D = s.n, c.D
        gumbel = coupling == "gumbel"
        last = n + wv - 1  # each sample's window end
        p_last = p.gather(1, (wv - 1)[:, None, None].expand(-1, 1, p.shape[-1])).squeeze(1)
        dr = torch.arange(D, device=n.device)
        uf = us[3]
        if gumbel and init == "sample":  # drafts drawn with their own positions' noise from the last distribution
            f = gumbel_draw(p_last[:, None].expand(-1, D, -1), gkeys.gather(1, last[:, None] + 1 + dr))
        else:
            f, fq = fresh_drafts(tokens, last, p_last, uf, init=init, fresh_q=fresh_q, grid=c.grid, with_q=not gumbel)
        tokens = tokens.scatter(1, last[:, None] + 1 + dr, f)
        if gumbel:  # Gumbel drafts are checked by equality: no draft distributions to keep
            return tokens, s.qwin
        j = v.k[:, None] + 1 + dr  # offsets of the next drafts: Jacobi ones inside the sample's window, then new ones
        return tokens, gather_rows(torch.cat([p, fq], 1), torch.where(j < wv[:, None], j, j - wv[:, None] + W))


    def __init__(self, model, config: StepConfig, options: JacobiOptions, slots: int):
        self.config, self.init, self.fresh_q, self.coupling = config, options.init, options.fresh_q, options.coupling
        self.gumbel = options.coupling == "gumbel"
        self.step_args = dict(init=self.init, fresh_q=self.fresh_q, coupling=self.coupling)
        if self.gumbel:  # each slot's sample's position keys (refilled with the slot)
            self.step_args["gkeys"] = static_buffer(self, "jacobi.gkeys", (slots, self.buffer), torch.long,
                                             next(model.parameters()).device)

    @property
    def buffer(self) -> int:
        return buffer_length(self.config.L, self.config.D)

    def fill(self, slot: int, seed: int) -> None:
        if self.gumbel:
            keys = self.step_args["gkeys"]
            keys[slot] = gumbel_keys([seed], self.buffer, keys.device)[0]

    def first_token(self, p0, u, index: int):
        if self.gumbel:
            return gumbel_draw(p0, self.step_args["gkeys"][:, index])
        return sample_from_probs(p0, u)

    def first_drafts(self, model, tokens, first, p0, uf, feats, refilled):
        f, q = fresh_drafts(tokens, first, p0, uf, init=self.init, fresh_q=self.fresh_q, grid=self.config.grid)
        if self.gumbel and self.init == "sample":
            D = uf.shape[1]
            P = int(first[0])
            f = gumbel_draw(p0[:, None].expand(-1, D, -1), self.step_args["gkeys"][:, P + 1:P + 1 + D])
        return f, q
