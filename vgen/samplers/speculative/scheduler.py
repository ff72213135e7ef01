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
from typing import Callable, Protocol

import torch
from tqdm.auto import tqdm

from vgen.kernels.decode import compiled
from vgen.kernels.kv_cache import static_all, static_buffer
from vgen.kernels.sampling import per_sample_uniforms
from vgen.samplers.speculative.step import SlotState, StepConfig

LAG_DEVICES = ("cuda",)  # device types whose fixed-window runs read the counts one pass behind (module docstring)

class DraftSource(Protocol):
    """Where a run's drafts come from, and the pass that checks them: ``step_fn(model, cache, state, wv, it, W,
    config, rule, **step_args)``, a plain module-level function (one compiled graph serves every run) that updates
    the state in place and returns nothing: it runs :func:`~vgen.samplers.speculative.step.speculative_step` with the source's
    :class:`~vgen.samplers.speculative.step.PassHooks`. A chain source starts from
    :class:`~vgen.samplers.speculative.step.Chain`."""
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
        run = SlotRun(self, cond, seeds, prefix)
        bar = tqdm(total=run.N * run.L, disable=not progress, desc=self.name, unit="tok", leave=False)
        shown = 0
        while True:  # one host read per pass: every slot's position and counts, in one transfer
            host = run.read_ahead() if run.lag else run.read()
            n_host = [row[0] for row in host]
            run.observe(n_host)
            run.refill(run.collect(host, n_host), n_host)
            bar.update(run.done(n_host) - shown)
            shown = run.done(n_host)
            if run.finished() or (max_seconds is not None and time.perf_counter() - run.t0 > max_seconds):
                break
            if not run.lag:
                run.launch(run.plan(n_host))
        bar.close()
        return run.out_tokens, run.stats(n_host, cut=max_seconds is not None)


