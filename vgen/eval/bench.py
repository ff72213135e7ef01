"""``vgen bench``: samplers x batch sizes on pipelines, interleaved, medians of repeated runs.

Every cell is warmed up once (compilation is reported separately, not timed), then all cells are run
``repeats`` times round-robin so machine noise hits them alike; ratios are taken within the run.
"""
from __future__ import annotations

import os
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


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError):
        return _peak_rss_mb()


class RssPeak:
    """Peak resident memory of the process while the block runs (polled every 5 ms on a thread; Linux /proc,
    else the lifetime peak), and on CUDA the peak of allocated device memory within the block."""

    def __enter__(self):
        import threading
        self.peak, self._stop = _rss_mb(), threading.Event()
        self.cuda_peak = None
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

        def poll():
            while not self._stop.wait(0.005):
                self.peak = max(self.peak, _rss_mb())
        self._t = threading.Thread(target=poll, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _rss_mb())
        if torch.cuda.is_available():
            self.cuda_peak = torch.cuda.max_memory_allocated() / 2 ** 20


def parse_variant(spec: str) -> tuple[str, dict]:
    """``"sjd:window=4,init=vertical"`` -> ("sjd", {"window": 4, "init": "vertical"}). Values are YAML scalars.
    (In a Hydra override, quote entries holding ``:``/``=``: ``samplers='[ar,"sjd:window=4"]'``.)"""
    import yaml
    name, _, rest = str(spec).partition(":")
    opts = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        k, eq, v = item.partition("=")
        if not eq:
            raise VGenError(f"bad sampler setting {item!r} in {spec!r}: write name:key=value,key=value")
        opts[k.strip()] = yaml.safe_load(v)
    return name.strip(), opts


def _cells(models, variants, batch_sizes, baseline: bool, fits=None):
    """(model, setting, batch) cells; ``fits(m, v)`` drops settings a model cannot run (a next-token sampler on
    a next-scale model); the official LlamaGen loop only runs on next-token models."""
    fits = fits or (lambda m, v: True)
    for m in models:
        for b in batch_sizes:
            if baseline and fits(m, BASELINE):
                yield (m, BASELINE, b)
            for v in variants:
                if fits(m, v):
                    yield (m, v, b)


