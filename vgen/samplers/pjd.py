"""PJD (Parallel Jacobi Decoding, Liao et al., CVPR 2026): ZipAR's row fronts, each running a Jacobi window.

Rows start as in ZipAR (:mod:`vgen.samplers.zipar`): row r + 1 starts once row r has ``lag`` tokens decided, and
decides its token c only once row r has c + lag (``lag`` = the grid's width: one row after another; ``follow=false``
drops this second rule: a started row runs at its own pace). Up to ``rows``
rows run in one forward pass. Each running row feeds its newest decided token and ``window - 1`` drafts after it,
and checks them left to right with speculative sampling's rule against the target this pass computes there (a =
min(1, p(x) / q(x)); at the first rejection a token from norm(max(0, p - q)); after the last checked draft a bonus
token from p): within a row, SJD's step on vgen's verification core (:func:`vgen.kernels.verify.verify`). Past the
first rejection the row's next drafts are fresh draws from this pass's targets there (Jacobi); where the pass
computed none, a draft copies the token above (``init=vertical``; the row's first fed token in the first row).

What each fed token sees (PJD's row-causal mask): the condition, the tokens before it in raster order that were
decided before this pass (as in ZipAR), and the drafts its own row feeds in this pass up to itself -- never another
row's drafts. A token's keys and values are computed once,
when it is fed, from what it sees then. A row that starts before the row above has ended reads its first token
from ZipAR's stand-in (the latest decided token of the row above that one, row 0's for row 1, or the real token
once the row above is complete) fed at the slot before the row, written to a scratch slot that only its own query
reads (ZipAR's); the row above's last token is fed on its own later, so the rows after it see it.

It changes the distribution where ZipAR does (a token is drawn before the end of the row above it is known):
drift is reported as ``nll`` under the plain AR model (``score=true``), FID-photo in docs/lab. With ``lag`` = the
width every token sees every token before it and pjd draws exactly from the AR distribution (an enumeration test).
Each sample draws from uniforms of its own seed, indexed by pass, row slot and window position, so a sample is
the same in any batch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec
from vgen.kernels.decode import compiled, token_step
from vgen.kernels.sampling import per_sample_uniforms, sample_from_probs
from vgen.kernels.verify import verify, window_target
from vgen.samplers.base import Sampler, option, register_sampler
from vgen.samplers.speculative.rules import TokenRule
from vgen.samplers.speculative.scheduler import pass_histogram
from vgen.samplers.zipar import RowOptions, score_under_ar


@dataclass
class PJDOptions(RowOptions):
    lag: int = option(4, "a row starts once the row above has this many tokens decided, and stays this many behind "
                      "it (ZipAR's window; the grid's width: one row after another, exact)")
    window: int = option(4, "tokens each running row feeds per pass: its newest decided token and window - 1 "
                         "drafts (1: one token per row and pass)")
    rows: int = option(4, "rows that run in one forward pass at most (each pass feeds rows x window tokens)")
    follow: bool = option(True, "a row stays lag tokens behind the row above (ZipAR's invariant); false: only its "
                          "start waits for lag tokens, then it runs at its own pace (fewer passes, more drift)")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        self.check_lag("lag", self.lag, spec)
        width = self.grid_width(spec)
        if width is not None and not 1 <= self.window <= width:
            raise VGenError(f"window must be in 1..{width} (tokens a row feeds per pass, within its row), got "
                            f"{self.window}")
        if self.window < 1:
            raise VGenError(f"window must be >= 1 (tokens a row feeds per pass), got {self.window}")
        if self.rows < 1:
            raise VGenError(f"rows must be >= 1 (rows running in one pass), got {self.rows}")


class PJDState(NamedTuple):
    """What every pass reads and updates in place; per-position tensors have one junk column at L (scatters of
    nothing land there)."""
    tokens: torch.Tensor  # (B, L + 1) long: decided tokens, then drafts
    q: torch.Tensor       # (B, L + 1, V): the draft distribution of each draft
    has: torch.Tensor     # (B, L + 1) bool: an undecided position holds a draft
    n: torch.Tensor       # (B, R + 1) long: tokens decided per row (a junk row at R)
    fed: torch.Tensor     # (B, L + 1) long: the pass whose forward computed the token's keys and values (-1: none)
    logp: torch.Tensor    # (B, L + 1): log-probability of each decided token under the target it was drawn from
    smap: torch.Tensor    # (B, L + 1) long: the pass that decided each token


def pjd_step(model, cache, s: PJDState, u: torch.Tensor, t: torch.Tensor, R: int, W: int, w: int, K: int, lag: int,
             follow: bool, cfg: bool, cfg_scale: float, cfg_interval: int, temperature: float, top_k: int, top_p: float) -> None:
    """One pass, in place: advance the pass counter ``t`` (a 0-d tensor), feed every running row's window (up to
    ``K`` rows of ``w`` tokens per sample, the rows from the lowest one not finished), verify, write the decided
    tokens and the next drafts over ``s``. ``u`` (B, passes, K * (2w - 1)): each sample's uniforms."""
    t.add_(1)
    tokens, n = s.tokens, s.n
    B, dev = n.shape[0], n.device
    L, C = R * W, model.cond_len
    rr = torch.arange(R, device=dev)
    nr = n[:, :R]
    last = (rr + 1) * W - 1
    last_fed = s.fed[:, last] >= 0
    started_next = torch.cat([nr[:, 1:] > 0, nr.new_ones(B, 1, dtype=torch.bool)], 1)
    done = (nr == W) & (last_fed | ~started_next | (rr == R - 1))  # complete, nothing left to feed from it
    r0 = done.long().cumprod(1).sum(1)  # (B,) the lowest row not done (R: the sample is finished)

    rb = r0[:, None] + torch.arange(K, device=dev)  # (B, K) the rows of this pass's blocks
    real = rb < R
    rc = rb.clamp_max(R - 1)
    nb = n.gather(1, torch.where(real, rc, R))
    up = (rc - 1).clamp_min(0)
    n_up = n.gather(1, up)
    up_complete = (rc == 0) | (n_up == W)
    free = up_complete | (nb > 0) if not follow else up_complete
    limit = torch.where(free, W, (n_up - lag + 1).clamp(max=W))
    m = limit - nb  # tokens the row may decide in this pass
    run = real & (nb < W) & (m >= 1)
    flush = real & (nb == W) & ~done.gather(1, rc)  # a complete row whose last token no pass has fed yet
    checked = torch.minimum(m - 1, torch.full_like(m, w - 1)).clamp_min(0)

    # the fed positions: a row's newest decided token (or the slot before the row), then its drafts
    base = torch.where(flush, rc * W + W - 1, rc * W + nb - 1)  # (B, K)
    j = torch.arange(w, device=dev)
    qpos = base[..., None] + j  # (B, K, w)
    in_row = qpos < ((rc + 1) * W)[..., None]
    valid = (run[..., None] & in_row) | (flush[..., None] & (j == 0))
    qc = qpos.clamp(0, L - 1)
    x = tokens.gather(1, qc.flatten(1)).view(B, K, w)
    # a row's first token: the row above's last, fed now at its slot if no pass has fed it, else a stand-in
    prev_fed = s.fed.gather(1, (rc * W - 1).clamp_min(0)) >= 0
    standin = run & (nb == 0) & ~((n_up == W) & ~prev_fed)
    src_row = (rc - 2).clamp_min(0)
    src = src_row * W + n.gather(1, src_row) - 1  # the latest decided token of the row above that one (row 0's)
    stand_tok = torch.where(n_up == W, tokens.gather(1, (rc * W - 1).clamp_min(0)), tokens.gather(1, src.clamp_min(0)))
    x[..., 0] = torch.where(standin, stand_tok, x[..., 0])
    # drafts where none is held yet: the token above (the row's first fed token in the first row), one-hot
    need = valid & (j > 0) & ~s.has.gather(1, qc.flatten(1)).view(B, K, w)
    above = tokens.gather(1, (qc - W).clamp_min(0).flatten(1)).view(B, K, w)
    x = torch.where(need, torch.where(rc[..., None] > 0, above, x[..., :1]), x)
    V = s.q.shape[-1]
    qd = s.q.gather(1, qc[..., 1:].flatten(1)[..., None].expand(-1, -1, V)).view(B, K, w - 1, V)
    qd = torch.where(need[..., 1:, None], F.one_hot(x[..., 1:], V).to(qd.dtype), qd)

    # where each fed token is written and what it sees (the row-causal mask)
    junk = C + L + R
    scratch = torch.where(standin[..., None] & (j == 0), C + L + rc[..., None], C + qpos)
    wslot = torch.where(valid, scratch, junk).flatten(1)  # (B, S)
    pos = torch.where(valid, C + qpos, C).flatten(1)
    slots = torch.arange(cache.max_len, device=dev)
    p_key = slots - C  # a real key's raster position
    qv, qp = valid.flatten(1), qpos.flatten(1)
    start = (base + standin.long())[..., None].expand(B, K, w).flatten(1)  # the first real slot the row feeds now
    fed_before = F.pad(s.fed[:, :L] >= 0, (C, cache.max_len - C - L))  # over the cache's slots
    key_real = (p_key >= 0) & (p_key < L)
    # decided before this pass and fed now (rows' newest tokens, flushed last tokens): seen by every later query
    now = torch.where(((run & ~standin) | flush)[..., None] & (j == 0), qpos, L).flatten(1)
    now = F.pad(torch.zeros_like(s.has).scatter_(1, now, True)[:, :L], (C, cache.max_len - C - L))
    see = (((fed_before | now)[:, None, :] & (p_key < qp[..., None]))
           | ((p_key >= start[..., None]) & (p_key <= qp[..., None])))
    see = see & key_real & qv[..., None]
    see = see | (slots < C)  # the condition
    own_scratch = (standin[..., None] & (j == 0)).flatten(1)[..., None] & (
        slots == (C + L + rc)[..., None].expand(B, K, w).flatten(1)[..., None])  # a stand-in: its own query only
    see = see | own_scratch | (~qv[..., None] & (slots == junk))
    mask = see[:, None]
    xin = x.flatten(1)
    if cfg:
        xin, pos, wslot, mask = (torch.cat([v, v]) for v in (xin, pos, wslot, mask))
    cache.write_at(wslot)
    logits = model.decode(xin, pos, cache, attn_mask=mask)
    cache.write_at(None)
    p = window_target(logits, (qp + 1).clamp(0, L - 1), cfg, cfg_scale, cfg_interval, temperature, top_k, top_p)

    # verify every row's drafts (rows as the batch of the verification core)
    BK = B * K
    uu = u.index_select(1, (t - 1).clamp_max(u.shape[1] - 1).view(1))[:, 0]  # (B, K * (2w - 1)): a tensor index, no host read
    ua, ur, ud = uu.view(B, K, 2 * w - 1).split([w - 1, 1, w - 1], dim=-1)
    pr = p.view(BK, w, V)
    xd = x[..., 1:].reshape(BK, w - 1)
    mine = (torch.arange(w - 1, device=dev) < checked[..., None]).view(BK, w - 1)
    k, tok = verify(pr, qd.view(BK, w - 1, V), xd, valid[..., 1:].reshape(BK, w - 1), mine, ua.reshape(BK, w - 1),
                    ur.reshape(BK), TokenRule())
    k = k.view(B, K)
    cand = torch.cat([xd, tok[:, None]], 1).scatter(1, k.view(BK, 1), tok[:, None]).view(B, K, w)
    lp = pr.gather(-1, cand.view(BK, w, 1)).view(B, K, w).clamp_min(1e-30).log()
    dpos = qpos + 1  # decided positions: after the fed token at j
    decided = run[..., None] & (j <= k[..., None])
    at = torch.where(decided, dpos, L).flatten(1)
    new_tokens = tokens.scatter(1, at, cand.flatten(1))
    logp = s.logp.scatter(1, at, lp.flatten(1))
    smap = s.smap.scatter(1, at, t.expand_as(at))
    # keys and values computed now at their real slots: a running row's fed token and accepted drafts, a flushed
    # row's last token
    kept = ((run[..., None] & (j <= k[..., None]) & ~(standin[..., None] & (j == 0))) | (flush[..., None] & (j == 0)))
    fed = s.fed.scatter(1, torch.where(kept, qpos, L).flatten(1), t.expand(B, K * w))
    n_new = n.scatter_add(1, torch.where(run, rc, R), torch.where(run, k + 1, 0))
    # the next drafts: fresh draws from this pass's targets after the newest decided token, where it computed one
    jj = torch.arange(w - 1, device=dev)
    src_j = k[..., None] + 1 + jj  # the query whose output drafts position base + 2 + k + jj
    npos = base[..., None] + 2 + k[..., None] + jj  # (B, K, w - 1)
    inrow = run[..., None] & (npos < ((rc + 1) * W)[..., None])
    have = inrow & (src_j <= w - 1) & valid.gather(2, src_j.clamp_max(w - 1))
    ps = pr.view(B, K, w, V).gather(2, src_j.clamp_max(w - 1)[..., None].expand(-1, -1, -1, V))
    draw = sample_from_probs(ps, ud)
    wpos = torch.where(inrow, npos, L).flatten(1)
    new_tokens = new_tokens.scatter(1, torch.where(have, npos, L).flatten(1), draw.flatten(1))
    s.q.scatter_(1, torch.where(have, npos, L).flatten(1)[..., None].expand(-1, -1, V), ps.flatten(1, 2))  # in place
    has = s.has.scatter(1, wpos, have.flatten(1))
    for dst, val in zip(s, (new_tokens, s.q, has, n_new, fed, logp, smap)):
        if dst is not val:
            dst.copy_(val)


