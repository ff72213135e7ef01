"""``vgen bench``: samplers x batch sizes on pipelines, interleaved, medians of repeated runs.

Every cell is warmed up once (compilation is reported separately, not timed), then all cells are run
``repeats`` times round-robin so machine noise hits them alike; ratios are taken within the run.
"""
from __future__ import annotations

import platform
import resource
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from vgen.errors import VGenError

BASELINE = "llamagen-loop"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cells(models, samplers, batch_sizes, baseline: bool):
    for m in models:
        for b in batch_sizes:
            if baseline:
                yield (m, BASELINE, b)
            for s in samplers:
                yield (m, s, b)


def run_bench(cfg) -> dict:
    from vgen.io import atomic_write_bytes, atomic_write_json
    from vgen.pipeline import Pipeline, read_card
    from vgen.samplers import get_sampler

    opts_all = OmegaConf.to_container(cfg.options, resolve=True) if cfg.options else {}
    for s in cfg.samplers:
        get_sampler(s)  # unknown sampler -> clear error before loading anything
    if cfg.repeats < 1:
        raise VGenError(f"repeats must be >= 1, got {cfg.repeats}")
    for b in cfg.batch_sizes:
        if b < 1:
            raise VGenError(f"batch sizes must be >= 1, got {b}")
    cards = {m: read_card(m) for m in cfg.models}
    pipes = {m: Pipeline.from_pretrained(m, device=cfg.device) for m in cfg.models}
    out = Path(cfg.outdir)
    cells = list(_cells(cfg.models, list(cfg.samplers), list(cfg.batch_sizes), cfg.baseline))

    def run_cell(m, s, b):
        pipe = pipes[m]
        labels = [i % pipe.num_classes for i in range(b)]
        cond = torch.tensor(labels, device=pipe.device)
        if s == BASELINE:
            from vgen.eval.reference_loop import llamagen_generate
            o = {**pipe.sampling_defaults("ar"), **opts_all}
            torch.manual_seed(cfg.seed)
            t0 = time.perf_counter()
            llamagen_generate(pipe.model, cond, cfg_scale=o.get("cfg_scale", 1.0), cfg_interval=o.get("cfg_interval", -1),
                              temperature=o.get("temperature", 1.0), top_k=o.get("top_k", 0), top_p=o.get("top_p", 1.0))
            sec = time.perf_counter() - t0
            from vgen.kernels import KVCache
            c, L = pipe.model.config, pipe.model.seq_len
            rows = 2 * b if o.get("cfg_scale", 1.0) > 1.0 else b
            max_len = c.cls_token_num + L + (-(c.cls_token_num + L)) % 8  # the official loop rounds up to 8
            kv = KVCache.nbytes_for(c.n_layer, rows, c.n_kv_head or c.n_head, max_len, c.head_dim,
                                    pipe.model.tok_embeddings.weight.dtype)
            return {"seconds": sec, "forward_passes": L, "tokens": b * L, "kv_cache_bytes": kv, "accepted_per_step": 1.0}
        sampler = pipe.make_sampler(s, **{**opts_all, "compile": cfg.compile})
        _, st = sampler(pipe.model, cond, [cfg.seed + i for i in range(b)])
        return st

    results = {c: [] for c in cells}
    warm = {}
    from tqdm.auto import tqdm
    with tqdm(total=len(cells) * (cfg.repeats + 1), desc="bench", unit="run") as bar:
        for c in cells:
            t0 = time.perf_counter()
            run_cell(*c)
            warm[c] = time.perf_counter() - t0
            bar.update(1)
        for _ in range(cfg.repeats):
            for c in cells:
                results[c].append(run_cell(*c))
                bar.update(1)

    rows = []
    for (m, s, b), runs in results.items():
        sec = statistics.median(r["seconds"] for r in runs)
        r0 = runs[0]
        rows.append({"model": m, "sampler": s, "batch_size": b, "seconds": sec,
                     "ms_per_token": 1e3 * sec / r0["tokens"], "tokens_per_s": r0["tokens"] / sec,
                     "images_per_s": b / sec, "forward_passes": r0["forward_passes"],
                     "accepted_per_step": r0.get("accepted_per_step", 1.0), "kv_cache_bytes": r0["kv_cache_bytes"],
                     "warmup_seconds": warm[(m, s, b)], "all_seconds": [r["seconds"] for r in runs]})
    for r in rows:
        for ref in (BASELINE, "ar"):
            base = next((x for x in rows if x["model"] == r["model"] and x["batch_size"] == r["batch_size"]
                         and x["sampler"] == ref), None)
            if base is not None:
                r[f"speedup_vs_{ref}"] = base["seconds"] / r["seconds"]
    report = {
        "command": "vgen bench " + " ".join(_overrides()),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "threads": torch.get_num_threads(), "torch": torch.__version__},
        "peak_rss_mb": _peak_rss_mb(),
        "sampling": {m: cards[m].get("sampling", {}) for m in cfg.models},
        "rows": rows,
    }
    table = markdown_table(rows)
    print(table)
    atomic_write_json(out / "bench.json", report)
    atomic_write_bytes(out / "bench.md", (f"`{report['command']}`\n\n" + table + "\n").encode())
    plot = _plot(rows, out / "bench.png")
    if plot:
        print(f"wrote {out / 'bench.json'}, {out / 'bench.md'} and {plot}")
    return report


def _overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig
        return list(HydraConfig.get().overrides.task)
    except Exception:
        return []


def markdown_table(rows: list[dict]) -> str:
    cols = [("model", "model", "{}"), ("sampler", "sampler", "{}"), ("batch", "batch_size", "{}"),
            ("ms/token", "ms_per_token", "{:.2f}"), ("tokens/s", "tokens_per_s", "{:.0f}"),
            ("images/s", "images_per_s", "{:.2f}"), ("fwd passes", "forward_passes", "{}"),
            ("tok/step", "accepted_per_step", "{:.2f}"), ("KV MB", "kv_cache_bytes", "{:.2f}"),
            (f"x {BASELINE}", f"speedup_vs_{BASELINE}", "{:.2f}"), ("x ar", "speedup_vs_ar", "{:.2f}")]
    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for _, key, fmt in cols:
            v = r.get(key)
            if v is None:
                cells.append("")
            elif key == "kv_cache_bytes":
                cells.append(fmt.format(v / 2 ** 20))
            else:
                cells.append(fmt.format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(rows, path: Path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    import io
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"{r['sampler']}\nB={r['batch_size']}" for r in rows]
    ax.bar(range(len(rows)), [r["ms_per_token"] for r in rows], color="tab:blue")
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("ms per token (lower is better)")
    ax.set_title("vgen bench")
    for i, r in enumerate(rows):
        s = r.get(f"speedup_vs_{BASELINE}")
        if s is not None:
            ax.text(i, r["ms_per_token"], f"{s:.1f}x", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    from vgen.io import atomic_write_bytes
    atomic_write_bytes(path, buf.getvalue())
    return path