def run_bench(cfg) -> dict:
    from vgen.io import atomic_write_bytes, atomic_write_json
    from vgen.pipeline import Pipeline, read_card, resolve_sampler

    opts_all = OmegaConf.to_container(cfg.options, resolve=True) if cfg.options else {}
    variants = [str(v) for v in cfg.samplers]
    if len(set(variants)) != len(variants):
        raise VGenError(f"samplers lists a setting twice: {variants}")
    parsed = {v: parse_variant(v) for v in variants}
    if cfg.repeats < 1:
        raise VGenError(f"repeats must be >= 1, got {cfg.repeats}")
    if cfg.num_samples < 1:
        raise VGenError(f"num_samples must be >= 1, got {cfg.num_samples}")
    if cfg.fid_samples < 0 or cfg.fid_samples == 1:
        raise VGenError(f"fid_samples must be 0 (off) or >= 2, got {cfg.fid_samples}")
    if cfg.fid_samples:
        from vgen.eval.extractors import ZOO_CLASSIFIER
        from vgen.eval.metrics import REFERENCES, load_images
        if not ZOO_CLASSIFIER.exists():
            raise VGenError(f"FID-photo needs the zoo classifier at {ZOO_CLASSIFIER}: `vgen train recipe=photo`")
        if cfg.fid_reference not in REFERENCES:
            load_images(cfg.fid_reference, "fid_reference")  # a folder / .npz: fail now if unreadable
    for b in cfg.batch_sizes:
        if b < 1:
            raise VGenError(f"batch sizes must be >= 1, got {b}")
    cards = {m: read_card(m) for m in cfg.models}
    from vgen.samplers import get_sampler

    def fits(m, v):
        kind = cards[m].get("generation", "next-token")
        return kind == "next-token" if v == BASELINE else get_sampler(parsed[v][0]).generation == kind
    for v, (name, o) in parsed.items():  # unknown samplers / options -> clear error before loading anything
        ms = [m for m in cfg.models if fits(m, v)]
        if not ms:
            raise VGenError(f"sampler setting {v!r} fits none of the models {list(cfg.models)} (next-token samplers "
                            "drive GPT-like models, `var` next-scale models, `nar` next-neighbour models)")
        for m in ms:
            resolve_sampler(cards[m], name, cards[m].get("vocab_size"), **{**opts_all, **o})
    fref = cfg.get("fidelity_reference")
    if fref is not None and str(fref) not in parsed:
        raise VGenError(f"fidelity_reference {fref!r} must be one of the sampler settings {variants}")
    if cfg.get("fidelity_samples", 0) < 0:
        raise VGenError(f"fidelity_samples must be >= 0, got {cfg.fidelity_samples}")
    pipes = {m: Pipeline.from_pretrained(m, device=cfg.device) for m in cfg.models}
    out = Path(cfg.outdir)
    cells = list(_cells(cfg.models, variants, list(cfg.batch_sizes), cfg.baseline, fits))

    def run_cell(m, v, b):
        """num_samples images (labels i % classes, seeds seed + i), at most b per forward pass (speculative
        samplers refill a finished sample's slot with the next one)."""
        pipe = pipes[m]
        n = cfg.num_samples
        labels = [i % pipe.num_classes for i in range(n)]
        if v == BASELINE:
            from vgen.eval.reference_loop import llamagen_generate
            from vgen.kernels import KVCache
            o = {**pipe.sampling_defaults("ar"), **opts_all}
            torch.manual_seed(cfg.seed)
            t0 = time.perf_counter()
            for i in range(0, n, b):
                cond = torch.tensor(labels[i:i + b], device=pipe.device)
                llamagen_generate(pipe.model, cond, cfg_scale=o.get("cfg_scale", 1.0),
                                  cfg_interval=o.get("cfg_interval", -1), temperature=o.get("temperature", 1.0),
                                  top_k=o.get("top_k", 0), top_p=o.get("top_p", 1.0))
            sec = time.perf_counter() - t0
            c, L = pipe.model.config, pipe.model.seq_len
            rows = 2 * b if o.get("cfg_scale", 1.0) > 1.0 else b
            max_len = c.cls_token_num + L + (-(c.cls_token_num + L)) % 8  # the official loop rounds up to 8
            kv = KVCache.nbytes_for(c.n_layer, rows, c.n_kv_head or c.n_head, max_len, c.head_dim,
                                    pipe.model.tok_embeddings.weight.dtype)
            return {"seconds": sec, "forward_passes": L * -(-n // b), "tokens": n * L, "kv_cache_bytes": kv,
                    "accepted_per_step": 1.0}
        name, o = parsed[v]
        sampler = pipe.make_sampler(name, **{**opts_all, "compile": cfg.compile, **o})
        codebook = pipe.tokenizer.codebook() if sampler.needs_codebook else None
        cond = torch.tensor(labels, device=pipe.device)
        t0 = time.perf_counter()
        _, st = sampler(pipe.model, cond, [cfg.seed + i for i in range(n)], codebook=codebook, batch_size=b)
        agg = {k: v for k, v in st.items() if isinstance(v, (int, float))}
        agg["seconds"] = time.perf_counter() - t0
        return agg

    results = {c: [] for c in cells}
    warm, rss, cuda = {}, {}, {}
    from tqdm.auto import tqdm
    with tqdm(total=len(cells) * (cfg.repeats + 1), desc="bench", unit="run") as bar:
        for c in cells:
            t0 = time.perf_counter()
            with RssPeak() as mem:
                run_cell(*c)
            warm[c] = time.perf_counter() - t0
            rss[c], cuda[c] = mem.peak, mem.cuda_peak
            bar.update(1)
        for _ in range(cfg.repeats):
            for c in cells:
                with RssPeak() as mem:
                    results[c].append(run_cell(*c))
                rss[c] = max(rss[c], mem.peak)
                if mem.cuda_peak is not None:
                    cuda[c] = max(cuda[c], mem.cuda_peak)
                bar.update(1)
    quality = _quality(cfg, pipes, parsed, opts_all, fits) if cfg.fid_samples else {}
    if fref is not None and cfg.get("fidelity_samples", 0):
        for key, val in _fidelity(cfg, pipes, parsed, opts_all, fits, str(fref)).items():
            quality.setdefault(key, {}).update(val)

    rows = []
    for (m, v, b), runs in results.items():
        sec = statistics.median(r["seconds"] for r in runs)
        r0 = runs[0]
        row = {"model": m, "sampler": v, "batch_size": b, "num_samples": cfg.num_samples, "seconds": sec,
               "ms_per_token": 1e3 * sec / r0["tokens"], "ms_per_pass": 1e3 * sec / r0["forward_passes"],
               "tokens_per_s": r0["tokens"] / sec,
               "images_per_s": cfg.num_samples / sec, "forward_passes": r0["forward_passes"],
               "accepted_per_step": r0.get("accepted_per_step", 1.0), "kv_cache_bytes": r0["kv_cache_bytes"],
               "warmup_seconds": warm[(m, v, b)], "all_seconds": [r["seconds"] for r in runs],
               "peak_rss_mb": rss[(m, v, b)]}
        if cuda[(m, v, b)] is not None:
            row["peak_cuda_mb"] = cuda[(m, v, b)]
        row.update(quality.get((m, v), {}))
        for k in ("nll", "acceptance_rate", "kv_full_bytes", "kv_fraction", "kv_kept_fraction"):
            if k in r0:
                row[k] = r0[k]
        rows.append(row)
    for r in rows:
        if fref is not None:
            base = next((x for x in rows if x["model"] == r["model"] and x["batch_size"] == r["batch_size"]
                         and x["sampler"] == str(fref)), None)
            if base is not None:
                r["speedup_vs_ref"] = base["seconds"] / r["seconds"]
                r["kv_vs_ref"] = r["kv_cache_bytes"] / base["kv_cache_bytes"]
                if "peak_rss_mb" in base:
                    r["rss_vs_ref"] = r["peak_rss_mb"] / base["peak_rss_mb"]
        for ref in (BASELINE, "ar"):
            # the same model's baseline, or (NAR, ...) that of the model its card compares it to (photos-gpt)
            for m in (r["model"], cards[r["model"]].get("compare_to")):
                base = next((x for x in rows if x["model"] == m and x["batch_size"] == r["batch_size"]
                             and x["sampler"] == ref), None)
                if base is not None:
                    break
            if base is not None:
                r[f"speedup_vs_{ref}"] = base["seconds"] / r["seconds"]
                if ref == "ar":
                    r["pass_reduction"] = base["forward_passes"] / r["forward_passes"]
                    # drift only within one model: another model's nll is a different distribution
                    if "nll" in r and "nll" in base and base["model"] == r["model"]:
                        r["nll_excess"] = r["nll"] - base["nll"]
                    if "fid_photo" in r and "fid_photo" in base:
                        r["fid_photo_vs_ar"] = r["fid_photo"] / base["fid_photo"]
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


def _fidelity(cfg, pipes, parsed, opts_all, fits, ref: str) -> dict:
    """Closeness of every setting to the reference setting (e.g. the full KV cache) on the same labels and
    seeds: mean PSNR of the images against the reference images, and FID-photo with the reference images as
    the reference set. Not timed."""
    from tqdm.auto import tqdm

    import vgen.eval as ev
    from vgen.train.vq import psnr
    out = {}
    n = cfg.fidelity_samples
    for m, pipe in pipes.items():
        if not fits(m, ref):
            continue
        labels = [i % pipe.num_classes for i in range(n)]

        def images(v):
            name, o = parsed[v]
            return pipe.generate(labels, sampler=name, seed=cfg.seed, batch_size=max(cfg.batch_sizes),
                                 **{**opts_all, "compile": cfg.compile, **o}).images
        base = images(ref)
        for v in tqdm([v for v in parsed if fits(m, v)], desc=f"fidelity to {ref}", unit="setting"):
            imgs = base if v == ref else images(v)
            r = ev.fid(imgs, base, isc=False, kid_subset_size=min(n, 100)) if v != ref else {"fid": 0.0}
            out[(m, v)] = {"psnr_vs_ref": psnr(imgs, base) if v != ref else float("inf"),
                           "fid_vs_ref": r["fid"], "fidelity_samples": n}
    return out


def _quality(cfg, pipes, parsed, opts_all, fits=None) -> dict:
    """FID-photo (and KID) of ``fid_samples`` images per model and sampler setting against photos-test.
    Samples do not depend on the batch size (sample i uses seed seed + i in any batch), so one set per
    setting serves every batch size. Not timed."""
    from tqdm.auto import tqdm

    import vgen.eval as ev
    out = {}
    todo = [(m, v) for m in pipes for v in parsed if fits is None or fits(m, v)]
    for m, v in tqdm(todo, desc="FID-photo", unit="setting"):
        pipe = pipes[m]
        name, o = parsed[v]
        n = cfg.fid_samples
        labels = [i % pipe.num_classes for i in range(n)]
        gen = pipe.generate(labels, sampler=name, seed=cfg.seed, batch_size=max(cfg.batch_sizes),
                            **{**opts_all, "compile": cfg.compile, **o})
        r = ev.fid(gen.images, cfg.fid_reference, isc=False, kid_subset_size=min(n, 100))
        out[(m, v)] = {"fid_photo": r["fid"], "kid_photo": r["kid_mean"], "fid_samples": n}
    return out


def _overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig
        return list(HydraConfig.get().overrides.task)
    except Exception:
        return []


def markdown_table(rows: list[dict]) -> str:
    cols = [("model", "model", "{}"), ("sampler", "sampler", "{}"), ("batch", "batch_size", "{}"),
            ("ms/token", "ms_per_token", "{:.2f}"), ("ms/pass", "ms_per_pass", "{:.2f}"), ("tokens/s", "tokens_per_s", "{:.0f}"),
            ("images/s", "images_per_s", "{:.2f}"), ("fwd passes", "forward_passes", "{}"),
            ("tok/step", "accepted_per_step", "{:.2f}"), ("accept", "acceptance_rate", "{:.2f}"),
            ("nll", "nll", "{:.3f}"), ("drift (nll - ar)", "nll_excess", "{:+.3f}"),
            ("FID-photo", "fid_photo", "{:.2f}"), ("KV MB", "kv_cache_bytes", "{:.2f}"),
            ("KV kept", "kv_kept_fraction", "{:.1%}"), ("peak KV vs ref", "kv_vs_ref", "{:.1%}"), ("PSNR vs ref dB", "psnr_vs_ref", "{:.2f}"),
            ("FID-photo vs ref", "fid_vs_ref", "{:.2f}"), ("x ref", "speedup_vs_ref", "{:.2f}"),
            ("peak RSS MB", "peak_rss_mb", "{:.0f}"), ("peak CUDA MB", "peak_cuda_mb", "{:.0f}"),
            ("fewer passes", "pass_reduction", "{:.2f}x"),
            (f"x {BASELINE}", f"speedup_vs_{BASELINE}", "{:.2f}"), ("x ar", "speedup_vs_ar", "{:.2f}")]
    cols = [c for c in cols if any(r.get(c[1]) is not None for r in rows)]  # only measured columns
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


def _group(sampler: str) -> str:
    """A setting without its budget: the line a budget sweep is drawn on."""
    name, _, rest = sampler.partition(":")
    keep = [x for x in rest.split(",") if x and not x.startswith("kv_budget=")]
    return name + (":" + ",".join(keep) if keep else "")


def _fidelity_panels(ax_psnr, ax_fid, rows):
    """PSNR and FID-photo against the reference images versus the KV bytes kept, one line per method."""
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(_group(r["sampler"]), []).append(r)
    for g, rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["kv_vs_ref"])
        x = [100 * r["kv_vs_ref"] for r in rs]
        ax_psnr.plot(x, [r["psnr_vs_ref"] for r in rs], "o-", label=g)
        ax_fid.plot(x, [r["fid_vs_ref"] for r in rs], "o-", label=g)
    for a, lab, title in ((ax_psnr, "PSNR vs reference images, dB (higher is closer)", "fidelity: PSNR"),
                          (ax_fid, "FID-photo vs reference images (lower is closer)", "fidelity: FID-photo")):
        a.set_xlabel("peak KV bytes, % of the reference's")
        a.set_ylabel(lab)
        a.set_title(title)
        a.legend(fontsize=7)


