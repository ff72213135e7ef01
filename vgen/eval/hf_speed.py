"""vgen against transformers' own ``generate()`` on Janus and Emu3 shapes with random weights
(``vgen bench +experiment=transformers``).

AR speed depends on a model's shapes, not its weights, so each model is built with transformers' own config classes
at the released shapes (``janus-pro-1b``, ``janus-pro-7b``, ``emu3-gen``: on CUDA) or at scaled copies that keep the
released vocabularies and code books (``janus-cpu``, ``emu3-cpu``: elsewhere), and timed both ways per batch size,
with CFG as users run it:

* transformers: ``generate(generation_mode="image", guidance_scale=5)`` for Janus (batched CFG rows, a static cache);
  ``generate(prefix_allowed_tokens_fn=..., guidance_scale=3, negative_prompt_ids=...)`` for Emu3 (the row ends forced
  by the prefix function, the negative prompt run as a second, unbatched forward per token);
* vgen: ``sample(from_transformers(model), input_ids, "ar", cfg_scale=...)``: one forward per token over the rows
  [prompt; null] on vgen's static cache, the row ends fed in the pass of each row's last code.

Seconds per image (median of ``repeats`` after a warm-up) and the ratio; both draw samples (``do_sample=True``).

Then the speculative samplers on the zoo's trained model in one of these architectures (``hf_zoo_models``:
photos-emu3), where acceptance means something: ``hf_samplers`` x ``hf_batch_sizes``, the card's example prompts in
turn, seeds ``seed + i``, one untimed warm-up round then ``hf_repeats`` rounds over all cells (interleaved, so
machine noise hits them alike): seconds, forward passes, tokens per pass and the ratio to ``ar`` at the same batch.
"""
from __future__ import annotations

import statistics
import time

import torch

from vgen.errors import VGenError

# name -> (family, shape): the released shapes (vgen.models.hf.shapes.RELEASED) and CPU-sized copies
CPU = {"janus-cpu": dict(hidden=512, layers=8, heads=8, kv_heads=8, ffn=1408, vocab=102400, codes=16384,
                         grid=(16, 16)),
       "emu3-cpu": dict(hidden=512, layers=8, heads=8, kv_heads=2, ffn=1408, vocab=184622, codes=32768,
                        grid=(16, 16))}
PROMPT_LEN = 24


def names() -> list[str]:
    from vgen.models.hf.shapes import RELEASED
    return [*RELEASED, *CPU]


def check_zoo(cfg) -> list[tuple[str, str, dict]]:
    """(model, setting, (sampler, options)) of the zoo part, checked: one-line errors before any weights load."""
    from vgen.cards import ZOO_DIR
    from vgen.eval.bench import parse_variant
    from vgen.samplers import list_samplers
    models = [str(m) for m in (cfg.get("hf_zoo_models") or [])]
    for m in models:
        if not (ZOO_DIR / m / "hf_pipeline.json").is_file():
            raise VGenError(f"hf_zoo_models: {m} is not a transformers zoo model (vgen/zoo/<name>/hf_pipeline.json): "
                            "train it with `vgen train recipe=emu3 recipe.install=true`")
    settings = [str(v) for v in (cfg.get("hf_samplers") or ["ar"])]
    out = []
    for v in settings:
        name, opts = parse_variant(v)
        if name not in list_samplers():
            raise VGenError(f"hf_samplers: unknown sampler {name!r}: choose from {', '.join(list_samplers())}")
        if name == "eagle":  # its draft head, before any weights load
            from vgen.hf_pipeline import zoo_card
            for m in models:
                zoo_card(ZOO_DIR / m).drafter_path(str(opts.get("drafter", "")))
        out += [(m, v, (name, opts)) for m in models]
    return out


