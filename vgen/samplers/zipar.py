"""ZipAR (He et al., 2025): training-free parallel decoding of a raster-order model by spatial locality.

Row r + 1 starts once row r has ``window`` tokens decoded, so token (r, c) is decided in pass r * window + c
(pass 0 = the prefill) and several rows advance in one forward pass: an R x W grid takes (R - 1) * window + W
passes (76 for 16 x 16 at window 4, instead of 256). ``window = W`` is plain AR, token for token.

What each token sees: the condition and every token before it in raster order that is already decided -- all
earlier rows except, in the rows above, the columns not reached yet (row r - 1 up to column c + window - 1).
Each pass feeds the tokens decided in the previous pass at their own positions (the model's output there
predicts the next token of that row) and, for a row that starts in this pass, a stand-in at the position of
the unfinished row above's last token: the latest decided token of the row above that one (the official
code's choice; for row 1, the latest token of row 0), whose output predicts the new row's first token. The
stand-in's key and value are seen by its own query only, and the real token overwrites them when it is fed.
Like every cached token, a token's keys and values are computed once, when it is fed, from what is decided then.
Two differences from the official LlamaGen-ZipAR code: its attention reads every cache slot up to the query
(slots not yet written hold zeros, and later tokens of a row also see the stand-in), here only decided tokens;
and it decodes the whole first row before row 1 starts (W - window more passes), here row 1 starts like any other.

It changes the distribution (a token is drawn before the end of the row above it is known): drift is reported
as nll against AR's, FID-photo in docs/lab/benchmarks-log.md. Token i of sample j draws with uniform u[j, i] from seed
j, as in AR, so a sample is the same in any batch. Each row running its own Jacobi window, verified against ZipAR's
conditionals: :mod:`vgen.samplers.pjd`.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec
from vgen.kernels.decode import compiled, token_step
from vgen.kernels.kv_cache import static, static_buffer
from vgen.kernels.sampling import per_sample_uniforms
from vgen.kernels.verify import window_target
from vgen.samplers.base import Sampler, SamplingOptions, option, register_sampler


@dataclass
class RowOptions(SamplingOptions):
    """Options of the samplers that run several rows per pass (``zipar``, ``pjd``): their drift, scored under AR."""
    score: bool = option(False, "after sampling, score the tokens under the plain AR model (one teacher-forced pass, "
                         "timed with the rest): stats then hold nll, comparable with AR's (the drift measure)")

    @staticmethod
    def grid_width(spec: ModelSpec | None) -> int | None:
        """The model's row width (None: no model given yet)."""
        return spec.token_shape[-1] if spec is not None and spec.token_shape else None

    def check_lag(self, name: str, value: int, spec: ModelSpec | None) -> None:
        """``value`` (zipar's ``window``, pjd's ``lag``): tokens of the row above decided before a row starts, 1..the
        width (the width: one row after another, AR's order)."""
        width = self.grid_width(spec)
        if value < 1 or (width is not None and value > width):
            raise VGenError(f"{name} must be in 1..{width or 'the grid width'} (tokens of the row above decided "
                            f"before a row starts; the width is AR's order), got {value}")


@dataclass
class ZipAROptions(RowOptions):
    window: int = option(4, "a row starts once the row above has this many tokens decided (the grid's width = "
                         "plain AR; smaller = fewer passes, more drift)")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        self.check_lag("window", self.window, spec)


def schedule(rows: int, width: int, window: int) -> torch.Tensor:
    """The pass that decides each token, in raster order: (rows * width,)."""
    r = torch.arange(rows)[:, None]
    c = torch.arange(width)[None, :]
    return (r * window + c).flatten()


