"""The speculative core shared by SJD, GSD and LANTERN: Jacobi-window decoding with a pluggable acceptance rule.

Each forward pass feeds, for every sample, its last accepted token and ``window - 1`` draft tokens at that
sample's own positions (ragged batches: no sample waits for another). From the target distribution p at each
position (CFG-guided, temperature-scaled, top-k/top-p-truncated, exactly as the AR sampler's) the rule gives
each draft x an acceptance probability a(x); drafts pass left to right until the first rejection, which is
replaced by a draw from norm(max(0, p - q)) (or, when all pass, a bonus token is drawn from p). Positions after
the rejection keep a fresh Jacobi sample from p as their next draft, with that p as its draft distribution q;
new positions at the end of the window get drafts from ``init``. The KV cache needs no rollback work: slots
are positions, and the next pass overwrites the slots past the accepted prefix.

Rule contract: ``rule(p, q, x, px, qx, *args, **kw) -> a`` on (B, W-1, V) targets p and draft distributions
q, drafts x (B, W-1) with px = p(x), qx = q(x). The core forces a = 0 where p(x) = 0 (a token outside the
target's top-k/top-p support is never emitted) and past the end of the image.

* SJD: a = min(1, p(x) / q(x)): lossless.
* GSD: sums of p and q over a group of similar tokens: not lossless, drift reported.
* LANTERN: p(x) plus nearby-token mass in the numerator, bounded so the per-token total-variation drift is
  at most ``delta``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vgen.errors import VGenError
from vgen.kernels.decode import compiled
from vgen.kernels.sampling import per_sample_uniforms, sample_from_probs
from vgen.kernels.verify import correction, gather_rows, leading_accepts, window_target
from vgen.interfaces import ModelSpec
from vgen.samplers.base import Sampler, SamplingOptions, option

INITS = ("random", "horizontal", "vertical", "sample", "temporal")
FRESH_Q = ("proposal", "onehot")


@dataclass
class SpeculativeOptions(SamplingOptions):
    """Options every speculative sampler shares. ``fresh_q=proposal`` verifies drafts against what they were really
    drawn from (uniform for random, the sampled distribution for sample; copies are deterministic, so one-hot);
    ``onehot`` is the official SJD code's choice. Both are lossless; the proposal accepts more."""
    window: int = option(16, "tokens per forward pass: the last accepted one plus window-1 drafts")
    init: str = option("random", "drafts for new positions: random (uniform), horizontal (copy the left token), "
                       "vertical (copy the token above; left in the first row), sample (draw from the target), "
                       "temporal (video: copy the token at the same place in the previous frame; vertical in the "
                       "first frame)", choices=INITS)
    fresh_q: str = option("proposal", "draft distribution used to verify new drafts: proposal | onehot",
                          choices=FRESH_Q)

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.window < 2:
            raise VGenError(f"window must be >= 2 (the last accepted token plus at least one draft), got {self.window}")
        if self.init == "temporal" and spec is not None and spec.token_shape is not None and not spec.is_video:
            raise VGenError(f"init=temporal copies drafts from the previous frame, but {spec.name} makes images "
                            f"(token grid {spec.token_shape}): use init=vertical")


