"""The released LlamaGen GPT shapes, timed with random weights (``vgen bench +experiment=gpu``).

Decode speed depends on a model's shapes, not on its weights, so the released class-conditional GPTs (B, L, XL,
XXL: ../shared/reference.md) are built with random weights at their real sizes (vocabulary 16384, 256 image
tokens, one class token) and measured per shape and dtype:

* ``pass_cost``: one forward pass over w new tokens (w = 1, 2, 4, ... 32) at batch 1 on a half-filled KV cache,
  relative to a pass over one token: the curve every speculative sampler's speed-up rides on (a wide pass is cheap
  where the step is memory-bound, as on a GPU at small batch). Eager (``pass_cost``) and, on CUDA, with each pass
  replayed as one recorded CUDA graph (``pass_cost_graphed``: launches removed, what a compiled sampler's pass
  costs);
* ``shape_quantize`` (int8, int4): each shape and dtype again with its weights quantized (weight-only, activations
  in the dtype; entries ``float32@int8``, ...), the same cells: what fewer bytes per token buy at real sizes;
* ``ar``: milliseconds per token of vgen's ``ar`` sampler (``compile`` as set; compiled, also eager) against the
  official-style eager loop (:func:`vgen.samplers.llamagen_loop.llamagen_generate`) at each batch size of
  ``shape_batches``, with CFG (both halves), the peak memory of each, and the seconds of the first compiled call
  (its warm-up: ``first_call_s``).

``XL-t2i`` is the text-to-image GPT of ``t2i_XL_stage1_256.pt`` (XL's blocks, 120 caption positions of 2048
FLAN-T5-XL features through ``cap_proj``, the same 256 image tokens): its condition is a random caption of
``CAPTION_TOKENS`` valid rows, left-padded with zero rows as the official ``sample_t2i.py`` hands it over, so the
caption mask is applied as in a real run. ``cpu-S-t2i`` is its small counterpart for CPUs.

On a CPU the released shapes take minutes per image, so ``cpu_shapes`` (small ones) run instead: CI exercises the
code, the numbers that matter come from a GPU.
"""
from __future__ import annotations

import statistics
import time

import torch

from vgen.conditions import kind_of
from vgen.errors import VGenError

# name -> (dim, n_layer, n_head): LlamaGen's c2i GPTs, and two small shapes for CPUs
SHAPES: dict[str, tuple[int, int, int]] = {
    "B": (768, 12, 12), "L": (1024, 24, 16), "XL": (1280, 36, 20), "XXL": (1536, 48, 24),
    "cpu-S": (256, 4, 4), "cpu-M": (512, 8, 8),
    "XL-t2i": (1280, 36, 20), "cpu-S-t2i": (256, 4, 4),
}
VOCAB, TOKENS, CLASSES = 16384, 256, 1000
CAPTION_LEN, CAPTION_DIM = 120, 2048  # LlamaGen-T2I: 120 FLAN-T5-XL positions (t2i_XL_stage1_256.pt)
CAPTION_TOKENS = 24  # valid rows of the random caption (a typical prompt's T5 tokens); the rest left padding


def check(cfg) -> list[str]:
    """The shapes this run measures (``shapes`` on CUDA, ``cpu_shapes`` elsewhere), checked: one-line errors."""
    from vgen import validate
    device = validate.device(cfg.device)
    names = [str(s) for s in (cfg.shapes if device.type == "cuda" else cfg.get("cpu_shapes") or [])]
    unknown = [s for s in names if s not in SHAPES]
    if unknown:
        raise VGenError(f"unknown shapes {unknown}: choose from {', '.join(SHAPES)}")
    for d in cfg.get("shape_dtypes") or []:
        validate.dtype(d)
    from vgen.kernels.quant import check_mode
    for q in cfg.get("shape_quantize") or []:
        check_mode(str(q), cfg.get("quantize_group", 32))
    widths = list(cfg.get("pass_widths") or [])
    if not widths or 1 not in widths or any(int(w) < 1 for w in widths):
        raise VGenError(f"pass_widths must list whole numbers >= 1, 1 among them (the reference), got {widths}")
    return names


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_shape(name: str, dtype: torch.dtype, device: torch.device):
    from vgen.models import build
    dim, n_layer, n_head = SHAPES[name]
    torch.manual_seed(0)
    text = name.endswith("-t2i")
    kind = dict(model_type="t2i", cls_token_num=CAPTION_LEN, caption_dim=CAPTION_DIM) if text else {}
    model = build("gpt", dim=dim, n_layer=n_layer, n_head=n_head, vocab_size=VOCAB, num_classes=CLASSES,
                  block_size=TOKENS, **kind)
    torch.nn.init.normal_(model.output.weight, std=0.02)  # the official init zeroes the head: uniform draws
    return model.to(device=device, dtype=dtype).eval()


