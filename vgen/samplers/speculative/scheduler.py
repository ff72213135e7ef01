"""The slot scheduler every speculative sampler runs on: continuous batching, given prefixes, progress and step
maps around one draft source's passes.

``slots`` samples decode at once, each at its own position (ragged batches: no sample waits for another). A pass
feeds every slot's last decided token and its drafts, verifies them (the source's step function, with the run's
:class:`AcceptanceRule <vgen.samplers.speculative.rules.AcceptanceRule>`), and moves each slot's decided count; when a
sample finishes, the next one is prefilled into its slot, so a long job never waits for the slowest sample of a
batch. The KV cache needs no rollback: slots are positions, and the next pass overwrites the slots past the
decided prefix.

State per slot b (:class:`SlotState`): tokens[b, :n[b]] decided, tokens[b, n[b]:n[b]+D] drafts with draft
distributions qwin[b] (D, V), the log-probability and the pass that decided every token, and running counts
(passes, drafts checked, drafts accepted). Slot b passes at its own width wv[b] <= W: it checks its first
wv[b] - 1 drafts and drafts anew after them, exactly as a pass of width wv[b] would.

The host reads every slot's decided count once per pass (one transfer) to collect, refill and end. On a GPU
(:data:`LAG_DEVICES`) with a fixed window that read lags one pass: the counts after pass k are copied out
asynchronously, pass k + 1 is queued, and only then does the host wait for the copy, so the GPU computes while the
host does its bookkeeping instead of idling at every pass. A finished slot's extra pass is a no-op (it decides,
checks and writes nothing below L), each sample's uniforms are indexed by its own passes, so the tokens, their
log-probabilities and step maps are the same bytes as without the lag; a slot is refilled and the run ends one
pass later (that pass counts in ``forward_passes``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

import torch
from tqdm.auto import tqdm

from vgen.kernels.decode import compiled
from vgen.kernels.sampling import per_sample_uniforms
from vgen.kernels.verify import window_target

LAG_DEVICES = ("cuda",)  # device types whose fixed-window runs read the counts one pass behind (module docstring)

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

    @property
    def sampling(self) -> dict:
        return dict(cfg_scale=self.cfg_scale, cfg_interval=self.cfg_interval, temperature=self.temperature,
                    top_k=self.top_k, top_p=self.top_p)

    def target(self, logits: torch.Tensor, token_index: torch.Tensor) -> torch.Tensor:
        """Logits (rows, W, V) -> the target distribution (B, W, V) of image tokens ``token_index`` (B, W)."""
        return window_target(logits, token_index, self.cfg, **self.sampling)

    def uniforms(self, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A pass's uniforms (B, 3D + 2) -> (acceptance (B, D), residual (B, 1), Jacobi redraws (B, D + 1), new
        drafts (B, D))."""
        D = self.D
        return u.split([D, 1, D + 1, D], dim=1)


class SlotState(NamedTuple):
    tokens: torch.Tensor   # (S, buffer) long: decided tokens, then drafts
    n: torch.Tensor        # (S,) long: tokens decided (L: finished or empty)
    qwin: torch.Tensor     # (S, D, V): the drafts' distributions
    logp: torch.Tensor     # (S, buffer): log-probability of each decided token under the target
    smap: torch.Tensor     # (S, buffer) long: the pass that decided each token
    counts: torch.Tensor   # (S, 3) long: passes, drafts checked, drafts accepted