def check(cfg) -> list[str]:
    """The models this run times (``hf_models`` on CUDA, ``hf_cpu_models`` elsewhere), checked: one-line errors."""
    from vgen import validate
    device = validate.device(cfg.device)
    chosen = [str(s) for s in ((cfg.get("hf_models") or []) if device.type == "cuda" else
                               (cfg.get("hf_cpu_models") or []))]
    grid = cfg.get("hf_grid")
    if grid is not None and (isinstance(grid, bool) or not isinstance(grid, int) or grid < 1):
        raise VGenError(f"hf_grid must be a whole number of tokens per side >= 1 (or null), got {grid!r}")
    from vgen.kernels.quant import check_mode
    for mode in cfg.get("hf_quantize") or []:
        if check_mode(str(mode), int(cfg.get("quantize_group", 32))) is None:
            raise VGenError("hf_quantize lists weight formats to time beside float: int8, int4")
    unknown = [s for s in chosen if s not in names()]
    if unknown:
        raise VGenError(f"unknown transformers shapes {unknown}: choose from {', '.join(names())}")
    shape_samplers(cfg)
    if chosen:
        try:
            import transformers  # noqa: F401
        except ImportError as e:  # pragma: no cover - a dependency
            raise VGenError(f"timing transformers models needs the transformers package: {e}") from e
    return chosen


def shape_samplers(cfg) -> list[tuple[str, str, dict]]:
    """``hf_shape_samplers``, checked before any weights load: (setting, sampler, options) for each sampler run on
    the shapes beside ``ar`` (random weights: no draft head or draft model exists for them)."""
    from vgen.eval.bench import parse_variant
    from vgen.samplers import get_sampler, list_samplers
    out = []
    for v in [str(v) for v in (cfg.get("hf_shape_samplers") or [])]:
        name, opts = parse_variant(v)
        if name not in list_samplers():
            raise VGenError(f"hf_shape_samplers: unknown sampler {name!r}: choose from {', '.join(list_samplers())}")
        if get_sampler(name, **opts).needs_draft:
            raise VGenError(f"hf_shape_samplers: {name} needs a draft head or model, which the random-weight shapes "
                            "do not have; time it on a zoo model (hf_zoo_models) instead")
        out.append((v, name, opts))
    return out


def shape(name: str) -> dict:
    from vgen.models.hf.shapes import RELEASED
    return {**RELEASED, **CPU}[name]