def conditions(model, batch: int) -> torch.Tensor:
    """``batch`` conditions for ``model``: class ids, or random captions (``CAPTION_TOKENS`` valid rows at the end,
    zero rows before them: left padding, the caption mask the official loop applies)."""
    device = next(model.parameters()).device
    if kind_of(model).has_classes:
        return torch.arange(batch, device=device) % CLASSES
    g = torch.Generator(device="cpu").manual_seed(0)
    caption = torch.zeros(batch, model.cond_len, model.config.caption_dim)
    caption[:, -CAPTION_TOKENS:] = torch.randn(batch, CAPTION_TOKENS, model.config.caption_dim, generator=g) * 0.1
    return caption.to(device=device, dtype=next(model.parameters()).dtype)


@torch.inference_mode()
def pass_cost(model, widths: list[int], repeats: int) -> dict[int, float]:
    """Seconds of one decode pass over w tokens at batch 1 (half-filled cache, widths interleaved, median)."""
    device = next(model.parameters()).device
    cache = model.new_cache(1)
    cache.limit(None)
    model.prefill(conditions(model, 1), cache)
    start = model.cond_len + TOKENS // 2
    times: dict[int, list[float]] = {w: [] for w in widths}
    for r in range(repeats + 1):  # round 0: warm-up
        for w in widths:
            x = torch.zeros((1, w), dtype=torch.long, device=device)
            pos = torch.arange(start, start + w, device=device)
            _sync(device)
            t0 = time.perf_counter()
            model.decode(x, pos, cache)
            _sync(device)
            if r:
                times[w].append(time.perf_counter() - t0)
    return {w: statistics.median(t) for w, t in times.items()}


