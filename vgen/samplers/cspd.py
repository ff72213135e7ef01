"""Continuous Speculative Decoding (CSpD), exact: a small draft model proposes ``num_draft`` continuous tokens, the
target scores them with one transformer pass and accepts each on the ratio of two Gaussians.

Trajectory alignment: a token's randomness is its position's noise (:mod:`vgen.samplers.continuous`): the start
noise and every reverse step's noise of the diffusion head. Draft and target run their heads on the same noise, so
given everything but the last step's noise each model's token is one Gaussian: the draft's q = N(mu_q, s_q^2), the
target's p = N(mu_p, s_p^2) (the last step's mean and learned variance, times the temperature). That shared noise has
the same law under both models, so the speculative rule on the token alone is exact for the pair (noise, token):

* accept draft x with probability min(1, p(x) / q(x)) (computed in log space, in float64);
* at the first rejection draw from norm(max(0, p - q)): propose y ~ p, keep it with probability max(0, 1 - q(y)/p(y)),
  repeat until every rejected row has a sample (each row from its own generator: no cap, no zero vectors);
* when all k drafts pass, the target's own token at the next position comes free (its head ran on the same pass).

The official code (MarkXCloud/CSpD) divides the exponent by a temperature of 42 inside the ratio and gives up after
100 resampling tries, leaving a zero vector: neither keeps the target's distribution (``rule="official"`` runs that
rule, for the tests that show it). The first ``prefill_ratio`` of the tokens come from the target alone.

Cost per round: k draft passes (transformer + head), one target transformer pass over k + 1 tokens and one target
head trajectory over the k + 1 positions at once (a batch of k + 1: at batch 1 about the price of one). CSpD saves
target transformer passes and turns the target's head calls into batched ones; it cannot skip the target's head.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec, Order
from vgen.models.diffusion_head import gaussian_logpdf
from vgen.samplers.base import option, register_sampler
from vgen.samplers.continuous import (
    Clock,
    ContinuousOptions,
    ContinuousSampler,
    draw_tokens,
    guidance,
    rejection_generators,
    token_noise,
)

RULES = ("exact", "path", "official")


@dataclass
class CSpDOptions(ContinuousOptions):
    num_draft: int = option(4, "tokens the draft proposes per round (k)")
    prefill_ratio: float = option(0.15, "the first this fraction of the tokens come from the target alone")
    draft: str = option("", "the draft model: a zoo name or pipeline folder ('' = the one the model card names)")
    draft_refresh: int = option(1, "the draft's head network runs every this many reverse steps and reuses its last "
                                "output in between (a cheaper, coarser draft; exactness unchanged)")
    rule: str = option("exact", "acceptance rule: exact (ratio of the last step's Gaussians under shared noise), "
                       "path (ratio of whole reverse-path densities: exact too, verified in one batched head call), "
                       "or official (MarkXCloud/CSpD's: ratio at temperature 42, 100 resampling tries then a zero "
                       "vector; not exact, for comparison)", RULES)

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.num_draft < 1:
            raise VGenError(f"num_draft must be >= 1, got {self.num_draft}")
        if self.draft_refresh < 1:
            raise VGenError(f"draft_refresh must be >= 1 (1 = the network at every step), got {self.draft_refresh}")
        if not 0.0 <= self.prefill_ratio < 1.0:
            raise VGenError(f"prefill_ratio must be in [0, 1), got {self.prefill_ratio}")


def accept_log_ratio(x, mean_p, log_std_p, mean_q, log_std_q, rule: str) -> torch.Tensor:
    """log of the acceptance probability's ratio p(x) / q(x), per row (float64)."""
    if rule == "official":
        zp = ((x.double() - mean_p.double()) / log_std_p.double().exp()) ** 2
        zq = ((x.double() - mean_q.double()) / log_std_q.double().exp()) ** 2
        return -0.5 * (zp - zq).sum(-1) / 42.0 ** 2
    return gaussian_logpdf(x, mean_p, log_std_p) - gaussian_logpdf(x, mean_q, log_std_q)