def decode_rows(model, cond: torch.Tensor, seeds: list[int], o: PJDOptions, progress: bool = False):
    """PJD's passes for conditions ``cond`` (B, ...): (the final :class:`PJDState`, passes each sample ran (B,), the
    cache). ``state.fed`` is the pass whose forward computed each token's keys and values (-1: never, e.g. the
    image's last token), ``state.smap`` the pass that decided each token, ``state.logp`` its log-probability under
    the target it was drawn from: what each token saw follows from them (tests/test_pjd.py)."""
    B, L, dev = cond.shape[0], model.seq_len, cond.device
    W = model.token_shape[-1]
    R, w, K = L // W, o.window, min(o.rows, L // W)
    V = model.vocab_size
    cfg = o.guided
    cond_in = torch.cat([cond, model.null_cond(cond)]) if cfg else cond
    cache = model.new_cache(cond_in.shape[0], max_len=model.cond_len + L + R + 1)  # + a scratch slot per row, junk
    u0 = per_sample_uniforms(seeds, (1,), dev)  # token 0: AR's draw
    u = per_sample_uniforms(seeds, (L + R + 1, K * (2 * w - 1)), dev, stream=1)
    s = PJDState(tokens=torch.zeros(B, L + 1, dtype=torch.long, device=dev),
                 q=torch.zeros(B, L + 1, V, device=dev), has=torch.zeros(B, L + 1, dtype=torch.bool, device=dev),
                 n=torch.zeros(B, R + 1, dtype=torch.long, device=dev),
                 fed=torch.full((B, L + 1), -1, dtype=torch.long, device=dev),
                 logp=torch.zeros(B, L + 1, device=dev), smap=torch.zeros(B, L + 1, dtype=torch.long, device=dev))
    cache.limit(None)  # scratch slots lie past the sequence: attention reads the whole cache (the mask decides)
    tok, lp = token_step(model.prefill(cond_in, cache)[:, None], u0, cfg, True, o.cfg_scale, o.temperature,
                         o.top_k, o.top_p)
    s.tokens[:, :1], s.logp[:, :1] = tok, lp
    s.n[:, 0] = 1
    step = compiled(pjd_step, device=dev.type) if o.compile else pjd_step
    kw = dict(R=R, W=W, w=w, K=K, lag=o.lag, follow=o.follow, cfg=cfg, cfg_scale=o.cfg_scale, cfg_interval=o.cfg_interval,
              temperature=o.temperature, top_k=o.top_k, top_p=o.top_p)
    counter = torch.zeros((), dtype=torch.long, device=dev)
    passes = torch.zeros(B, dtype=torch.long, device=dev)
    bar = tqdm(total=B * L, disable=not progress, desc="pjd", leave=False)
    for _ in range(L + R):  # each pass decides a token or feeds a finished row's last one
        left = (s.n[:, :R] < W).any(1)
        if not bool(left.any()):  # a host read per pass: is any sample still drawing?
            break
        passes += left
        step(model, cache, s, u, counter, **kw)
        if progress:
            bar.update(int(s.n[:, :R].sum()) - bar.n)
    bar.close()
    return s, passes, cache


@register_sampler
class PJDSampler(Sampler):
    name = "pjd"
    Options = PJDOptions

    def _sample(self, model, cond, seeds, progress, codebook=None):
        o = self.options
        t0 = time.perf_counter()
        B, L = cond.shape[0], model.seq_len
        s, passes, cache = decode_rows(model, cond, seeds, o, progress)
        tokens, smap = s.tokens[:, :L].clone(), s.smap[:, :L].clone()
        width = min(o.rows, L // model.token_shape[-1]) * o.window
        stats = {"forward_passes": int(passes.max()) + 1, "tokens": B * L, "kv_cache_bytes": cache.nbytes,
                 "accepted_per_step": float((L / (passes + 1).double()).mean()), "step_map": smap,
                 "pass_histogram": pass_histogram(smap.sort(1).values, width)}
        if o.score:
            stats["nll"] = score_under_ar(model, cache, tokens, s.logp[:, :1], o)
        stats["seconds"] = time.perf_counter() - t0
        return tokens, stats
