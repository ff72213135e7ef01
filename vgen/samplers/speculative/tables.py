"""The tables ``window=auto`` keeps on disk under ``$VGEN_CACHE``, and the measurements that fill them: what a pass
costs on this machine (:func:`pass_costs`), how many tokens a pass decides on this model (:func:`pass_tokens`), both
keyed by what they depend on (:func:`width_table`; a model's weights by :func:`fingerprint`). The rules that read
them are in :mod:`~vgen.samplers.speculative.widths` and :mod:`~vgen.samplers.speculative.prior`.
"""
from __future__ import annotations

import time

import torch

from vgen.kernels.quant import Int4Linear, Int8Linear
from vgen.samplers.base import example_cond
from vgen.samplers.speculative.step import SlotState, StepConfig


def width_table(file: str, ident: list):
    """A per-width table cached in ``$VGEN_CACHE/<file>`` under the hash of ``ident``: (path, the whole file, this
    table's key, its known {width: value}); a width is an int, or a sampler's other timed candidate's name (pac's
    ``'2x1'`` tree)."""
    import hashlib
    import json

    from vgen.io import cache_dir
    name = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = cache_dir() / file
    try:  # a cache never breaks a run: unreadable, foreign or damaged entries are ignored (and rewritten atomically)
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if not isinstance(table, dict):
        table = {}
    entry = table.get(name)
    try:
        known = {int(w) if w.isdigit() else w: v for w, v in entry.items()} if isinstance(entry, dict) else {}
    except (TypeError, ValueError):
        known = {}
    return path, table, name, known


QUANTIZED = (Int8Linear, Int4Linear)


def fingerprint(model, values: int = 64) -> str:
    """A digest of a model's weights cheap enough for every call: each parameter's name, shape and dtype and
    ``values`` of its entries at a fixed stride. Tables that depend on the weights (acceptance, timed runs) are keyed by
    it, so a model retrained in the same architecture gets its own (the architecture alone named the entry before),
    and so does each quantization of a model (its int8 / int4 layers' codes)."""
    import hashlib
    h = hashlib.sha256()
    with torch.no_grad():
        for n, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            step = max(1, flat.numel() // values)
            h.update(f"{n}{tuple(p.shape)}{p.dtype}".encode())
            h.update(flat[::step][:values].float().cpu().numpy().tobytes())
        for n, m in model.named_modules():  # quantized layers (vgen.kernels.quant) keep their weights as buffers
            if isinstance(m, QUANTIZED):
                flat = m.qweight.reshape(-1)
                h.update(f"{n}{m.extra_repr()}".encode())
                h.update(flat[::max(1, flat.numel() // values)][:values].cpu().numpy().tobytes())
    return h.hexdigest()[:16]


CALIBRATION_SAMPLES = 8  # one batch, classes spread over the model's (i * classes // 8), seeds 2^62 + i


def pass_tokens(sampler, model, widths: list[int], codebook=None) -> dict[int, float]:
    """Tokens per pass of ``sampler`` at each fixed width in ``widths``, from ``CALIBRATION_SAMPLES`` samples of its
    own in one batch (fixed classes and seeds, so every job and call gets the same table): measured once per model
    and settings and cached in ``$VGEN_CACHE/pass_tokens.json``. Acceptance does not depend on timing, so the table
    is the same on every machine (up to float rounding)."""
    import dataclasses

    from vgen.io import atomic_write_json
    o = sampler.options
    settings = {k: v for k, v in dataclasses.asdict(o).items() if k not in ("window", "max_window", "costs")}
    w0 = next(model.parameters())
    path, table, name, known = width_table("pass_tokens.json", [sampler.name, model.config_dict(), str(w0.dtype),
                                                                 settings, CALIBRATION_SAMPLES, "spread",
                                                                 fingerprint(model)])
    missing = [w for w in widths if w not in known]
    if missing:
        k = CALIBRATION_SAMPLES
        cond = example_cond(model, k, w0.device)
        seeds = [2 ** 62 + i for i in range(k)]
        for w in missing:
            with torch.inference_mode():
                _, st = sampler.run_width(w, model, cond, seeds, k, codebook=codebook)
            known[w] = float(st["accepted_per_step"])
        table[name] = {str(w): t for w, t in sorted(known.items())}
        atomic_write_json(path, table)
    return {w: known[w] for w in widths}


def pass_costs(model, step, config: StepConfig, rule, step_args: dict, widths: list[int], key: tuple,
               batch: int = 1, repeats: int = 7, ar_step=None, new_cache=None, fill=None) -> dict[int, float]:
    """Seconds per pass of ``step`` (a draft source's step function, compiled or not, with its ``step_args`` and
    the run's ``config`` and ``rule``) at each width for ``batch`` samples, for this model (architecture, dtype,
    device), thread count and settings ``key``: measured once (widths interleaved, median of ``repeats`` after a
    warm-up call, on a half-filled cache) and cached in ``$VGEN_CACHE/pass_costs.json``. A wide pass costs more
    against AR's step at a larger batch (more rows, less per-op overhead to hide them), so the batch is the job's
    (:func:`vgen.samplers.base.job_shape`): every call and rank of one job uses one table and draws the same
    widths. ``ar_step(cache)``: AR's own step on the same cache, timed among the widths as width 0. ``new_cache(rows)``:
    the draft source's cache (default: the model's); ``fill(slot, seed)``: the source's own state for a new sample
    (:meth:`~vgen.samplers.speculative.scheduler.DraftSource.fill`), called for each slot with its index as seed."""
    S = batch
    from vgen.io import atomic_write_json
    w0 = next(model.parameters())
    path, table, name, known = width_table("pass_costs.json", [
        model.config_dict(), str(w0.dtype), w0.device.type, S, torch.get_num_threads(), torch.__version__,
        [str(k) for k in key], config.cfg, config.D])
    if ar_step is not None:
        widths = [0] + list(widths)
    if all(w in known for w in widths):
        return known
    L, dev, V = config.L, w0.device, model.vocab_size
    rows = 2 * S if config.cfg else S
    cache = new_cache(rows) if new_cache is not None else model.new_cache(rows)
    cache.limit(None)
    model.prefill(example_cond(model, rows, dev), cache)
    n = torch.full((S,), L // 2, dtype=torch.long, device=dev)
    state = SlotState.empty(S, config, V, dev, n=n)
    state.qwin.fill_(1.0 / V)
    state.u.copy_(torch.rand(state.u.shape, generator=torch.Generator().manual_seed(0)))
    pristine = [t.clone() for t in state]  # each timed pass starts from this state (the step updates it in place)
    if fill is not None:  # the source's per-sample state (e.g. Gumbel keys) for this measurement's own batch
        for b in range(S):
            fill(b, b)
    it = torch.tensor(0, device=dev)
    seen = model.cond_len + L // 2 + max(widths)
    times = {w: [] for w in widths}
    for r in range(repeats + 1):
        for w in widths:
            cache.limit(cache.bucket(seen))
            for t, t0 in zip(state, pristine):
                t.copy_(t0)
            it.zero_()
            wv = torch.full_like(n, w)
            t0 = time.perf_counter()
            if w == 0:
                ar_step(cache).tolist()
            else:
                step(model, cache, state, wv, it, w, config, rule, **step_args)
                state.n.tolist()
            if r:
                times[w].append(time.perf_counter() - t0)
    costs = {w: sorted(t)[len(t) // 2] for w, t in times.items()}
    table[name] = {**{str(w): c for w, c in known.items()}, **{str(w): c for w, c in costs.items()}}
    atomic_write_json(path, table)
    return {**known, **costs}