class DraftSource(Protocol):
    """Where a run's drafts come from, and the pass that checks them: ``step_fn(model, cache, state, wv, u, it, W,
    config, rule, **step_args) -> state`` (a plain module-level function, so one compiled graph serves every run)."""
    step_fn: Callable
    step_args: dict

    def new_cache(self, model, rows: int): ...

    def prefill(self, model, cond_in: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The condition's pass: (logits (rows, 1, V) for the first token, hidden states or None)."""

    def feed(self, model, x: torch.Tensor, pos: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A given prefix's pass: (logits (rows, P, V), hidden states or None)."""

    def fill(self, slot: int, seed: int) -> None:
        """A new sample with ``seed`` enters ``slot``."""

    def first_token(self, p0: torch.Tensor, u: torch.Tensor, index: int) -> torch.Tensor:
        """Token ``index`` (the first one drawn) of every slot from its distribution p0 (S, V), uniforms u (S,)."""

    def first_drafts(self, model, tokens, first, p0, uf, feats, refilled) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts (S, D) and their distributions (S, D, V) after a prefill: ``tokens`` hold the first drawn token
        at ``first`` (S,), p0 (S, V) its distribution, uf (S, D) uniforms; ``feats``: the prefill passes' hidden
        states; only the ``refilled`` rows are kept."""


def pass_histogram(step_map: torch.Tensor, width: int) -> list[int]:
    """How many passes decided 1, 2, ..., ``width`` tokens, from a step map (N, T: the pass that decided each of a
    sample's first T tokens, counted from the sample's prefill). The prefill's token and each sample's last pass
    (cut short by the end of the image) are left out."""
    if step_map.numel() == 0:
        return [0] * width
    sm = step_map.long()
    sm = sm - sm[:, :1]  # the prefill's pass: 0 (tokens are decided left to right: passes never decrease)
    per_pass = torch.zeros(sm.shape[0], int(sm.max()) + 1, dtype=torch.long, device=sm.device).scatter_add_(
        1, sm, torch.ones_like(sm))
    per_pass[:, 0] = 0
    per_pass.scatter_(1, sm[:, -1:], 0)
    return torch.bincount(per_pass.flatten(), minlength=width + 1)[1:width + 1].tolist()


def advance(n, k, wv, L: int, counts):
    """After a pass that accepted k drafts per sample: the new decided counts (k + 1 tokens, never past L, none for
    finished samples) and the running (passes, drafts checked, drafts accepted) per sample."""
    left = L - n  # n never passes L: a finished (or empty) slot has none left, so it emits, checks, accepts nothing
    emitted = torch.minimum(k + 1, left)
    checked = torch.minimum(emitted, wv - 1)
    accepted = torch.minimum(k, left)
    return n + emitted, counts + torch.stack([(left > 0).long(), checked, accepted], 1)


class Scheduler:
    """Runs ``source``'s passes over ``slots`` slots for a job of samples (:meth:`run`). ``width``: None for every
    slot at the widest width (``config.D + 1``), else a factory of per-sample width policies (``policy.width(left)``
    before each pass, ``policy.observe(accepted, checked)`` after it: window=auto with given pass costs)."""

    def __init__(self, model, source: DraftSource, rule, config: StepConfig, *, slots: int, compile: bool,
                 prefix_attention: bool, name: str, width: Callable | None = None):
        self.model, self.source, self.rule, self.config = model, source, rule, config
        self.S, self.compile, self.prefix_attention, self.name, self.new_policy = (slots, compile, prefix_attention,
                                                                                 name, width)

    def run(self, cond: torch.Tensor, seeds: list[int], progress: bool, prefix: torch.Tensor | None = None,
            max_seconds: float | None = None):
        """Tokens (N, L) and stats for conditions ``cond`` (N, ...) and ``seeds``; ``prefix`` (N, P): given first
        tokens (each sample starts at token P). ``max_seconds``: stop at the first pass after that many seconds (a
        measurement of tokens per pass: the unfinished samples' decided tokens count in ``pass_histogram``, their
        tokens are not kept)."""
        model, source, c, S = self.model, self.source, self.config, self.S
        t0 = time.perf_counter()
        N, L, D, dev = cond.shape[0], c.L, c.D, cond.device
        Wmax = D + 1
        step = compiled(source.step_fn, device=dev.type) if self.compile else source.step_fn
        cache = source.new_cache(model, 2 * S if c.cfg else S)
        limit = self.prefix_attention

        P = 0 if prefix is None else prefix.shape[1]
        B = L + 2 * Wmax  # buffer length: drafts may run past the end of the image
        st = SlotState(torch.zeros((S, B), dtype=torch.long, device=dev), torch.full((S,), L, dtype=torch.long,
                       device=dev), torch.zeros((S, D, model.vocab_size), device=dev),
                       torch.zeros((S, B), dtype=torch.float32, device=dev),
                       torch.zeros((S, B), dtype=torch.long, device=dev), torch.zeros((S, 3), dtype=torch.long,
                                                                                    device=dev))
        u = torch.zeros((S, L, 3 * D + 2), device=dev)
        slot_cond = cond[:1].expand(S, *cond.shape[1:]).clone()
        owner = [-1] * S  # sample index held by each slot
        start = torch.zeros(S, dtype=torch.long, device=dev)  # iteration at which each slot was prefilled
        slot_rows = torch.arange(S, device=dev)
        out_tokens = torch.zeros((N, L), dtype=torch.long, device=dev)
        out_smap = torch.zeros((N, L), dtype=torch.long, device=dev)
        out_logp = torch.zeros((N, L), dtype=torch.float32, device=dev)
        passes = [0.0] * N  # each sample's forward passes (host side)
        policies = [None] * S  # each slot's own width policy (from its own sample's passes only)
        widths = [Wmax] * S
        checked = accepted = prefills = collected = 0
        collected_ids = []  # the samples collected, in order
        next_sample, it = 0, 0

        def fill(slots: list[int]) -> SlotState:
            """Prefill the next samples into ``slots`` (one prefill pass over every row: the other rows recompute
            their own condition's keys and values, unchanged)."""
            nonlocal next_sample, prefills
            tokens, n, qwin, logp, smap, counts = st
            idx = torch.tensor(slots, device=dev)
            start[idx] = it
            for b in slots:
                owner[b], policies[b] = next_sample, None
                slot_cond[b] = cond[next_sample]
                u[b] = per_sample_uniforms([seeds[next_sample]], (L, 3 * D + 2), dev, stream=1)[0]
                source.fill(b, seeds[next_sample])
                next_sample += 1
            cond_in = torch.cat([slot_cond, model.null_cond(slot_cond)]) if c.cfg else slot_cond
            first = torch.full((S,), P, dtype=torch.long, device=dev)  # the first token to draw
            cache.limit(model.cond_len if limit else None)
            logits, feats = source.prefill(model, cond_in, cache)
            prefills += 1
            t_new = tokens.clone()
            if P:  # feed the given tokens in one more pass (every row: the others recompute their own)
                for b in slots:
                    t_new[b, :P] = prefix[owner[b]]
                x = torch.cat([t_new[:, :P], t_new[:, :P]]) if c.cfg else t_new[:, :P]
                cache.limit(model.cond_len + P if limit else None)
                logits, more = source.feed(model, x, torch.arange(model.cond_len, model.cond_len + P, device=dev),
                                           cache)
                logits = logits[:, -1:]
                feats = None if feats is None else torch.cat([feats, more], 1)
                prefills += 1
            p0 = c.target(logits, first[:, None])[:, 0]
            _, ur, _, uf = c.uniforms(u[:, 0])
            t_new[:, P] = source.first_token(p0, ur[:, 0], P)
            refilled = torch.zeros(S, dtype=torch.bool, device=dev)
            refilled[idx] = True
            f, q_new = source.first_drafts(model, t_new, first, p0, uf, feats, refilled)
            t_new[:, P + 1:P + 1 + D] = f
            tokens[idx] = t_new[idx]
            logp[idx, :P] = 0.0
            logp[idx, P] = p0[idx].gather(-1, t_new[idx, P:P + 1]).squeeze(-1).clamp_min(1e-30).log()
            smap[idx] = it
            qwin[idx] = q_new[idx].to(qwin.dtype)
            n[idx] = P + 1
            counts[idx] = 0
            return SlotState(tokens, n, qwin, logp, smap, counts)

        st = fill(list(range(S)))
        bar = tqdm(total=N * L, disable=not progress, desc=self.name, unit="tok", leave=False)
        shown, before, width_sum, width_n = 0, None, 0, 0
        wv = torch.full((S,), Wmax, dtype=torch.long, device=dev)
        it_dev = torch.zeros((), dtype=torch.long, device=dev)  # the iteration, counted on the device
        lag = dev.type in LAG_DEVICES and self.new_policy is None
        if lag:
            cuda = dev.type == "cuda"
            counts_host = torch.empty((S, 4), dtype=torch.long, pin_memory=cuda)
            copied = torch.cuda.Event() if cuda else None
            # positions are known one pass late, so every pass reads the whole cache (launch)

        def launch(st: SlotState, W: int) -> SlotState:
            """Queue the next pass over every slot at width W."""
            nonlocal it
            it += 1
            if lag:
                cache.limit(None)  # (a refill's prefill limited it)
            ui = u[slot_rows, (it - start).clamp(0, L - 1)]  # each sample's own uniforms for its own step
            it_dev.add_(1)
            return step(model, cache, st, wv, ui, it_dev, W, c, self.rule, **source.step_args)

        while True:  # one host read per pass: every slot's position and counts, in one transfer
            if lag:  # the counts of this state leave first, then the next pass is queued, then the host waits
                counts_host.copy_(torch.cat([st.n[:, None], st.counts], 1), non_blocking=True)
                if copied is not None:
                    copied.record()
                if any(ow >= 0 for ow in owner):
                    st = launch(st, Wmax)
                    active = sum(ow >= 0 for ow in owner)
                    width_sum, width_n = width_sum + Wmax * active, width_n + active
                if copied is not None:
                    copied.synchronize()
                host = counts_host.tolist()
            else:
                host = torch.cat([st.n[:, None], st.counts], 1).tolist()
            n_host = [row[0] for row in host]
            if self.new_policy is not None and before is not None:  # what each sample's last pass accepted
                for b in range(S):
                    if owner[b] >= 0 and before[b] < n_host[b] < L:
                        k = n_host[b] - before[b] - 1
                        policies[b].observe(k, min(k + 1, widths[b] - 1))
            finished = [b for b in range(S) if owner[b] >= 0 and n_host[b] >= L]
            for b in finished:  # collect
                i = owner[b]
                out_tokens[i], out_logp[i] = st.tokens[b, :L], st.logp[b, :L]
                out_smap[i] = st.smap[b, :L] - start[b]
                collected_ids.append(i)
                cb = host[b][1:]
                passes[i] = cb[0] + 1 + int(P > 0)  # its passes and its prefill (and prefix pass)
                checked += cb[1]
                accepted += cb[2]
                owner[b] = -1
            collected += len(finished)
            refill = finished[: N - next_sample]
            if refill:
                st = fill(refill)
                for b in refill:  # fill sets every refilled slot's position to P + 1: known without a read
                    n_host[b] = P + 1
            done = collected * L + sum(n_host[b] for b in range(S) if owner[b] >= 0)
            bar.update(done - shown)
            shown = done
            if all(ow < 0 for ow in owner) or (max_seconds is not None and time.perf_counter() - t0 > max_seconds):
                break
            if lag:
                continue
            # attention reads the filled prefix only: the furthest position an active sample feeds, plus one
            front = max(n_host[b] for b in range(S) if owner[b] >= 0)
            if self.new_policy is not None:
                for b in range(S):
                    if owner[b] >= 0:
                        if policies[b] is None:  # a new sample in this slot
                            policies[b] = self.new_policy()
                        widths[b] = policies[b].width(L - n_host[b])
                before = list(n_host)
            act = [widths[b] for b in range(S) if owner[b] >= 0 and n_host[b] < L]
            W = max(act)
            width_sum, width_n = width_sum + sum(act), width_n + len(act)
            seen = model.cond_len + min(L - 1, front + W - 2) + 1
            cache.limit((cache.bucket(seen) if self.compile else seen) if limit else None)
            if self.new_policy is not None:  # fixed window: wv stays all Wmax; else an asynchronous upload
                wv = torch.as_tensor(widths).to(dev, non_blocking=True).clamp_max(W)
            st = launch(st, W)
        bar.close()
        stats = {"forward_passes": it + prefills, "tokens": N * (L - P), "seconds": time.perf_counter() - t0,
                 "kv_cache_bytes": cache.nbytes, "nll": float(-out_logp[:, P:].mean()),
                 "accepted_per_step": float(((L - P) / torch.tensor(passes, dtype=torch.float64)).mean()),
                 "acceptance_rate": accepted / checked if checked else 0.0,
                 "mean_window": width_sum / max(width_n, 1), "step_map": out_smap,
                 "pass_histogram": pass_histogram(out_smap[collected_ids] if max_seconds is not None else out_smap, Wmax)}
        if max_seconds is not None:  # cut short: the unfinished samples' decided tokens too
            for b in range(S):
                if owner[b] >= 0:
                    part = pass_histogram((st.smap[b, :n_host[b]] - start[b])[None], Wmax)
                    stats["pass_histogram"] = [x + y for x, y in zip(stats["pass_histogram"], part)]
        return out_tokens, stats