def residual_draw(mean_p, log_std_p, mean_q, log_std_q, gens: list[torch.Generator], rule: str,
                  rows: list[int] | None = None, mask: torch.Tensor | None = None, chunk: int = 16) -> torch.Tensor:
    """One draw per row from norm(max(0, p - q)) by acceptance-rejection with p as the proposal: y ~ p is kept with
    probability 1 - q(y)/p(y) where positive. Row i draws ``chunk`` proposals at a time from ``gens[i]`` until one
    is kept (``rule="official"``: 100 proposals at most, then a zero vector). ``rows``: the rows that draw, and
    ``mask`` the same as a (R,) boolean tensor on the device (the others stay zero and draw nothing; default every
    row). The rows still drawing go together, one host read per ``chunk`` proposals; row i's draws come from
    ``gens[i]`` in the same order whatever else is drawn."""
    R, C = mean_p.shape
    dev = mean_p.device
    out = torch.zeros_like(mean_p)
    todo = list(range(R)) if rows is None else list(rows)
    waiting = torch.ones(R, dtype=torch.bool, device=dev) if mask is None else mask
    cols = torch.arange(chunk, device=dev)
    tries = 0
    while todo:
        eps, u = torch.zeros((R, chunk, C)), torch.ones((R, chunk), dtype=torch.float64)
        for i in todo:  # on the host, from each row's own generator (never a device read)
            eps[i] = torch.randn((chunk, C), generator=gens[i])
            u[i] = torch.rand((chunk,), generator=gens[i], dtype=torch.float64)
        eps, u = eps.to(dev), u.to(dev)
        y = mean_p[:, None] + log_std_p.exp()[:, None] * eps
        lq = gaussian_logpdf(y, mean_q[:, None], log_std_q[:, None])
        lp = gaussian_logpdf(y, mean_p[:, None], log_std_p[:, None])
        keep = (u < -torch.expm1(torch.clamp(lq - lp, max=0.0))) & (lq < lp)
        tries += chunk
        if rule == "official" and tries > 100:
            keep = keep & (cols < chunk - (tries - 100))
        hit = keep.any(1) & waiting
        first = keep.long().argmax(1)  # each row's first kept proposal
        out = torch.where(hit[:, None], y[torch.arange(R, device=dev), first], out)
        waiting = waiting & ~hit
        if rule == "official" and tries >= 100:
            break  # the official code leaves the zero vector here
        still = waiting.tolist()  # the one read per round of proposals
        todo = [i for i in todo if still[i]]
    return out


RESIDUAL_PATHS = 4  # candidate paths a row proposes at once in a residual draw (see residual_path_draw)


def residual_path_draw(model, draft, zp, zq, positions, o, L: int, guided: bool, steps: int,
                       gens: list[torch.Generator], candidates: int = RESIDUAL_PATHS) -> torch.Tensor:
    """One token per row from the residual of the path rule, norm(max(0, P - Q)) over whole reverse paths: the
    target proposes paths (its own reverse process on fresh noise from the row's generator), the draft scores them
    (one batched call), and a path is kept with probability 1 - Q/P where positive; a row takes its first kept path.
    Each row proposes ``candidates`` paths per round, all rows' in one head call (at batch 1 the head is latency-
    bound: 4 paths cost about 2 of 1, and a row needs 1 / TV(P, Q) paths on average); rows loop until each has one.
    The i-th path a row proposes is the same whatever else shares the call, so the draw is batch-invariant."""
    R, C, T = len(gens), model.token_channels, candidates
    dev = zp.device
    out = torch.zeros((R, C), device=dev)
    todo = torch.arange(R, device=dev)
    rows = list(range(R))  # the same rows, on the host
    while rows:
        n = len(rows)
        start = torch.cat([torch.randn((T, C), generator=gens[i]) for i in rows]).to(dev)          # (n*T, C)
        step_noise = torch.cat([torch.randn((steps, T, C), generator=gens[i]) for i in rows], 1).to(dev)
        u = torch.cat([torch.rand((T,), generator=gens[i], dtype=torch.float64) for i in rows]).to(dev)
        rep = todo.repeat_interleave(T)                                   # candidate c of row r at r*T + c
        sel = torch.cat([rep, rep + R]) if guided else rep
        cfg = guidance(o, positions[rep], L, guided, zp.dtype)
        hs = model.sample_head(zp[sel], start, step_noise, o.temperature, cfg, steps, True, o.stop_sigma,
                               o.clip_x0, path=True, compiled=o.compile is True)
        lq = draft.head_path_logpdf(zq[sel], hs.states, o.temperature, cfg, steps, o.stop_sigma, o.clip_x0,
                                    o.draft_refresh)
        keep = ((u < -torch.expm1(torch.clamp(lq - hs.path_logpdf, max=0.0))) & (lq < hs.path_logpdf)).reshape(n, T)
        hit = keep.any(1)
        first = keep.long().argmax(1)                                     # the row's first kept candidate
        tok = hs.token.reshape(n, T, C)[torch.arange(n, device=dev), first]
        out[todo] = torch.where(hit[:, None], tok, out[todo])
        kept = hit.tolist()  # the one read per round of candidates
        rows = [i for i, k in zip(rows, kept) if not k]
        todo = todo[torch.argsort(hit.to(torch.int8), stable=True)[:len(rows)]]  # the rows left, in order
    return out


