"""Vectorised speculative verification: everything one Jacobi-window step needs after the forward pass,
for a whole batch at once (each sample at its own position), with no Python loop over tokens or samples.

Shapes: B samples, a window of W positions (the last accepted token plus W-1 drafts), vocabulary V.
"""
from __future__ import annotations

import torch

from vgen.kernels.sampling import filter_probs, guide, sample_from_probs


def guided_logits(logits: torch.Tensor, token_index: torch.Tensor, cfg: bool, cfg_scale: float,
                  cfg_interval: int) -> torch.Tensor:
    """Logits (rows, W, V), rows = [cond; uncond] under CFG, -> (B, W, V) after guidance; ``token_index`` (B, W) is
    the image-token index each position predicts (guidance applies to token t when cfg_interval < 0 or
    t <= cfg_interval + 1)."""
    if not cfg:
        return logits
    guided = guide(logits, cfg_scale)
    if cfg_interval >= 0:
        cond = logits[: logits.shape[0] // 2]
        guided = torch.where((token_index <= cfg_interval + 1)[..., None], guided, cond)
    return guided


def window_target(logits: torch.Tensor, token_index: torch.Tensor, cfg: bool, cfg_scale: float, cfg_interval: int,
                  temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The target distribution at every window position, exactly as the AR sampler builds it: guidance
    (:func:`guided_logits`), then temperature, top-k and top-p."""
    return filter_probs(guided_logits(logits, token_index, cfg, cfg_scale, cfg_interval), temperature, top_k, top_p)


def leading_accepts(u: torch.Tensor, accept_prob: torch.Tensor) -> torch.Tensor:
    """Per row, how many drafts pass before the first rejection: (B, W-1) -> (B,)."""
    return (u < accept_prob).to(torch.int64).cumprod(1).sum(1)


def correction(p: torch.Tensor, q: torch.Tensor, k: torch.Tensor, u: torch.Tensor,
               scale: torch.Tensor | None = None) -> torch.Tensor:
    """The token decided at window offset ``k`` (B,): drawn from norm(max(0, p_k - q_k)) after a rejection;
    when every draft passed, q_k is all zero and this is the bonus token drawn from p_k.

    p (B, W, V) target; q (B, W-1, V) draft distributions; u (B,) uniforms; ``scale`` (B,): block verification's
    weight of p_k (:func:`block_accepts`; None: 1, token-by-token verification's residual)."""
    B, W, V = p.shape
    q = torch.cat([q, q.new_zeros(B, 1, V)], dim=1)
    at = k[:, None, None].expand(B, 1, V)
    pk, qk = p.gather(1, at).squeeze(1), q.gather(1, at).squeeze(1)
    return residual_draw(pk if scale is None else scale[:, None] * pk, qk, u)


def block_accepts(p: torch.Tensor, q: torch.Tensor, px: torch.Tensor, qx: torch.Tensor, valid: torch.Tensor,
                  u: torch.Tensor, weights: bool = False):
    """Block verification (Sun et al., ICLR 2025): the drafts of a chain, each drawn from the draft model given the
    ones before it, checked jointly. Never fewer tokens per pass in expectation than token-by-token checking (it is
    the optimum among rules that see only the chain's own probabilities) and exact: with the residual of
    :func:`correction` at ``scale``, every emitted token has the target's distribution.

    With r_i = p(x_i) / q(x_i) for the i-th draft (0 where it is not ``valid``), the chain's weight is w_0 = 1,
    w_i = min(1, w_(i-1) r_i): a draft the target likes less than the drafter can be carried by later ones it likes
    more. Prefix i is kept with probability h_i = s_i / (s_i + 1 - w_i), s_i = sum_x max(0, w_i p_i(x) - q_i(x))
    (p_i, q_i: the distributions after prefix i; q_i = 0 past the checked drafts, where h_i = w_i), and the pass
    keeps the longest prefix i whose uniform u_i < h_i (0 drafts if none); the token after it is drawn from
    norm(max(0, w_i p_i - q_i)).

    p (B, W, V) targets, q (B, W-1, V) draft distributions (zero where the draft is not checked), px / qx / valid /
    u (B, W-1). Returns (drafts accepted k (B,), w_k (B,): the residual's scale); ``weights=True`` adds (w, h) (B,
    W-1) for tests."""
    r = torch.where(valid, px / qx.clamp_min(1e-30), 0.0)
    # w_i = min(1, w_(i-1) r_i), w_0 = 1: in logs, the cumulative sum less its running maximum (and 0): exactly 1
    # where the cap binds
    s = r.log().cumsum(1)
    top = s.cummax(1).values.clamp_min(0.0)
    w = torch.where(s >= top, 1.0, (s - top).exp())
    qn = torch.cat([q[:, 1:], q.new_zeros(q.shape[0], 1, q.shape[-1])], 1)  # q after prefix i = 1..W-1
    mass = (w[..., None] * p[:, 1:] - qn).clamp_min(0.0).sum(-1)
    h = torch.where(w >= 1.0, 1.0, mass / (mass + 1.0 - w).clamp_min(1e-30))
    i = torch.arange(1, r.shape[1] + 1, device=r.device)
    k = torch.where(u < h, i, 0).amax(1)
    scale = torch.cat([w.new_ones(w.shape[0], 1), w], 1).gather(1, k[:, None]).squeeze(1)
    return (k, scale, w, h) if weights else (k, scale)


def residual_draw(p: torch.Tensor, q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """A draw from norm(max(0, p - q)) (from p where p == q to rounding: nothing to correct); p, q (..., V), u (...)."""
    r = (p - q).clamp_min(0)
    r = torch.where(r.sum(-1, keepdim=True) > 0, r, p)
    return sample_from_probs(r, u)


def maximal_coupling(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u_keep: torch.Tensor,
                     u_draw: torch.Tensor) -> torch.Tensor:
    """Redraw drafts x ~ q as draws from p, coupled to x: keep x with probability min(1, p(x) / q(x)), otherwise
    draw from norm(max(0, p - q)). The result has law p exactly (a maximal coupling of q and p), and keeps x as
    often as any coupling can. p, q (B, M, V); x, u_keep, u_draw (B, M)."""
    px = p.gather(-1, x[..., None]).squeeze(-1)
    qx = q.gather(-1, x[..., None]).squeeze(-1)
    keep = u_keep < (px / qx.clamp_min(1e-30)).clamp_max(1.0)
    return torch.where(keep, x, residual_draw(p, q, u_draw))


def gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (B, N, V), idx (B, M) -> (B, M, V)."""
    return x.gather(1, idx[..., None].expand(*idx.shape, x.shape[-1]))


def verify(p, qwin, x, inside, mine, ua, ur, rule):
    """The verification every speculative rule shares, vectorised over the batch: target distributions p
    (B, W, V) at a window's positions, drafts x (B, W-1) with their draft distributions qwin (B, >= W-1, V),
    ``inside`` (B, W-1): the draft's position is in the image, ``mine`` (B, W-1): the sample checks this draft (its
    own width; None: every one), uniforms ua (B, >= W-1) and ur (B,). ``rule(p, q, x, px, qx) -> a`` gives each
    draft an acceptance probability (forced to 0 where p(x) = 0 or outside); drafts pass left to right until the
    first rejection, whose token is drawn from norm(max(0, p - q)) (a bonus token from p when every checked draft
    passed). A rule with ``block`` set asks for block verification instead (:func:`block_accepts`; drafts drawn as
    a chain, each given the ones before it, as a draft head's are). Returns (drafts accepted k (B,), the token
    decided at offset k (B,))."""
    W = p.shape[1]
    q = qwin[:, :W - 1]
    if mine is not None:
        q = torch.where(mine[..., None], q, 0.0)  # zero past them: the token there is a bonus from p
        inside = inside & mine
    if W == 1:  # a plain AR step: no drafts to check
        k = torch.zeros(p.shape[0], dtype=torch.long, device=p.device)
        return k, correction(p, q, k, ur)
    pd = p[:, :-1]
    px = pd.gather(-1, x[..., None]).squeeze(-1)
    qx = q.gather(-1, x[..., None]).squeeze(-1)
    if rule.block:
        # a draft past the image (or the sample's width) ends the block: h = w at the one before it. Only where a
        # draft sits decides that, never which token it is (a draft-dependent end would bias the rule)
        q = torch.where(inside[..., None], q, 0.0)
        k, scale = block_accepts(p, q, px, qx, inside, ua[:, :W - 1])
        return k, correction(p, q, k, ur, scale)
    a = rule(pd, q, x, px, qx)
    a = torch.where((px > 0) & inside, a, 0.0)
    k = leading_accepts(ua[:, :W - 1], a)  # drafts accepted (B,)
    return k, correction(p, q, k, ur)