def _copy_source(last: torch.Tensor, off: torch.Tensor, stride: int) -> torch.Tensor:
    """Raster index ``stride`` positions before each new position ``last + off`` -- or, for the positions after
    ``last`` whose source is itself new, the nearest multiple of ``stride`` back that is already placed. (B, D)."""
    t = last[:, None] + off
    return t - ((off + stride - 1) // stride) * stride


def fresh_drafts(tokens: torch.Tensor, last: torch.Tensor, p_last: torch.Tensor, u: torch.Tensor, *, init: str,
                 fresh_q: str, grid: tuple[int, ...]):
    """Drafts for the D = u.shape[1] positions after ``last`` (B,), and their draft distributions (B, D, V).

    ``tokens`` holds the current token (accepted or draft) at every position up to ``last``; ``p_last`` (B, V) is
    the target distribution at ``last``; ``grid`` is the model's token grid ((h, w) or (t, h, w))."""
    B, D = u.shape
    V = p_last.shape[-1]
    off = torch.arange(1, D + 1, device=u.device)
    if init == "random":
        f = (u * V).long().clamp_max(V - 1)
        if fresh_q == "proposal":
            return f, p_last.new_full((B, D, V), 1.0 / V)
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
            src = _copy_source(last, off, grid[-1])
            src = torch.where(src >= 0, src, left)  # first row: nothing above, copy the left neighbour
            if init == "temporal":  # the same (h, w) in the nearest earlier frame; vertical in the first frame
                back = _copy_source(last, off, grid[-1] * grid[-2] if len(grid) > 2 else grid[-1])
                src = torch.where(back >= 0, back, src)
        f = tokens.gather(1, src)
    return f, F.one_hot(f, V).to(p_last.dtype)


def spec_step(model, cache, tokens, n, qwin, logp, smap, counts, u, it, *, L: int, W: int, grid: tuple, cfg: bool,
              cfg_scale: float, cfg_interval: int, temperature: float, top_k: int, top_p: float, init: str,
              fresh_q: str, rule, rule_args: tuple, rule_kw: dict):
    """One forward pass + vectorised verification for every sample. State (per sample b):
    tokens[b, :n[b]] accepted, tokens[b, n[b]:n[b]+W-1] drafts with distributions qwin[b] (W-1, V)."""
    ar = torch.arange(W, device=n.device)
    idx = n[:, None] - 1 + ar  # the last accepted token, then the drafts
    inp = tokens.gather(1, idx)
    pos = model.cond_len + idx.clamp_max(L - 1)  # past the end: junk rows, parked on a slot no real query reads
    if cfg:
        inp, pos = torch.cat([inp, inp]), torch.cat([pos, pos])
    logits = model.decode(inp, pos, cache)
    p = window_target(logits, n[:, None] + ar, cfg, cfg_scale, cfg_interval, temperature, top_k, top_p)  # (B, W, V)

    didx = n[:, None] + ar[:-1]
    x = tokens.gather(1, didx)
    pd = p[:, :-1]
    px = pd.gather(-1, x[..., None]).squeeze(-1)
    qx = qwin.gather(-1, x[..., None]).squeeze(-1)
    a = rule(pd, qwin, x, px, qx, *rule_args, **rule_kw)
    a = torch.where((px > 0) & (didx < L), a, torch.zeros_like(a))
    ua, ur, uj, uf = u.split([W - 1, 1, W, W - 1], dim=1)
    k = leading_accepts(ua, a)  # drafts accepted (B,)
    tok_k = correction(p, qwin, k, ur[:, 0])
    y = sample_from_probs(p, uj)  # Jacobi update at every position: next drafts after the rejection
    kk = k[:, None]
    cand = torch.where(ar < kk, torch.cat([x, tok_k[:, None]], 1), torch.where(ar == kk, tok_k[:, None], y))
    lp = p.gather(-1, cand[..., None]).squeeze(-1).clamp_min(1e-30).log()

    widx = n[:, None] + ar
    tokens = tokens.scatter(1, widx, cand)
    logp = logp.scatter(1, widx, lp)  # positions past n+k are rewritten when they are decided
    smap = smap.scatter(1, widx, it.expand_as(widx))
    last = n + W - 1
    f, fq = fresh_drafts(tokens, last, p[:, -1], uf, init=init, fresh_q=fresh_q, grid=grid)
    tokens = tokens.scatter(1, last[:, None] + 1 + ar[:-1], f)
    qwin = gather_rows(torch.cat([p, fq], 1), kk + 1 + ar[:-1])

    active = n < L
    left = L - n
    emitted = torch.where(active, torch.minimum(k + 1, left), 0)
    checked = torch.where(active, torch.minimum(torch.minimum(k + 1, left), torch.full_like(k, W - 1)), 0)
    accepted = torch.where(active, torch.minimum(k, left), 0)
    counts = counts + torch.stack([active.long(), checked, accepted], 1)
    return tokens, n + emitted, qwin, logp, smap, counts


class SpeculativeSampler(Sampler):
    """Base class: subclasses give ``rule`` (a module-level function, see the module docstring) and
    ``rule_inputs`` (the tensors and constants it needs, e.g. tables built from the codebook)."""

    Options = SpeculativeOptions
    rule = None
    prefix = True

    def rule_inputs(self, model, codebook) -> tuple[tuple, dict]:
        return (), {}

    def _run(self, model, cond, seeds, progress, batch_size, codebook=None, prefix=None):
        """Continuous batching: ``batch_size`` slots; when a sample finishes, the next one is prefilled into its
        slot, so a long job never waits for the slowest sample of a batch (only the last ones do)."""
        o = self.options
        t0 = time.perf_counter()
        N, L, W, dev = cond.shape[0], model.seq_len, o.window, cond.device
        S = min(batch_size, N)
        grid = tuple(model.token_shape)
        rule_args, rule_kw = self.rule_inputs(model, codebook)
        cfg = o.guided
        cache = model.new_cache(2 * S if cfg else S)
        kw = dict(L=L, W=W, grid=grid, cfg=cfg, cfg_scale=o.cfg_scale, cfg_interval=o.cfg_interval,
                  temperature=o.temperature, top_k=o.top_k, top_p=o.top_p, init=o.init, fresh_q=o.fresh_q,
                  rule=type(self).rule, rule_args=rule_args, rule_kw=rule_kw)
        step = compiled(spec_step) if o.compile else spec_step

        P = 0 if prefix is None else prefix.shape[1]  # given tokens: each sample starts at token P
        B = L + 2 * W  # buffer length: drafts may run past the end of the image
        tokens = torch.zeros((S, B), dtype=torch.long, device=dev)
        logp = torch.zeros((S, B), dtype=torch.float32, device=dev)
        smap = torch.zeros((S, B), dtype=torch.long, device=dev)
        qwin = torch.zeros((S, W - 1, model.vocab_size), device=dev)
        n = torch.full((S,), L, dtype=torch.long, device=dev)  # an empty slot counts as finished
        counts = torch.zeros((S, 3), dtype=torch.long, device=dev)
        u = torch.zeros((S, L, 3 * W - 1), device=dev)
        slot_cond = cond[:1].expand(S, *cond.shape[1:]).clone()
        owner = [-1] * S  # sample index held by each slot
        start = torch.zeros(S, dtype=torch.long, device=dev)  # iteration at which each slot was prefilled
        slot_rows = torch.arange(S, device=dev)
        out_tokens = torch.zeros((N, L), dtype=torch.long, device=dev)
        out_smap = torch.zeros((N, L), dtype=torch.long, device=dev)
        out_logp = torch.zeros((N, L), dtype=torch.float32, device=dev)
        passes = torch.zeros(N, dtype=torch.float64)
        checked = accepted = prefills = collected = 0
        next_sample, it = 0, 0

        def fill(slots: list[int]) -> None:
            """Prefill the next samples into ``slots`` (one prefill pass over every row: the other rows
            recompute their own condition's keys and values, unchanged)."""
            nonlocal next_sample, prefills
            idx = torch.tensor(slots, device=dev)
            start[idx] = it
            for b in slots:
                owner[b] = next_sample
                slot_cond[b] = cond[next_sample]
                u[b] = per_sample_uniforms([seeds[next_sample]], (L, 3 * W - 1), dev, stream=1)[0]
                next_sample += 1
            cond_in = torch.cat([slot_cond, model.null_cond(slot_cond)]) if cfg else slot_cond
            first = torch.full((S,), P, dtype=torch.long, device=dev)  # the first token to draw
            cache.limit(model.cond_len if o.prefix_attention else None)
            logits = model.prefill(cond_in, cache)[:, None]
            prefills += 1
            t_new = tokens.clone()
            if P:  # feed the given tokens in one more pass (every row: the others recompute their own)
                for b in slots:
                    t_new[b, :P] = prefix[owner[b]]
                x = torch.cat([t_new[:, :P], t_new[:, :P]]) if cfg else t_new[:, :P]
                cache.limit(model.cond_len + P if o.prefix_attention else None)
                logits = model.decode(x, torch.arange(model.cond_len, model.cond_len + P, device=dev), cache)[:, -1:]
                prefills += 1
            p0 = window_target(logits, first[:, None], cfg, o.cfg_scale, o.cfg_interval, o.temperature, o.top_k,
                               o.top_p)[:, 0]
            _, ur, _, uf = u[:, 0].split([W - 1, 1, W, W - 1], dim=1)
            t_new[:, P] = sample_from_probs(p0, ur[:, 0])
            f, q_new = fresh_drafts(t_new, first, p0, uf, init=o.init, fresh_q=o.fresh_q, grid=grid)
            t_new[:, P + 1:P + W] = f
            tokens[idx] = t_new[idx]
            logp[idx, :P] = 0.0
            logp[idx, P] = p0[idx].gather(-1, t_new[idx, P:P + 1]).squeeze(-1).clamp_min(1e-30).log()
            smap[idx] = it
            qwin[idx] = q_new[idx].to(qwin.dtype)
            n[idx] = P + 1
            counts[idx] = 0

        fill(list(range(S)))
        bar = tqdm(total=N * L, disable=not progress, desc=self.name, unit="tok", leave=False)
        shown = 0
        while True:
            n_host = n.tolist()
            finished = [b for b in range(S) if owner[b] >= 0 and n_host[b] >= L]
            for b in finished:  # collect
                i = owner[b]
                out_tokens[i], out_logp[i] = tokens[b, :L], logp[b, :L]
                out_smap[i] = smap[b, :L] - start[b]
                c = counts[b].tolist()
                passes[i] = c[0] + 1 + int(P > 0)  # its passes and its prefill (and prefix pass)
                checked += c[1]
                accepted += c[2]
                owner[b] = -1
            collected += len(finished)
            refill = finished[: N - next_sample]
            if refill:
                fill(refill)
                n_host = n.tolist()
            done = collected * L + sum(n_host[b] for b in range(S) if owner[b] >= 0)
            bar.update(done - shown)
            shown = done
            if all(ow < 0 for ow in owner):
                break
            it += 1
            # attention reads the filled prefix only: the furthest position an active sample feeds, plus one
            front = max(n_host[b] for b in range(S) if owner[b] >= 0)
            seen = model.cond_len + min(L - 1, front + W - 2) + 1
            cache.limit((cache.bucket(seen) if o.compile else seen) if o.prefix_attention else None)
            ui = u[slot_rows, (it - start).clamp(0, L - 1)]  # each sample's own uniforms for its own step
            tokens, n, qwin, logp, smap, counts = step(model, cache, tokens, n, qwin, logp, smap, counts, ui,
                                                       torch.tensor(it, device=dev), **kw)
        bar.close()
        stats = {"forward_passes": it + prefills, "tokens": N * (L - P), "seconds": time.perf_counter() - t0,
                 "kv_cache_bytes": cache.nbytes, "nll": float(-out_logp[:, P:].mean()),
                 "accepted_per_step": float(((L - P) / passes).mean()),
                 "acceptance_rate": accepted / checked if checked else 0.0,
                 "step_map": out_smap}
        return out_tokens, stats
