"""``vgen bench``'s third step: medians, ratios within the run, the table, bench.json, bench.md and the plot
(:func:`report`).
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from vgen.eval.bench.measuring import code_version, peak_rss_mb
from vgen.eval.bench.planning import BASELINE, Plan, parse_variant


def report(p: Plan, measured: dict, quality: dict) -> dict:
    """Rows (medians and ratios within the run), the table, bench.json, bench.md and bench.png."""
    from vgen.io import atomic_write_bytes, atomic_write_json, command_line
    cfg = p.cfg
    rows = []
    for (m, v, b), runs in measured["runs"].items():
        sec = statistics.median(r["seconds"] for r in runs)
        r0 = runs[0]
        row = {"model": m, "sampler": v, "batch_size": b, "num_samples": cfg.num_samples, "seconds": sec,
               "ms_per_token": 1e3 * sec / r0["tokens"], "ms_per_pass": 1e3 * sec / r0["forward_passes"],
               "tokens_per_s": r0["tokens"] / sec, "images_per_s": cfg.num_samples / sec,
               "forward_passes": r0["forward_passes"], "accepted_per_step": r0.get("accepted_per_step", 1.0),
               "kv_cache_bytes": r0.get("kv_cache_bytes", 0), "all_seconds": [r["seconds"] for r in runs],
               **measured["mem"][(m, v, b)], **quality.get((m, v), {}), **quality.get((m, v, b), {})}
        row["compile"] = p.sampler_options(v, m)[1].get("compile")  # what the cell ran: True, False or "auto"
        for k in ("nll", "acceptance_rate", "kv_full_bytes", "kv_fraction", "kv_kept_fraction", "draft_passes",
                  "transformer_seconds", "head_seconds", "target_transformer_seconds", "target_head_seconds",
                  "draft_seconds", "verify_seconds", "accepted_by_depth", "window", "window_rule", "tree", "window_seconds",
                  "pass_histogram"):
            if k in r0:
                row[k] = r0[k]
        if sum(row.get("pass_histogram") or []):  # the share of passes that decided one token (no draft accepted)
            row["single_token_share"] = row["pass_histogram"][0] / sum(row["pass_histogram"])
        rows.append(row)
    _ratios(rows, p)
    rep = {
        "command": "vgen bench " + " ".join(command_line()),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "dtype": measured.get("dtypes", {}),
        "peak_rss_mb": peak_rss_mb(),
        "sampling": {m: p.cards[m].sampling for m in cfg.models},
        "rows": rows,
    }
    out = Path(cfg.outdir)
    table = markdown_table(rows)
    print(table)
    atomic_write_json(out / "bench.json", rep)
    atomic_write_bytes(out / "bench.md", (f"`{rep['command']}`\n\n" + table + "\n").encode())
    plot = _plot(rows, out / "bench.png")
    if plot:
        print(f"wrote {out / 'bench.json'}, {out / 'bench.md'} and {plot}")
    return rep


def machine() -> dict:
    """What a bench JSON records of the machine and code that measured it: the CPU's model name, cores and the vector
    instructions PyTorch runs on it (``cpu_capability``: AVX2, AVX512, ...; two machines of one model name can
    differ), the GPU's name where CUDA is up, threads, torch, TF32, and vgen's commit at the run's start
    (:func:`code_version`)."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    commit = code_version()
    return {"platform": platform.platform(), "processor": platform.processor(), "cpu": cpu, "cores": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "cuda_tf32": torch.backends.cuda.matmul.allow_tf32, "vgen_commit": commit}


def _ratios(rows: list[dict], p: Plan) -> None:
    """Ratios within the run: against the fidelity reference setting, the official loop and AR (of the same
    model, or of the model the card compares it to: photos-nar against photos-gpt)."""
    fref = p.fidelity_reference
    for r in rows:
        if fref is not None:
            base = next((x for x in rows if x["model"] == r["model"] and x["batch_size"] == r["batch_size"]
                         and x["sampler"] == str(fref)), None)
            if base is not None:
                r["speedup_vs_ref"] = base["seconds"] / r["seconds"]
                r["kv_vs_ref"] = r["kv_cache_bytes"] / base["kv_cache_bytes"]
                r["rss_vs_ref"] = r["peak_rss_mb"] / base["peak_rss_mb"]
        for ref in (BASELINE, same_mode_ar(r["sampler"], {x["sampler"] for x in rows})):
            for m in (r["model"], p.cards[r["model"]].compare_to or None):
                base = next((x for x in rows if x["model"] == m and x["batch_size"] == r["batch_size"]
                             and x["sampler"] == ref), None)
                if base is not None:
                    break
            if base is None:
                continue
            if ref != BASELINE:
                r["ar_setting"], ref = ref, "ar"
            r[f"speedup_vs_{ref}"] = base["seconds"] / r["seconds"]
            if ref == "ar":
                if base is not r:
                    r.update(paired_speedup(base["all_seconds"], r["all_seconds"]))
                r["pass_reduction"] = base["forward_passes"] / r["forward_passes"]
                # drift only within one model: another model's nll is a different distribution
                if "nll" in r and "nll" in base and base["model"] == r["model"]:
                    r["nll_excess"] = r["nll"] - base["nll"]
                for k in ("fid_photo", "fvd_photo"):
                    if k in r and k in base:
                        r[f"{k}_vs_ar"] = r[k] / base[k]