def build(name: str, dtype: torch.dtype, device: torch.device, grid: int | None = None):
    """(transformers model, vgen model, prompt ids (1, PROMPT_LEN), generate kwargs for one image); ``grid``: tokens
    per side instead of the shape's (the released Emu3 grid, 90 x 90, takes minutes per image even on a GPU)."""
    from vgen.models import from_transformers
    from vgen.models.hf import shapes
    s = dict(shape(name))
    if grid:
        s["grid"] = (int(grid), int(grid))
    common = dict(hidden=s["hidden"], layers=s["layers"], heads=s["heads"], kv_heads=s["kv_heads"], ffn=s["ffn"],
                  codes=s["codes"], std=0.02)
    h, w = s["grid"]
    g = torch.Generator().manual_seed(0)
    if name.startswith("janus"):
        with torch.device(device):  # initialised where it runs (a 7B model's float32 init on a GPU takes seconds)
            m = shapes.janus(vocab=s["vocab"], grid=(h, w), **common)
        m = m.to(device=device, dtype=dtype)
        ids = torch.cat([torch.tensor([[shapes.JANUS_BOS]]), torch.randint(10, 1000, (1, PROMPT_LEN - 2), generator=g),
                         torch.tensor([[shapes.JANUS_BOI]])], 1)
        return m, from_transformers(m), ids.to(device), 5.0, dict(generation_mode="image", guidance_scale=5.0)
    text = s["vocab"] - s["codes"]
    with torch.device(device):
        m = shapes.emu3(text=text, **common)
    m = m.to(device=device, dtype=dtype)
    ids = torch.cat([torch.tensor([[0]]), torch.randint(10, 1000, (1, PROMPT_LEN - 4), generator=g),
                     torch.tensor([[7, 9, 6]])], 1)
    neg = torch.cat([torch.tensor([[0]]), torch.randint(10, 1000, (1, 6), generator=g), torch.tensor([[7, 9, 6]])], 1)
    visual = list(range(text, text + s["codes"]))
    kw = dict(max_new_tokens=(w + 1) * h + 3, guidance_scale=3.0, negative_prompt_ids=neg.to(device),
              prefix_allowed_tokens_fn=shapes.emu3_allowed(h, w, ids.shape[1], visual))
    return m, from_transformers(m, height=h, width=w, negative_prompt_ids=neg.to(device)), ids.to(device), 3.0, kw


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_pair(m, model, ids, cfg: float, kw: dict, batch: int, repeats: int, warmup: bool = True) -> dict:
    """Seconds per image of transformers' generate and of vgen's ar at ``batch`` (medians, after a warm-up run
    when ``warmup``)."""
    from vgen.eval.bench import RssPeak
    from vgen.samplers import sample
    device = ids.device
    x = ids.expand(batch, -1).contiguous()
    gen_kw = dict(kw)
    if "negative_prompt_ids" in gen_kw:
        gen_kw["negative_prompt_ids"] = gen_kw["negative_prompt_ids"].expand(batch, -1).contiguous()
    out = {}
    for who, fn in (("transformers", lambda: m.generate(x, attention_mask=torch.ones_like(x), do_sample=True,
                                                        **gen_kw)),
                    ("vgen", lambda: sample(model, x, "ar", seed=0, cfg_scale=cfg))):
        secs = []
        with RssPeak() as peak:
            for r in range(repeats + int(warmup)):
                _sync(device)
                t0 = time.perf_counter()
                fn()
                _sync(device)
                if r >= int(warmup):
                    secs.append(time.perf_counter() - t0)
        out[who] = {"seconds_per_image": statistics.median(secs) / batch, "peak_rss_mb": peak.peak,
                    "peak_cuda_mb": peak.cuda_peak}
    out["speedup"] = out["transformers"]["seconds_per_image"] / out["vgen"]["seconds_per_image"]
    return out


@torch.inference_mode()
def time_vgen(model, ids, cfg: float, batch: int, repeats: int, warmup: bool = True, sampler: str = "ar",
              options: dict | None = None) -> dict:
    """Seconds per image of one vgen sampler (``ar`` unless ``sampler`` / ``options`` say otherwise) at ``batch``,
    the peaks of resident and CUDA memory over its runs, and its forward passes and tokens per pass."""
    from vgen.eval.bench import RssPeak
    from vgen.samplers import sample
    x = ids.expand(batch, -1).contiguous()
    secs, stats = [], {}
    with RssPeak() as peak:
        for r in range(repeats + int(warmup)):
            _sync(ids.device)
            t0 = time.perf_counter()
            _, stats = sample(model, x, sampler, seed=0, cfg_scale=cfg, **(options or {}))
            _sync(ids.device)
            if r >= int(warmup):
                secs.append(time.perf_counter() - t0)
    return {"seconds_per_image": statistics.median(secs) / batch, "peak_rss_mb": peak.peak,
            "peak_cuda_mb": peak.cuda_peak, "forward_passes": stats.get("forward_passes"),
            "tokens_per_pass": stats.get("accepted_per_step")}


def time_samplers(model, ids, cfg: float, batch: int, repeats: int, warmup: bool, settings) -> dict:
    """:func:`time_vgen` of each ``hf_shape_samplers`` setting, keyed by the setting as written; ``window=auto``
    decides as for a large job (its widths timed in the first run: keep ``hf_warmup`` on to leave that out)."""
    from vgen.samplers.speculative.widths import time_any_job
    with time_any_job():
        return {v: time_vgen(model, ids, cfg, batch, repeats, warmup, name, opts) for v, name, opts in settings}