def plan(rows: int, width: int, window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per pass t >= 1 and query slot: the token index fed (``src``), the raster position it sits at (``at``)
    and the token its output decides (``dst``, -1: none), each (passes - 1, S), padded to one width S by repeats
    of the pass's first query with no token to decide."""
    p = schedule(rows, width, window)
    L, T = rows * width, int(p.max()) + 1
    steps = []
    for t in range(1, T):
        q = []  # (src, at, dst)
        for i in (p == t - 1).nonzero().flatten().tolist():  # fed at their own place; decide the next token
            nxt = i + 1
            q.append((i, i, nxt if nxt < L and p[nxt] == t else -1))
        for i in (p == t).nonzero().flatten().tolist():
            if i % width == 0 and i > 0 and p[i - 1] != t - 1:  # a row starts before the row above has ended
                r = i // width
                above = (r - 2) * width if r >= 2 else 0  # the latest decided token of the row above the slot
                decided = [j for j in range(above, above + width) if p[j] < t]
                q.append((decided[-1], i - 1, i))
        steps.append(q)
    S = max(len(q) for q in steps)
    out = torch.tensor([q + [(q[0][0], q[0][1], -1)] * (S - len(q)) for q in steps])  # (T - 1, S, 3)
    return out[..., 0], out[..., 1], out[..., 2]


def zipar_step(model, cache, tokens, logp, smap, src, at, dst, passes, u, t, cfg: bool, cfg_interval: int,
               cfg_scale: float, temperature: float, top_k: int, top_p: float) -> None:
    """One pass, in place: advance the pass counter ``t`` (a 0-d tensor), feed ``tokens[:, src[t - 1]]`` at raster
    positions ``at[t - 1]`` (S,), under the mask of what is decided before pass ``t``; draw the tokens ``dst[t - 1]``
    (S,; -1 = none) with their uniforms, written into ``tokens``, ``logp`` and ``smap`` where they lie (the plan's
    tables and the buffers are the step's only tensors: static addresses on CUDA, nothing copied in or out)."""
    t.add_(1)
    i = (t - 1).view(1)  # a tensor index (not a scalar: no host read)
    src, at, dst = src[i][0], at[i][0], dst[i][0]
    x = tokens[:, src]
    if cfg:
        x = torch.cat([x, x])
    n = cache.length - model.cond_len  # image slots attention reads
    j = torch.arange(n, device=at.device)
    seen = ((j[None] < at[:, None]) & (passes[None, :n] < t)) | (j[None] == at[:, None])
    mask = torch.cat([seen.new_ones(seen.shape[0], model.cond_len), seen], 1)[None, None]
    logits = model.decode(x, at + model.cond_len, cache, attn_mask=mask)
    ok = dst >= 0
    d = dst.clamp_min(0)
    apply_cfg = True if cfg_interval < 0 else d <= cfg_interval + 1
    tok, lp = token_step(logits, u[:, d], cfg, apply_cfg, cfg_scale, temperature, top_k, top_p)
    idx = d.expand(tokens.shape[0], -1)
    new_t = torch.where(ok, tok, tokens.gather(1, idx))
    new_lp = torch.where(ok, lp, logp.gather(1, idx))
    new_s = torch.where(ok, t, smap.gather(1, idx))
    tokens.scatter_(1, idx, new_t)
    logp.scatter_(1, idx, new_lp)
    smap.scatter_(1, idx, new_s)


def plan_tables(rows: int, width: int, window: int, device: torch.device):
    """(:func:`schedule`, then :func:`plan`'s src, at, dst) on ``device``, once per shape: every run's compiled step
    reads the same tensors (static addresses on CUDA: the recorded graphs replay). Read-only."""
    return tuple(static(x) for x in _plan_tables(rows, width, window, torch.device(device)))


@functools.lru_cache(maxsize=16)
def _plan_tables(rows: int, width: int, window: int, device: torch.device):
    return tuple(x.to(device) for x in (schedule(rows, width, window), *plan(rows, width, window)))


def score_under_ar(model, cache, tokens: torch.Tensor, first_logp: torch.Tensor, o: SamplingOptions) -> float:
    """The plain AR model's nll of ``tokens`` (B, L) (a sampler that changes the distribution reports its drift with
    it): one teacher-forced pass over ``cache``, whose condition slots the sampler's prefill filled; token 0's
    log-probability ``first_logp`` (B, 1) is the prefill's, unchanged."""
    B, L = tokens.shape
    dev, cfg = tokens.device, o.guided
    cache.limit(None)
    cache.write_at(None)
    x = torch.cat([tokens[:, :-1], tokens[:, :-1]]) if cfg else tokens[:, :-1]
    logits = model.decode(x, torch.arange(model.cond_len, model.cond_len + L - 1, device=dev), cache)
    index = torch.arange(1, L, device=dev).expand(B, -1)
    probs = window_target(logits, index, cfg, o.cfg_scale, o.cfg_interval, o.temperature, o.top_k, o.top_p)
    lp = probs.gather(-1, tokens[:, 1:, None]).squeeze(-1).clamp_min(1e-30).log()
    return float(-torch.cat([first_logp, lp], 1).mean())


@register_sampler
class ZipARSampler(Sampler):
    name = "zipar"
    Options = ZipAROptions

    def _sample(self, model, cond, seeds, progress, codebook=None):
        o = self.options
        t0 = time.perf_counter()
        B, L, dev = cond.shape[0], model.seq_len, cond.device
        width = model.token_shape[-1]
        rows = L // width
        passes, src, at, dst = plan_tables(rows, width, o.window, dev)
        cfg = o.guided
        cond_in = torch.cat([cond, model.null_cond(cond)]) if cfg else cond
        cache = model.new_cache(cond_in.shape[0])
        u = per_sample_uniforms(seeds, (L,), dev)  # AR's draws: window = width gives AR's tokens
        step = compiled(zipar_step, device=dev.type) if o.compile else zipar_step
        kw = dict(cfg=cfg, cfg_interval=o.cfg_interval, cfg_scale=o.cfg_scale, temperature=o.temperature,
                  top_k=o.top_k, top_p=o.top_p)

        # what every pass reads and writes in place (static addresses on CUDA, pooled for the next run's replays)
        tokens = static_buffer(cache, "zipar.tokens", (B, L), torch.long, dev)
        logp = static_buffer(cache, "zipar.logp", (B, L), torch.float32, dev)
        smap = static_buffer(cache, "zipar.smap", (B, L), torch.long, dev)
        counter = static_buffer(cache, "zipar.pass", (), torch.long, dev)  # the pass counter the step advances
        u = static_buffer(cache, "zipar.u", (B, L), torch.float32, dev).copy_(u)
        cache.limit(model.cond_len if o.prefix_attention else None)
        tok, lp = token_step(model.prefill(cond_in, cache)[:, None], u[:, :1], cfg, True, o.cfg_scale,
                             o.temperature, o.top_k, o.top_p)
        tokens[:, :1], logp[:, :1] = tok, lp
        last = at.max(1).values.tolist()  # the furthest slot each pass writes: attention reads up to it
        for t in tqdm(range(1, src.shape[0] + 1), disable=not progress, desc="zipar", leave=False):
            seen = model.cond_len + last[t - 1] + 1
            cache.limit((cache.bucket(seen) if o.compile else seen) if o.prefix_attention else None)
            step(model, cache, tokens, logp, smap, src, at, dst, passes, u, counter, **kw)
        n = src.shape[0] + 1
        tokens, smap = tokens.clone(), smap.clone()  # the caller's own (the buffers go to the next run)
        stats = {"forward_passes": n, "tokens": B * L, "kv_cache_bytes": cache.nbytes, "accepted_per_step": L / n,
                 "step_map": smap}
        if o.score:
            stats["nll"] = score_under_ar(model, cache, tokens, logp[:, :1], o)
        stats["seconds"] = time.perf_counter() - t0
        return tokens, stats