def same_mode_ar(setting: str, settings: set[str]) -> str:
    """The AR setting a setting is compared with: ``ar:compile=false`` for an eager setting where the run has it (eager
    against eager), else ``ar``."""
    eager = parse_variant(setting)[1].get("compile") is False
    return "ar:compile=false" if eager and "ar:compile=false" in settings else "ar"


def paired_speedup(base_seconds: list[float], seconds: list[float]) -> dict:
    """Speed-up against a reference measured round by round: the repeats interleave the cells, so round i of a cell
    and round i of the reference ran minutes apart at most and a slow spell of the machine hits both. Returns the
    geometric mean of the per-round ratios and its 95% t-interval (on the log ratios; with at least 3 rounds), the
    numbers to quote where whole runs move by more than the effect."""
    if len(seconds) < 3 or len(base_seconds) != len(seconds):
        return {}
    import math

    from scipy.stats import t
    ratios = [b / s for b, s in zip(base_seconds, seconds)]
    logs = [math.log(x) for x in ratios]
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = t.ppf(0.975, len(logs) - 1) * sd / math.sqrt(len(logs))
    return {"speedup_vs_ar_rounds": ratios, "speedup_vs_ar_paired": math.exp(mean),
            "speedup_vs_ar_ci95": [math.exp(mean - half), math.exp(mean + half)]}


def markdown_table(rows: list[dict]) -> str:
    cols = [("model", "model", "{}"), ("sampler", "sampler", "{}"), ("batch", "batch_size", "{}"),
            ("ms/token", "ms_per_token", "{:.2f}"), ("ms/pass", "ms_per_pass", "{:.2f}"), ("tokens/s", "tokens_per_s", "{:.0f}"),
            ("images/s", "images_per_s", "{:.2f}"), ("fwd passes", "forward_passes", "{}"),
            ("tok/step", "accepted_per_step", "{:.2f}"), ("1-token passes", "single_token_share", "{:.0%}"),
            ("accept", "acceptance_rate", "{:.2f}"),
            ("nll", "nll", "{:.3f}"), ("drift (nll - ar)", "nll_excess", "{:+.3f}"),
            ("FID-photo", "fid_photo", "{:.2f}"), ("FVD-photo", "fvd_photo", "{:.1f}"), ("KV MB", "kv_cache_bytes", "{:.2f}"),
            ("KV kept", "kv_kept_fraction", "{:.1%}"), ("peak KV vs ref", "kv_vs_ref", "{:.1%}"), ("PSNR vs ref dB", "psnr_vs_ref", "{:.2f}"),
            ("FID-photo vs ref", "fid_vs_ref", "{:.2f}"), ("x ref", "speedup_vs_ref", "{:.2f}"),
            ("peak RSS MB", "peak_rss_mb", "{:.0f}"), ("peak CUDA MB", "peak_cuda_mb", "{:.0f}"),
            ("fewer passes", "pass_reduction", "{:.2f}x"),
            (f"x {BASELINE}", f"speedup_vs_{BASELINE}", "{:.2f}"), ("x ar", "speedup_vs_ar", "{:.2f}"),
            ("x ar paired (95% CI)", "speedup_vs_ar_paired", "{:.2f}")]
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
            elif key == "speedup_vs_ar_paired":
                lo, hi = r["speedup_vs_ar_ci95"]
                cells.append(f"{v:.2f} ({lo:.2f}-{hi:.2f})")
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


def _histogram_panel(ax, rows):
    """The share of passes that decided 1, 2, ... tokens, one line per speculative setting (its first batch size):
    SJD's long tail of one-token passes against the methods that shorten it."""
    seen = set()
    for r in rows:
        h = r.get("pass_histogram") or []
        key = (r["model"], r["sampler"])
        if not sum(h) or key in seen:
            continue
        seen.add(key)
        last = max(i for i, n in enumerate(h) if n) + 1
        tot = sum(h)
        model = f"{r['model']} " if len({x["model"] for x in rows}) > 1 else ""
        ax.plot(range(1, last + 1), [n / tot for n in h[:last]], "o-", ms=3,
                label=f"{model}{r['sampler']} B={r['batch_size']}")
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("tokens decided in the pass")
    ax.set_ylabel("share of passes")
    ax.set_title("accepted per pass")
    ax.legend(fontsize=6)


def _plot(rows, path: Path):
    """Left: ms per token for every cell. Then: speed-up and forward-pass reduction against AR versus drift
    (nll excess over AR, nats/token), one marker per sampler setting and batch size; the speculative samplers'
    per-pass histograms (share of passes deciding 1, 2, ... tokens); fidelity and FID panels where measured."""
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
    has_hist = any(sum(r.get("pass_histogram") or []) for r in rows)
    n = 1 + (has_drift or not fidel) + has_hist + has_fid + 2 * bool(fidel)
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
    if has_hist:
        _histogram_panel(axes.pop(0), rows)
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