@torch.inference_mode()
def pass_cost_graphed(model, widths: list[int], repeats: int, replays: int = 20) -> dict[int, float]:
    """CUDA only: :func:`pass_cost` with each width's pass recorded once as a CUDA graph and replayed (seconds per
    replay, mean of ``replays``, median of ``repeats`` rounds): the pass without its kernel launches."""
    device = next(model.parameters()).device
    cache = model.new_cache(1)
    cache.limit(None)
    model.prefill(conditions(model, 1), cache)
    start = model.cond_len + TOKENS // 2
    graphs = {}
    for w in widths:
        x = torch.zeros((1, w), dtype=torch.long, device=device)
        pos = torch.arange(start, start + w, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the capture (cuBLAS workspaces, lazy inits)
            for _ in range(2):
                model.decode(x, pos, cache)
        torch.cuda.current_stream(device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            model.decode(x, pos, cache)
        graphs[w] = g
    times: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(repeats):
        for w, g in graphs.items():
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(replays):
                g.replay()
            _sync(device)
            times[w].append((time.perf_counter() - t0) / replays)
    return {w: statistics.median(t) for w, t in times.items()}


@torch.inference_mode()
def ar_speed(model, batch: int, compile: bool, repeats: int, official: bool = True) -> dict:
    """ms per token of vgen's ar (``compile``; compiled runs also eager, ``vgen_eager``) and of the official-style
    loop at ``batch`` (``official``; a quantized model's cell leaves it out: the official loop runs float weights),
    CFG 4 (both halves: the null class or the null caption), top-k 0; ``first_call_s``: each one's warm-up call (a
    compile)."""
    from vgen.eval.bench import RssPeak
    from vgen.samplers import sample
    from vgen.samplers.llamagen_loop import llamagen_generate
    device = next(model.parameters()).device
    labels = conditions(model, batch)
    runs = [("official", lambda: llamagen_generate(model, labels, cfg_scale=4.0))] if official else []
    runs.append(("vgen", lambda: sample(model, labels, "ar", seed=0, cfg_scale=4.0, compile=compile)))
    if compile:
        runs.append(("vgen_eager", lambda: sample(model, labels, "ar", seed=0, cfg_scale=4.0, compile=False)))
    out = {}
    for name, fn in runs:
        secs = []
        with RssPeak() as peak:
            for r in range(repeats + 1):
                _sync(device)
                t0 = time.perf_counter()
                fn()
                _sync(device)
                secs.append(time.perf_counter() - t0)
        out[name] = {"ms_per_token": 1e3 * statistics.median(secs[1:]) / (batch * TOKENS), "first_call_s": secs[0],
                     "peak_rss_mb": peak.peak, "peak_cuda_mb": peak.cuda_peak}
    if official:
        out["speedup"] = out["official"]["ms_per_token"] / out["vgen"]["ms_per_token"]
    return out


def run(cfg, done=None) -> dict:
    """Every shape x dtype: the pass-cost table and AR against the official loop at each batch size. ``done``, if
    given, is called with the result so far after each shape's pass costs and after each batch size's AR cell (a
    partial result has fewer cells)."""
    from tqdm.auto import tqdm

    from vgen import validate
    device = validate.device(cfg.device)
    names = check(cfg)
    dtypes = [validate.dtype(d) for d in (cfg.get("shape_dtypes") or ["float32"])]
    widths = sorted({int(w) for w in cfg.pass_widths})
    repeats = int(cfg.repeats)
    batches = [int(b) for b in (cfg.get("shape_batches") or cfg.batch_sizes)]
    result: dict = {"device": str(device), "tokens": TOKENS, "vocab": VOCAB, "shapes": {}}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    quantize = [str(q) for q in (cfg.get("shape_quantize") or [])]
    group = int(cfg.get("quantize_group", 32))

    def measure(model, key: str, name: str, official: bool = True) -> None:
        from vgen.kernels.quant import weight_bytes
        secs = pass_cost(model, widths, max(repeats, 3))
        entry = {"params_m": sum(p.numel() for p in model.parameters()) / 1e6,
                 "weight_mb": weight_bytes(model) / 2 ** 20,
                 "pass_seconds": {str(w): s for w, s in secs.items()},
                 "pass_cost": {str(w): s / secs[1] for w, s in secs.items()}}
        if device.type == "cuda":
            g = pass_cost_graphed(model, widths, max(repeats, 3))
            entry["pass_seconds_graphed"] = {str(w): s for w, s in g.items()}
            entry["pass_cost_graphed"] = {str(w): s / g[1] for w, s in g.items()}
        entry["ar"] = {}
        result["shapes"].setdefault(name, {})[key] = entry
        if done is not None:  # the pass costs, before the AR cells (the slow part)
            done(result)
        for b in batches:
            entry["ar"][str(b)] = ar_speed(model, int(b), bool(cfg.compile), repeats, official)
            if done is not None:  # a run stopped at its time limit keeps the cells it measured
                done(result)

    for name in tqdm(names, desc="shapes", leave=False):
        for dtype in dtypes:
            model = build_shape(name, dtype, device)
            key = str(dtype).removeprefix("torch.")
            measure(model, key, name)
            for q in quantize:  # the same weights, weight-only int8 / int4 (vgen.kernels.quant), activations in dtype
                import copy

                from vgen.kernels.quant import quantize_model
                qmodel = copy.deepcopy(model)
                quantize_model(qmodel, q, group)
                measure(qmodel, f"{key}@{q}", name, official=False)
                del qmodel
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return result


def markdown(result: dict) -> str:
    """Two tables: pass cost by width, and AR ms per token (vgen / official) by batch size."""
    rows = [(s, d, e) for s, by in result["shapes"].items() for d, e in by.items()]
    if not rows:
        return ""
    widths = list(rows[0][2]["pass_cost"])
    lines = ["| shape | dtype | " + " | ".join(f"{w} tok" for w in widths) + " |",
             "|---|---|" + "---|" * len(widths)]
    lines += [f"| {s} | {d} | " + " | ".join(f"{e['pass_cost'][w]:.2f}" for w in widths) + " |" for s, d, e in rows]
    lines += [f"| {s} | {d} (CUDA graph) | " + " | ".join(f"{e['pass_cost_graphed'][w]:.2f}" for w in widths) + " |"
              for s, d, e in rows if "pass_cost_graphed" in e]
    batches = list(rows[0][2]["ar"])
    lines += ["", "| shape | dtype | " + " | ".join(f"batch {b}: vgen / official ms per token" for b in batches) + " |",
              "|---|---|" + "---|" * len(batches)]
    def cell(a: dict) -> str:  # a quantized cell has no official loop beside it
        if "official" not in a:
            return f"{a['vgen']['ms_per_token']:.3f} / -"
        return f"{a['vgen']['ms_per_token']:.3f} / {a['official']['ms_per_token']:.3f} ({a['speedup']:.2f}x)"
    lines += [f"| {s} | {d} | " + " | ".join(cell(e["ar"][b]) for b in batches) + " |" for s, d, e in rows]
    if any("vgen_eager" in e["ar"][b] for _, _, e in rows for b in batches):
        lines += ["", "| shape | dtype | " + " | ".join(f"batch {b}: vgen eager ms per token; first compiled call s"
                                                        for b in batches) + " |", "|---|---|" + "---|" * len(batches)]
        lines += [f"| {s} | {d} | " + " | ".join(
            f"{e['ar'][b]['vgen_eager']['ms_per_token']:.3f}; {e['ar'][b]['vgen']['first_call_s']:.1f}"
            if "vgen_eager" in e["ar"][b] else "-" for b in batches) + " |" for s, d, e in rows]
    return "\n".join(lines)