def run(cfg) -> dict:
    from tqdm.auto import tqdm

    from vgen import validate
    from vgen.eval.bench.measuring import free_memory
    from vgen.kernels.quant import weight_bytes
    device = validate.device(cfg.device)
    dtype = validate.dtype(cfg.get("hf_dtype") or ("bfloat16" if device.type == "cuda" else "float32"))
    repeats = max(1, int(cfg.get("hf_repeats") or 1))
    warmup = bool(cfg.get("hf_warmup", True))
    settings = shape_samplers(cfg)
    result: dict = {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "models": {}}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    for name in tqdm(check(cfg), desc="transformers shapes", leave=False):
        grid = cfg.get("hf_grid")
        m, model, ids, cfg_scale, kw = build(name, dtype, device, grid)
        s = {**shape(name), **({"grid": (int(grid), int(grid))} if grid else {})}
        batches = [int(b) for b in (cfg.get("hf_batch_sizes") or [1, 8])]
        entry = result["models"][name] = {
            "params_m": sum(p.numel() for p in m.parameters()) / 1e6, "grid": list(s["grid"]),
            "float_weight_mb": weight_bytes(m) / 2 ** 20,
            "batch": {str(b): time_pair(m, model, ids, cfg_scale, kw, b, repeats, warmup) for b in batches}}
        if settings:  # the other samplers on the float model, beside its ar
            for b in batches:
                entry["batch"][str(b)]["samplers"] = time_samplers(model, ids, cfg_scale, b, repeats, warmup, settings)
        del m, model
        free_memory()
        for mode in cfg.get("hf_quantize") or []:  # the same random weights (seeded), the decoder quantized
            m, model, ids, cfg_scale, kw = build(name, dtype, device, grid)
            full = weight_bytes(m)
            info = model.quantize_weights(str(mode), int(cfg.get("quantize_group", 32)))
            free_memory()  # the float layers just replaced
            row = result["models"][name].setdefault("quantized", {})[str(mode)] = {
                **info, "float_weight_bytes": full, "weight_bytes": weight_bytes(m), "batch": {}}
            for b in batches:
                t = time_vgen(model, ids, cfg_scale, b, repeats, warmup)
                t["speedup_vs_float"] = entry["batch"][str(b)]["vgen"]["seconds_per_image"] / t["seconds_per_image"]
                if settings:
                    t["samplers"] = time_samplers(model, ids, cfg_scale, b, repeats, warmup, settings)
                    for v, e in t["samplers"].items():
                        e["speedup_vs_float"] = (entry["batch"][str(b)]["samplers"][v]["seconds_per_image"]
                                                 / e["seconds_per_image"])
                row["batch"][str(b)] = t
            del m, model
            free_memory()
    return result


GENERATE = "transformers generate"


def generate_emu3(pipe, ids: torch.Tensor) -> torch.Tensor:
    """transformers' own sampling of an Emu3 pipeline (its card's cfg / top-k / temperature, the row ends forced by
    ``prefix_allowed_tokens_fn``, the null prompt as ``negative_prompt_ids``): ids (B, L), -1 = left padding."""
    from vgen.models.hf.shapes import emu3_allowed
    fam = pipe.model.family
    h, w = fam.grid
    vm = pipe.hf.model.vocabulary_mapping
    voc = vm.vocab_map
    mask = ids >= 0
    x = torch.where(mask, ids, fam.pad_id)
    neg = fam.null_prompt(ids[:1]).expand(ids.shape[0], -1).contiguous()
    o = pipe.defaults
    eos = pipe.hf.config.text_config.eos_token_id
    allowed = emu3_allowed(h, w, ids.shape[1], vm.image_tokens, vm.eol_token_id, voc["<|extra_201|>"],
                           voc["<|image end|>"], eos)
    return pipe.hf.generate(x, attention_mask=mask.long(), do_sample=True, max_new_tokens=(w + 1) * h + 3,
                            prefix_allowed_tokens_fn=allowed, guidance_scale=o.get("cfg_scale", 1.0),
                            negative_prompt_ids=neg, top_k=o.get("top_k") or None,
                            temperature=o.get("temperature", 1.0), pad_token_id=fam.pad_id)