def _plot(rows, path: Path):
    """Left: ms per token for every cell. Right: speed-up and forward-pass reduction against AR versus drift
    (nll excess over AR, nats/token), one marker per sampler setting and batch size."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    import io
    has_fid = any("fid_photo" in r for r in rows)
    fidel = [r for r in rows if r.get("psnr_vs_ref") not in (None, float("inf")) and "kv_vs_ref" in r]
    has_drift = any("nll_excess" in r for r in rows)
    n = 1 + (has_drift or not fidel) + has_fid + 2 * bool(fidel)
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.5), gridspec_kw={"width_ratios": [1.4] + [1] * (n - 1)})
    axes = list(axes)
    ax = axes.pop(0)
    ax2 = axes.pop(0) if (has_drift or not fidel) else None
    several = len({r["model"] for r in rows}) > 1

    def name(r, sep=" "):
        return (f"{r['model']}{sep}" if several else "") + f"{r['sampler']}{sep}B={r['batch_size']}"
    labels = [name(r, "\n") for r in rows]
    ax.bar(range(len(rows)), [r["ms_per_token"] for r in rows], color="tab:blue")
    ax.set_xticks(range(len(rows)), labels, fontsize=6, rotation=60, ha="right")
    ax.set_ylabel("ms per token (lower is better)")
    ax.set_title("time per token")
    for i, r in enumerate(rows):
        s = r.get("speedup_vs_ar")
        if s is not None:
            ax.text(i, r["ms_per_token"], f"{s:.2f}x", ha="center", va="bottom", fontsize=7)
    pts = [r for r in rows if "nll_excess" in r] if ax2 is not None else []
    for r in pts:
        mk = "o" if r["batch_size"] == min(x["batch_size"] for x in pts) else "s"
        ax2.scatter(r["nll_excess"], r["speedup_vs_ar"], marker=mk, color="tab:red")
        ax2.scatter(r["nll_excess"], r["pass_reduction"], marker=mk, color="tab:green")
        ax2.annotate(name(r), (r["nll_excess"], r["pass_reduction"]), fontsize=6)
    if ax2 is not None:
        ax2.axhline(1.0, color="gray", lw=0.5)
        ax2.set_xlabel("drift: nll of emitted tokens minus AR's (nats/token)")
        ax2.set_ylabel("x AR (red: wall clock, green: forward passes)")
        ax2.set_title("speed-up vs drift")
    if fidel:
        _fidelity_panels(axes.pop(0), axes.pop(0), fidel)
    if has_fid:
        ax3 = axes.pop(0)
        for r in rows:
            if "fid_photo" in r and "speedup_vs_ar" in r:
                mk = "o" if r["batch_size"] == min(x["batch_size"] for x in rows) else "s"
                ax3.scatter(r["fid_photo"], r["speedup_vs_ar"], marker=mk, color="tab:purple")
                ax3.annotate(name(r), (r["fid_photo"], r["speedup_vs_ar"]), fontsize=6)
        ax3.axhline(1.0, color="gray", lw=0.5)
        n = next(r["fid_samples"] for r in rows if "fid_samples" in r)
        ax3.set_xlabel(f"FID-photo vs photos-test, {n} samples (lower is better)")
        ax3.set_ylabel("wall-clock speed-up over AR")
        ax3.set_title("speed vs quality")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    from vgen.io import atomic_write_bytes
    atomic_write_bytes(path, buf.getvalue())
    return path