class SlotRun:
    """One :meth:`Scheduler.run`: the slots' state on the device and the host's bookkeeping (which sample each slot
    holds, when it was prefilled, its width policy, the counts collected)."""

    def __init__(self, scheduler: Scheduler, cond: torch.Tensor, seeds: list[int], prefix: torch.Tensor | None):
        sc = scheduler
        self.model, self.source, self.rule, self.c, self.S = sc.model, sc.source, sc.rule, sc.config, sc.S
        self.compile, self.limit, self.new_policy = sc.compile, sc.prefix_attention, sc.new_policy
        self.cond, self.seeds, self.prefix = cond, seeds, prefix
        self.t0 = time.perf_counter()
        model, source, c, S = self.model, self.source, self.c, self.S
        self.N, self.L, D, dev = cond.shape[0], c.L, c.D, cond.device
        self.dev, self.Wmax = dev, D + 1
        self.step = compiled(source.step_fn, device=dev.type) if self.compile else source.step_fn
        self.cache = source.new_cache(model, 2 * S if c.cfg else S)
        self.P = 0 if prefix is None else prefix.shape[1]
        self.st = SlotState.empty(S, c, model.vocab_size, dev, owner=self)  # read and updated in place by every pass
        static_all(source.step_args)  # the source's tables and per-slot state: read in place too
        self.slot_cond = cond[:1].expand(S, *cond.shape[1:]).clone()
        self.owner = [-1] * S  # sample index held by each slot
        self.out_tokens = torch.zeros((self.N, self.L), dtype=torch.long, device=dev)
        self.out_smap = torch.zeros((self.N, self.L), dtype=torch.long, device=dev)
        self.out_logp = torch.zeros((self.N, self.L), dtype=torch.float32, device=dev)
        self.passes = [0.0] * self.N  # each sample's forward passes (host side)
        self.policies = [None] * S  # each slot's own width policy (from its own sample's passes only)
        self.widths = [self.Wmax] * S
        self.before = None  # each slot's decided count before the last pass (width policies)
        self.checked = self.accepted = self.prefills = self.collected = self.width_sum = self.width_n = 0
        self.collected_ids = []  # the samples collected, in order
        self.next_sample, self.it = 0, 0
        self.fill(list(range(S)))
        # each slot's width (fixed window: Wmax throughout; else uploaded into it before each pass) and the pass
        # counter, which the step advances: static addresses like the state
        self.wv = static_buffer(self, "slot_state.wv", (S,), torch.long, dev, fill=self.Wmax)
        self.it_dev = static_buffer(self, "slot_state.it", (), torch.long, dev)
        self.lag = dev.type in LAG_DEVICES and self.new_policy is None
        if self.lag:  # positions are known one pass late, so every pass reads the whole cache (launch)
            cuda = dev.type == "cuda"
            self.counts_host = torch.empty((S, 4), dtype=torch.long, pin_memory=cuda)
            self.copied = torch.cuda.Event() if cuda else None

    def fill(self, slots: list[int]) -> None:
        """Prefill the next samples into ``slots`` (one prefill pass over every row: the other rows recompute their
        own condition's keys and values, unchanged)."""
        model, source, c, S, L, P, D, dev = self.model, self.source, self.c, self.S, self.L, self.P, self.c.D, self.dev
        tokens, n, qwin, logp, smap, counts, u, start = self.st
        idx = torch.tensor(slots, device=dev)
        start[idx] = self.it
        for b in slots:
            i = self.next_sample
            self.owner[b], self.policies[b] = i, None
            self.slot_cond[b] = self.cond[i]
            u[b] = per_sample_uniforms([self.seeds[i]], (L, c.uniform_width), dev, stream=1)[0]
            source.fill(b, self.seeds[i])
            self.next_sample += 1
        cond_in = torch.cat([self.slot_cond, model.null_cond(self.slot_cond)]) if c.cfg else self.slot_cond
        first = torch.full((S,), P, dtype=torch.long, device=dev)  # the first token to draw
        self.cache.limit(model.cond_len if self.limit else None)
        logits, feats = source.prefill(model, cond_in, self.cache)
        self.prefills += 1
        t_new = tokens.clone()
        if P:  # feed the given tokens in one more pass (every row: the others recompute their own)
            for b in slots:
                t_new[b, :P] = self.prefix[self.owner[b]]
            x = torch.cat([t_new[:, :P], t_new[:, :P]]) if c.cfg else t_new[:, :P]
            self.cache.limit(model.cond_len + P if self.limit else None)
            logits, more = source.feed(model, x, torch.arange(model.cond_len, model.cond_len + P, device=dev),
                                       self.cache)
            logits = logits[:, -1:]
            feats = None if feats is None else torch.cat([feats, more], 1)
            self.prefills += 1
        p0 = c.target(logits, first[:, None])[:, 0]
        _, ur, _, uf, _ = c.uniforms(u[:, 0])
        t_new[:, P] = source.first_token(p0, ur[:, 0], P)
        refilled = torch.zeros(S, dtype=torch.bool, device=dev)
        refilled[idx] = True
        f, q_new = source.first_drafts(model, t_new, first, p0, uf, feats, refilled)
        t_new[:, P + 1:P + 1 + D] = f
        tokens[idx] = t_new[idx]
        logp[idx, :P] = 0.0
        logp[idx, P] = p0[idx].gather(-1, t_new[idx, P:P + 1]).squeeze(-1).clamp_min(1e-30).log()
        smap[idx] = self.it
        qwin[idx] = q_new[idx].to(qwin.dtype)
        n[idx] = P + 1
        counts[idx] = 0

    def active(self) -> int:
        return sum(ow >= 0 for ow in self.owner)

    def launch(self, W: int) -> None:
        """Queue the next pass over every slot at width W (it advances the state and the device's pass counter in
        place)."""
        self.it += 1
        if self.lag:
            self.cache.limit(None)  # (a refill's prefill limited it)
        self.step(self.model, self.cache, self.st, self.wv, self.it_dev, W, self.c, self.rule, **self.source.step_args)

    def read(self) -> list[list[int]]:
        """Every slot's decided count and running counts, read now."""
        return torch.cat([self.st.n[:, None], self.st.counts], 1).tolist()

    def read_ahead(self) -> list[list[int]]:
        """The lagged read: this state's counts leave first, then the next pass is queued, then the host waits."""
        self.counts_host.copy_(torch.cat([self.st.n[:, None], self.st.counts], 1), non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        active = self.active()
        if active:
            self.launch(self.Wmax)
            self.width_sum, self.width_n = self.width_sum + self.Wmax * active, self.width_n + active
        if self.copied is not None:
            self.copied.synchronize()
        return self.counts_host.tolist()

    def observe(self, n_host: list[int]) -> None:
        """What each sample's last pass accepted, for its width policy."""
        if self.new_policy is None or self.before is None:
            return
        for b in range(self.S):
            if self.owner[b] >= 0 and self.before[b] < n_host[b] < self.L:
                k = n_host[b] - self.before[b] - 1
                self.policies[b].observe(k, min(k + 1, self.widths[b] - 1))

    def collect(self, host: list[list[int]], n_host: list[int]) -> list[int]:
        """Take out the finished samples (their tokens, log-probabilities, step maps and counts); their slots."""
        finished = [b for b in range(self.S) if self.owner[b] >= 0 and n_host[b] >= self.L]
        st, L, P = self.st, self.L, self.P
        for b in finished:
            i = self.owner[b]
            self.out_tokens[i], self.out_logp[i] = st.tokens[b, :L], st.logp[b, :L]
            self.out_smap[i] = st.smap[b, :L] - st.start[b]
            self.collected_ids.append(i)
            cb = host[b][1:]
            self.passes[i] = cb[0] + 1 + int(P > 0)  # its passes and its prefill (and prefix pass)
            self.checked += cb[1]
            self.accepted += cb[2]
            self.owner[b] = -1
        self.collected += len(finished)
        return finished

    def refill(self, finished: list[int], n_host: list[int]) -> None:
        """The next samples into the freed slots (fill sets each one's position to P + 1: known without a read)."""
        refill = finished[: self.N - self.next_sample]
        if refill:
            self.fill(refill)
            for b in refill:
                n_host[b] = self.P + 1

    def done(self, n_host: list[int]) -> int:
        """Tokens decided so far (for progress)."""
        return self.collected * self.L + sum(n_host[b] for b in range(self.S) if self.owner[b] >= 0)

    def finished(self) -> bool:
        return all(ow < 0 for ow in self.owner)

    def plan(self, n_host: list[int]) -> int:
        """The next pass's width W (each slot's own, with width policies), and how much of the cache it reads."""
        L, S = self.L, self.S
        # attention reads the filled prefix only: the furthest position an active sample feeds, plus one
        front = max(n_host[b] for b in range(S) if self.owner[b] >= 0)
        if self.new_policy is not None:
            for b in range(S):
                if self.owner[b] >= 0:
                    if self.policies[b] is None:  # a new sample in this slot
                        self.policies[b] = self.new_policy()
                    self.widths[b] = self.policies[b].width(L - n_host[b])
            self.before = list(n_host)
        act = [self.widths[b] for b in range(S) if self.owner[b] >= 0 and n_host[b] < L]
        W = max(act)
        self.width_sum, self.width_n = self.width_sum + sum(act), self.width_n + len(act)
        seen = self.model.cond_len + min(L - 1, front + W - 2) + 1
        self.cache.limit((self.cache.bucket(seen) if self.compile else seen) if self.limit else None)
        if self.new_policy is not None:  # fixed window: wv stays all Wmax; else an upload into its buffer
            self.wv.copy_(torch.as_tensor(self.widths).clamp_max(W), non_blocking=True)
        return W

    def stats(self, n_host: list[int], cut: bool) -> dict:
        """The run's stats; ``cut``: stopped early (the unfinished samples' decided tokens count in the
        histogram)."""
        L, P, N, Wmax = self.L, self.P, self.N, self.Wmax
        stats = {"forward_passes": self.it + self.prefills, "tokens": N * (L - P),
                 "seconds": time.perf_counter() - self.t0, "kv_cache_bytes": self.cache.nbytes,
                 "nll": float(-self.out_logp[:, P:].mean()),
                 "accepted_per_step": float(((L - P) / torch.tensor(self.passes, dtype=torch.float64)).mean()),
                 "acceptance_rate": self.accepted / self.checked if self.checked else 0.0,
                 "mean_window": self.width_sum / max(self.width_n, 1), "step_map": self.out_smap,
                 "pass_histogram": pass_histogram(self.out_smap[self.collected_ids] if cut else self.out_smap, Wmax)}
        if cut:
            for b in range(self.S):
                if self.owner[b] >= 0:
                    part = pass_histogram((self.st.smap[b, :n_host[b]] - self.st.start[b])[None], Wmax)
                    stats["pass_histogram"] = [x + y for x, y in zip(stats["pass_histogram"], part)]
        return stats