@torch.inference_mode()
def run_zoo(cfg) -> dict:
    """Every (zoo model, sampler setting, batch size), interleaved rounds: median seconds and the sampler's stats."""
    from tqdm.auto import tqdm

    from vgen import validate
    from vgen.pipeline import load_pipeline
    from vgen.samplers import get_sampler, sample
    from vgen.samplers.speculative.widths import time_any_job
    cells = check_zoo(cfg)
    if not cells:
        return {}
    device = validate.device(cfg.device)
    pipes = {m: load_pipeline(m, device=device) for m in {c[0] for c in cells}}
    n, seed = int(cfg.get("hf_zoo_samples") or 8), int(cfg.get("seed") or 0)
    batches = [int(b) for b in (cfg.get("hf_batch_sizes") or [1, 8])]
    ids = {m: p.encode([p.examples[i % len(p.examples)] for i in range(n)]) for m, p in pipes.items()}
    runs: dict = {(m, v, b): [] for m, v, _ in cells for b in batches}
    models = sorted({c[0] for c in cells})
    if cfg.get("hf_zoo_generate", True):  # transformers' own generate on the same model, prompts and settings
        cells = cells + [(m, GENERATE, (GENERATE, {})) for m in models]
        runs.update({(m, GENERATE, b): [] for m in models for b in batches})
    repeats = max(1, int(cfg.get("hf_repeats") or 1))
    with tqdm(total=len(runs) * (repeats + 1), desc="transformers zoo", leave=False) as bar:
        for r in range(repeats + 1):
            for m, v, (name, opts) in cells:
                for b in batches:
                    p = pipes[m]
                    t0 = time.perf_counter()
                    if name == GENERATE:
                        st = {"forward_passes": None, "accepted_per_step": 1.0}
                        for i in range(0, n, b):
                            generate_emu3(p, ids[m][i:i + b])
                    else:
                        kw = {**p.sampling_defaults(name), **opts}
                        s = get_sampler(name, model=p.model, **kw)
                        with time_any_job():  # window=auto as a large job runs it: timed, not the small-job width
                            _, st = sample(p.model, ids[m], name, seed=seed, batch_size=b,
                                           draft=p.draft_for(s) if s.needs_draft else None, **kw)
                    if r:
                        runs[(m, v, b)].append({"seconds": time.perf_counter() - t0,
                                                "forward_passes": st.get("forward_passes"),
                                                "tokens_per_pass": st.get("accepted_per_step")})
                    bar.update()
    out: dict = {}
    for (m, v, b), rs in runs.items():
        out.setdefault(m, {}).setdefault(str(b), {})[v] = {
            "seconds": statistics.median(x["seconds"] for x in rs), "forward_passes": rs[0]["forward_passes"],
            "tokens_per_pass": rs[0]["tokens_per_pass"], "samples": n}
    for m, by_b in out.items():
        for b, by_v in by_b.items():
            ar = next((e["seconds"] for v, e in by_v.items() if v.split(":")[0] == "ar"), None)
            if GENERATE in by_v:
                by_v[GENERATE]["tokens_per_pass"] = None
            for e in by_v.values():
                e["x_ar"] = ar / e["seconds"] if ar else None
    return out