@register_sampler
class CSpDSampler(ContinuousSampler):
    name = "cspd"
    order = Order.CONTINUOUS_NEXT_TOKEN
    Options = CSpDOptions
    needs_draft = True

    def _sample(self, model, cond, seeds, progress, codebook=None, draft=None):
        o = self.options
        t0 = time.perf_counter()
        B, L, C, dev = cond.shape[0], model.seq_len, model.token_channels, cond.device
        k, guided = o.num_draft, o.guided
        by_path = o.rule == "path"
        steps = o.steps(model)  # the draft runs the target's steps: both read the same per-step noise
        noise = token_noise(seeds, L, steps, C, dev)
        gens = rejection_generators(seeds)
        both = (lambda x: torch.cat([x, x])) if guided else (lambda x: x)
        cond_in = torch.cat([cond, model.null_cond(cond)]) if guided else cond
        tcache, dcache = model.new_cache(cond_in.shape[0]), draft.new_cache(cond_in.shape[0])
        rows = torch.arange(B, device=dev)
        tokens = torch.zeros((B, L + k + 1, C), device=dev)  # room for drafts past the end
        smap = torch.zeros((B, L), dtype=torch.long, device=dev)
        clock = Clock(dev)
        positions = torch.arange(model.cond_len, model.cond_len + L, device=dev)  # the target's, for its own passes

        # 1. the target alone for the first tokens (at least one: the draft needs a context to continue)
        n0 = min(L, max(1, math.ceil(o.prefill_ratio * L)))
        z = model.prefill(cond_in, tcache)
        passes = 1
        for t in range(n0):
            tokens[:, t] = draw_tokens(model, z, noise, rows, torch.full((B,), t, device=dev), o, L, guided).token
            smap[:, t] = passes - 1
            clock.lap("target_head")
            if t + 1 < n0:
                z = model.decode(both(tokens[:, t:t + 1]), positions[t:t + 1], tcache)[:, 0]
                passes += 1
                clock.lap("target_transformer")
        # the draft reads the same context in one pass
        draft.prefill(cond_in, dcache)
        if n0 > 1:
            draft.decode(both(tokens[:, :n0 - 1]), torch.arange(draft.cond_len, draft.cond_len + n0 - 1, device=dev),
                         dcache)
        dpasses = 1 + int(n0 > 1)
        clock.lap("draft")

        n = torch.full((B,), n0, dtype=torch.long, device=dev)  # tokens decided per sample
        n_host = [n0] * B  # the same, on the host: one read per round (the accepted counts) keeps it in step
        checked = accepted = 0
        ar = torch.arange(k + 1, device=dev)
        span = torch.arange(L, device=dev)
        bar = tqdm(total=B * L, initial=B * n0, disable=not progress, desc="cspd", unit="tok", leave=False)
        while min(n_host) < L:
            live = n < L
            # 2. the draft proposes k tokens: its first pass feeds the last two decided tokens (one may be new)
            dq_mean = torch.zeros((B, k, C), device=dev)
            dq_lstd = torch.zeros((B, k, C), device=dev)
            paths, logq, zqs = [], [], []
            idx = (n[:, None] - 2 + ar[:2]).clamp(0, L - 1)
            inp = tokens[rows[:, None], idx]
            for j in range(k):
                pos = draft.cond_len + idx
                zq = draft.decode(both(inp), both(pos), dcache)[:, -1]
                dpasses += 1
                p_j = (n + j).clamp_max(L - 1)
                hs = draw_tokens(draft, zq, noise, rows, p_j, o, L, guided, steps, path=by_path,
                                 refresh=o.draft_refresh)
                tokens[rows, n + j] = hs.token
                dq_mean[:, j], dq_lstd[:, j] = hs.mean, hs.log_std
                if by_path:
                    paths.append(hs.states)
                    logq.append(hs.path_logpdf)
                    zqs.append(zq)
                idx = (n + j)[:, None].clamp_max(L - 1)
                inp = hs.token[:, None]
            clock.lap("draft")
            # 3. the target: one pass over the last decided token and the k drafts -> k + 1 conditions
            tidx = (n[:, None] - 1 + ar).clamp_max(L - 1)
            zp = model.decode(both(tokens[rows[:, None], n[:, None] - 1 + ar]), both(model.cond_len + tidx), tcache)
            passes += 1
            clock.lap("target_transformer")
            ppos = (n[:, None] + ar).clamp_max(L - 1)  # positions n .. n+k (past the end: junk, never kept)
            x = tokens[rows[:, None], n[:, None] + ar[:-1]]
            u = noise.uniforms[rows[:, None], ppos[:, :-1]].double()
            if by_path:  # 4'. every drafted path scored by the target in one batched head call
                zk = zp[:, :k].reshape(-1, zp.shape[-1])
                cfg_k = guidance(o, ppos[:, :-1].reshape(-1), L, guided, zk.dtype)
                logp = model.head_path_logpdf(zk, torch.stack(paths, 2).flatten(1, 2), o.temperature, cfg_k, steps,
                                              o.stop_sigma, o.clip_x0).reshape(B, k)
                lr = logp - torch.stack(logq, 1)
            else:  # 4. the target's own head on the same noise at the k + 1 positions at once
                zrows = zp.reshape(-1, zp.shape[-1])  # rows [cond (B*(k+1)); uncond (B*(k+1))] when guided
                hp = draw_tokens(model, zrows, noise, rows.repeat_interleave(k + 1), ppos.reshape(-1), o, L, guided)
                p_mean, p_lstd = hp.mean.reshape(B, k + 1, C), hp.log_std.reshape(B, k + 1, C)
                p_tok = hp.token.reshape(B, k + 1, C)
                lr = accept_log_ratio(x, p_mean[:, :-1], p_lstd[:, :-1], dq_mean, dq_lstd, o.rule)
            clock.lap("target_head")
            # accept left to right; the first rejection is redrawn from norm(max(0, p - q))
            ok = (torch.log(u) < lr) & (n[:, None] + ar[:-1] < L)
            a = ok.long().cumprod(1).sum(1)  # leading accepts (B,)
            a_host = a.tolist()  # the round's one read: every row's accepted count
            full = a == k
            redo_rows = [b for b in range(B) if a_host[b] < k and n_host[b] + a_host[b] < L]
            drew = ~full & live & (n + a < L)  # redo_rows, on the device
            if by_path:  # no free bonus: the target's own token would cost a whole trajectory
                new = tokens[rows, (n + a).clamp_max(L + k)]
                if redo_rows:  # the same rows as device indices, in order (no upload)
                    redo = torch.argsort((~drew).to(torch.int8), stable=True)[:len(redo_rows)]
                    ra = a[redo]
                    zsel = zp[:, :k].reshape(-1, zp.shape[-1])
                    zq_all = torch.stack(zqs, 1).reshape(-1, zqs[0].shape[-1])  # rows [cond (B*k); uncond (B*k)]
                    half = B * k
                    pick = redo * k + ra
                    pick2 = torch.cat([pick, pick + half]) if guided else pick
                    new[redo] = residual_path_draw(model, draft, zsel[pick2], zq_all[pick2], n[redo] + ra, o, L,
                                                   guided, steps, [gens[i] for i in redo_rows])
            else:
                new = torch.where(full[:, None], p_tok[:, -1], p_tok[:, 0])  # bonus (all passed) ...
                if redo_rows:  # ... or the residual draw at the first rejection (every row's parameters at its own
                    ra = a.clamp_max(k - 1)  # first rejection; the rows in redo_rows draw)
                    res = residual_draw(p_mean[rows, ra], p_lstd[rows, ra], dq_mean[rows, ra], dq_lstd[rows, ra],
                                        gens, o.rule, rows=redo_rows, mask=drew)
                    new = torch.where(drew[:, None], res, new)
            clock.lap("verify")
            fin = (n + a).clamp_max(L + k)
            tokens[rows, fin] = torch.where(live[:, None] & ~(full & by_path)[:, None], new, tokens[rows, fin])
            grow = a + 1 - (full & by_path).long()  # the path rule has no bonus token
            step = torch.where(live, torch.minimum(grow, L - n), 0)
            smap.masked_fill_((span >= n[:, None]) & (span < (n + step)[:, None]), passes - 1)
            n = n + step
            grown = 0
            for b in range(B):  # the same bookkeeping on the host, from the accepted counts
                if n_host[b] < L:
                    checked += min(k, L - n_host[b])
                    accepted += min(a_host[b], L - n_host[b])
                    g = min(a_host[b] + 1 - int(by_path and a_host[b] == k), L - n_host[b])
                    n_host[b] += g
                    grown += g
            bar.update(grown)
        bar.close()
        stats = {"forward_passes": passes, "draft_passes": dpasses, "tokens": B * L,
                 "seconds": time.perf_counter() - t0, "accepted_per_step": L / passes,
                 "acceptance_rate": accepted / checked if checked else 0.0,
                 "kv_cache_bytes": tcache.nbytes + dcache.nbytes, **clock.stats(), "step_map": smap}
        return tokens[:, :L], stats