def markdown_zoo(result: dict) -> str:
    lines = []
    for m, by_b in result.items():
        lines += [f"**{m}** (samplers x batch size: seconds for the run, tokens per pass, x ar)", "",
                  "| sampler | " + " | ".join(f"batch {b}" for b in by_b) + " |", "|---|" + "---|" * len(by_b)]
        settings = list(next(iter(by_b.values())))
        for v in settings:
            lines.append(f"| {v} | " + " | ".join(
                f"{by_b[b][v]['seconds']:.2f} s, "
                + (f"{by_b[b][v]['tokens_per_pass']:.2f} tok/pass, " if by_b[b][v]['tokens_per_pass'] else "")
                + f"{by_b[b][v]['x_ar'] or 0:.2f}x" for b in by_b) + " |")
        lines.append("")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    rows = list(result["models"].items())
    if not rows:
        return ""
    batches = list(rows[0][1]["batch"])
    lines = ["| model (random weights) | grid | " + " | ".join(
        f"batch {b}: transformers / vgen s per image" for b in batches) + " |", "|---|---|" + "---|" * len(batches)]
    lines += [f"| {n} ({e['params_m']:.0f}M) | {e['grid'][0]}x{e['grid'][1]} | " + " | ".join(
        f"{e['batch'][b]['transformers']['seconds_per_image']:.2f} / {e['batch'][b]['vgen']['seconds_per_image']:.2f}"
        f" ({e['batch'][b]['speedup']:.2f}x)" for b in batches) + " |" for n, e in rows]
    quant = [(n, mode, q) for n, e in rows for mode, q in (e.get("quantized") or {}).items()]
    if quant:
        lines += ["", "| model | weights | weight MB | " + " | ".join(
            f"batch {b}: vgen s per image (x float), peak RSS MB" for b in batches) + " |",
            "|---|---|---|" + "---|" * len(batches)]
        for n, e in rows:
            lines.append(f"| {n} | float | {e.get('float_weight_mb', 0) or 0:.0f} | " + " | ".join(
                f"{e['batch'][b]['vgen']['seconds_per_image']:.2f} (1.00x), {e['batch'][b]['vgen']['peak_rss_mb']:.0f}"
                for b in batches) + " |")
        lines += [f"| {n} | {mode} | {q['weight_bytes'] / 2 ** 20:.0f} | " + " | ".join(
            f"{q['batch'][b]['seconds_per_image']:.2f} ({q['batch'][b]['speedup_vs_float']:.2f}x), "
            f"{q['batch'][b]['peak_rss_mb']:.0f}" for b in batches if b in q["batch"]) + " |" for n, mode, q in quant]
    more = markdown_samplers(result)
    return "\n".join(lines + (["", more] if more else []))


def markdown_samplers(result: dict) -> str:
    """The ``hf_shape_samplers`` table: each shape, weight format and sampler (``ar`` first) per batch size: seconds
    per image (x the float model's same sampler), tokens per pass, peak memory (CUDA's allocator on a GPU, else the
    process's resident set). Empty when the run had none."""
    rows = []
    for n, e in result["models"].items():
        formats = [("float", e["batch"], False)] + [(mode, q["batch"], True) for mode, q in
                                                     (e.get("quantized") or {}).items()]
        for fmt, by_b, quantized in formats:
            if not any("samplers" in c for c in by_b.values()):
                continue
            settings = ["ar", *next(c["samplers"] for c in by_b.values() if "samplers" in c)]
            rows += [(n, fmt, v, {b: (c if quantized else c["vgen"]) if v == "ar" else c["samplers"].get(v)
                                  for b, c in by_b.items()}) for v in settings]
    if not rows:
        return ""
    batches = list(rows[0][3])
    lines = ["| model (random weights) | weights | sampler | " + " | ".join(
        f"batch {b}: s per image (x float), tokens per pass, peak MB" for b in batches) + " |",
        "|---|---|---|" + "---|" * len(batches)]
    for n, fmt, v, by_b in rows:
        out = []
        for b in batches:
            c = by_b.get(b)
            if not c:
                out.append("")
                continue
            peak = c.get("peak_cuda_mb") if c.get("peak_cuda_mb") is not None else c.get("peak_rss_mb")
            x = c.get("speedup_vs_float")
            out.append(f"{c['seconds_per_image']:.2f}" + (f" ({x:.2f}x)" if x else "")
                       + f", {c.get('tokens_per_pass') or 1.0:.2f}, {peak or 0:.0f}")
        lines.append(f"| {n} | {fmt} | `{v}` | " + " | ".join(out) + " |")
    return "\n".join(lines)
