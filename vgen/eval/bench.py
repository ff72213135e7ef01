"""``vgen bench``: samplers x batch sizes on pipelines, interleaved, medians of repeated runs.

Three steps: ``plan`` (validate every setting against every model card, before any weights load), ``run`` (every
cell warmed up once, untimed; then all cells ``repeats`` times round-robin so machine noise hits them alike; the
official LlamaGen loop is the hidden sampler ``llamagen-loop``, a cell like any other) and ``report`` (medians,
ratios within the run, table, JSON, plot).
"""
from __future__ import annotations

import contextlib
import os
import platform
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from vgen.errors import VGenError
from vgen.stats import numeric

BASELINE = "llamagen-loop"  # the hidden sampler that re-enacts the official LlamaGen loop


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError):
        return _peak_rss_mb()


class RssPeak:
    """Peak resident memory of the process while the block runs (polled every 20 ms on a thread; Linux /proc,
    else the lifetime peak), and on CUDA the peak of allocated device memory within the block."""

    def __enter__(self):
        import threading
        self.peak, self._stop = _rss_mb(), threading.Event()
        self.cuda_peak = None
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

        def poll():
            while not self._stop.wait(0.02):
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


@dataclass
class Plan:
    """What a bench run will do, checked before any weights load: the sampler settings per model, the cells
    (model, setting, batch size) and the per-setting options."""
    cfg: object
    cards: dict            # model -> its Card
    settings: dict         # setting string -> (sampler name, options given)
    cells: list            # (model, setting, batch size)
    options: dict          # options for every cell
    fidelity_reference: str | None

    def fits(self, model: str, setting: str) -> bool:
        from vgen.samplers import fitting_samplers
        return self.settings[setting][0] in fitting_samplers(self.cards[model], include_hidden=True)

    def sampler_options(self, setting: str, model: str | None = None) -> tuple[str, dict]:
        """The sampler and its options for a setting (on ``model``: a name may do several generation orders):
        every-cell options, ``compile`` where the sampler takes it, then the setting's own."""
        from vgen.samplers import option_names, sampler_class
        name, own = self.settings[setting]
        names = sampler_class(name, self.cards[model]).Options.names() if model else option_names(name)
        compile_ = self.cfg.compile
        if compile_ is True and model and not self.cards[model].own_forward:
            compile_ = "auto"  # a forward vgen does not own stays eager unless a setting asks (Card.own_forward)
        common = {k: v for k, v in {**self.options, "compile": compile_}.items() if k in names}
        return name, {**common, **own}


def plan(cfg) -> Plan:
    """Validate the bench config and every sampler setting against every model card (one-line errors)."""
    from vgen.pipeline import load_card, resolve_sampler
    opts_all = OmegaConf.to_container(cfg.options, resolve=True) if cfg.options else {}
    variants = [str(v) for v in cfg.samplers]
    if not variants:
        raise VGenError("samplers is empty: name at least one, e.g. samplers=[ar,sjd]")
    if not list(cfg.models):
        raise VGenError("models is empty: name at least one, e.g. model=photos-gpt")
    if not list(cfg.batch_sizes) or any(int(b) < 1 for b in cfg.batch_sizes):
        raise VGenError(f"batch_sizes must be a non-empty list of whole numbers >= 1, got {list(cfg.batch_sizes)}")
    if len(set(variants)) != len(variants):
        raise VGenError(f"samplers lists a setting twice: {variants}")
    if cfg.repeats < 1:
        raise VGenError(f"repeats must be >= 1, got {cfg.repeats}")
    from vgen import threads, validate
    validate.dtype(cfg.get("dtype"))
    threads.check(cfg.get("threads"))
    if cfg.num_samples < 1:
        raise VGenError(f"num_samples must be >= 1, got {cfg.num_samples}")
    if cfg.fid_samples < 0 or cfg.fid_samples == 1:
        raise VGenError(f"fid_samples must be 0 (off) or >= 2, got {cfg.fid_samples}")
    if cfg.fid_samples:
        from vgen.eval.extractors import ZOO_CLASSIFIER
        from vgen.eval.sources import REFERENCES, load_images
        if not ZOO_CLASSIFIER.exists():
            raise VGenError(f"FID-photo needs the zoo classifier at {ZOO_CLASSIFIER}: `vgen train recipe=photo`")
        if cfg.fid_reference not in REFERENCES:
            load_images(cfg.fid_reference, "fid_reference")  # a folder / .npz: fail now if unreadable
    if cfg.get("fvd_samples", 0) < 0 or cfg.get("fvd_samples", 0) == 1:
        raise VGenError(f"fvd_samples must be 0 (off) or >= 2, got {cfg.fvd_samples}")
    if cfg.get("fvd_samples", 0):
        from vgen.eval.video_extractors import ZOO_VIDEO_CLASSIFIER
        if not ZOO_VIDEO_CLASSIFIER.exists():
            raise VGenError(f"FVD-photo needs the zoo video classifier at {ZOO_VIDEO_CLASSIFIER}: "
                            "`vgen train recipe=video-classifier`")
    for b in cfg.batch_sizes:
        if b < 1:
            raise VGenError(f"batch sizes must be >= 1, got {b}")
    if cfg.get("fidelity_samples", 0) < 0:
        raise VGenError(f"fidelity_samples must be >= 0, got {cfg.fidelity_samples}")
    settings = {v: parse_variant(v) for v in variants}
    if cfg.baseline:
        settings = {BASELINE: (BASELINE, {}), **settings}
    p = Plan(cfg, {m: load_card(m) for m in cfg.models}, settings, [], opts_all, cfg.get("fidelity_reference"))
    if p.fidelity_reference is not None and str(p.fidelity_reference) not in variants:
        raise VGenError(f"fidelity_reference {p.fidelity_reference!r} must be one of the sampler settings {variants}")
    for v in variants:  # unknown samplers / options -> clear error before loading anything
        ms = [m for m in cfg.models if p.fits(m, v)]
        if not ms:
            raise VGenError(f"sampler setting {v!r} fits none of the models {list(cfg.models)} (next-token samplers "
                            "drive GPT-like models, `var` next-scale models, `nar` next-neighbour models)")
        for m in ms:
            name, o = p.sampler_options(v, m)
            resolve_sampler(p.cards[m], name, **o)
    p.cells = [(m, v, b) for m in cfg.models for b in cfg.batch_sizes for v in settings if p.fits(m, v)]
    return p


def run(p: Plan) -> tuple[dict, dict]:
    """Time every cell: one untimed warm-up each (compilation), then ``repeats`` rounds over all cells, so machine
    noise hits them alike, in turn forward and backward (a cell's place in a round, e.g. right after a compiled
    cell, does not bias its ratios). Returns (per-cell runs, per-cell memory and warm-up) and the quality columns."""
    from tqdm.auto import tqdm

    from vgen.pipeline import pipeline_for
    from vgen.samplers.speculative.widths import time_any_job
    cfg = p.cfg
    pipes = {m: pipeline_for(p.cards[m], device=cfg.device, dtype=cfg.get("dtype")) for m in cfg.models}

    def run_cell(m, v, b, n):
        """n images (the card's examples in turn: labels i % classes, or its example prompts; seeds seed + i), at
        most b per forward pass (speculative samplers refill a finished sample's slot with the next one)."""
        from vgen.conditions import examples
        pipe = pipes[m]
        name, o = p.sampler_options(v, m)
        sampler = pipe.make_sampler(name, **o)
        cond = pipe.encode(examples(pipe.card, n))
        t0 = time.perf_counter()
        # window=auto as a large job runs it (timed), or with as_jobs as a job of n samples would (a small one: the
        # prior, vgen.samplers.speculative.prior)
        with contextlib.nullcontext() if cfg.get("as_jobs", False) else time_any_job():
            _, st = pipe.sample_tokens(sampler, cond, [cfg.seed + i for i in range(n)], batch_size=b)
        per_depth = {"accepted_by_depth": st["accepted_by_depth"]} if "accepted_by_depth" in st else {}
        return {**numeric(st), **per_depth, "seconds": time.perf_counter() - t0}

    runs = {c: [] for c in p.cells}
    mem = {c: {} for c in p.cells}
    first = 0 if cfg.get("warmup", True) else 1  # round 0 is the untimed warm-up
    warmup_n = cfg.get("warmup_samples") or cfg.num_samples
    with tqdm(total=len(p.cells) * (cfg.repeats + 1 - first), desc="bench", unit="run") as bar:
        for rep in range(first, cfg.repeats + 1):
            for c in (p.cells if rep % 2 else p.cells[::-1]):  # forward, then backward: no cell always runs first
                t0 = time.perf_counter()
                with RssPeak() as peak:
                    r = run_cell(*c, cfg.num_samples if rep else min(cfg.num_samples, warmup_n))
                if rep == 0:
                    mem[c]["warmup_seconds"] = time.perf_counter() - t0
                    if "window_seconds" in r:  # window=auto's choice from what the cache held at the start
                        mem[c]["window_seconds_first"] = r["window_seconds"]
                else:
                    runs[c].append(r)
                mem[c]["peak_rss_mb"] = max(mem[c].get("peak_rss_mb", 0.0), peak.peak)
                if peak.cuda_peak is not None:
                    mem[c]["peak_cuda_mb"] = max(mem[c].get("peak_cuda_mb", 0.0), peak.cuda_peak)
                bar.update(1)
    quality = {}
    if cfg.fid_samples:
        quality = _quality(p, pipes)
    if cfg.get("fvd_samples", 0):
        for key, val in _video_quality(p, pipes).items():
            quality.setdefault(key, {}).update(val)
    if p.fidelity_reference is not None and cfg.get("fidelity_samples", 0):
        for key, val in _fidelity(p, pipes, str(p.fidelity_reference)).items():
            quality.setdefault(key, {}).update(val)
    return {"runs": runs, "mem": mem}, quality


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
        for k in ("nll", "acceptance_rate", "kv_full_bytes", "kv_fraction", "kv_kept_fraction", "draft_passes",
                  "transformer_seconds", "head_seconds", "target_transformer_seconds", "target_head_seconds",
                  "draft_seconds", "verify_seconds", "accepted_by_depth", "window", "window_rule", "window_seconds",
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
        "peak_rss_mb": _peak_rss_mb(),
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
    """What a bench JSON records of the machine and code that measured it: the CPU's model name and cores, the GPU's
    name where CUDA is up, threads, torch, TF32, and vgen's commit (where it runs from a git checkout)."""
    import subprocess
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"platform": platform.platform(), "processor": platform.processor(), "cpu": cpu, "cores": os.cpu_count(),
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


def generate_images(p: Plan, pipes: dict, model: str, setting: str, n: int, job_batch: int | None = None
                    ) -> torch.Tensor:
    """The images of ``n`` samples of a setting (the card's examples in turn, seeds seed + i): not timed, drawn at the
    largest batch size. Samples do not depend on how they are batched; a setting whose choices depend on the job's
    batch size (``window=auto``) draws them as a job of ``job_batch`` would."""
    from vgen.conditions import examples
    from vgen.samplers.base import sampling_job
    pipe = pipes[model]
    name, o = p.sampler_options(setting, model)
    from vgen.samplers.speculative.widths import time_any_job
    with sampling_job(n, job_batch or max(p.cfg.batch_sizes)), time_any_job():  # as the timed cells ran
        return pipe.generate(**examples(pipe.card, n).record(), sampler=name, seed=p.cfg.seed,
                             batch_size=max(p.cfg.batch_sizes), **o).pixels


def _batch_dependent(p: Plan, model: str, setting: str) -> bool:
    """Whether a setting's samples depend on the job's batch size (window=auto's cost table does)."""
    from vgen.pipeline import resolve_sampler
    name, o = p.sampler_options(setting, model)
    return getattr(resolve_sampler(p.cards[model], name, **o).options, "window", None) == "auto"


def _quality(p: Plan, pipes: dict) -> dict:
    """FID-photo (and KID) of ``fid_samples`` images per model and setting against ``fid_reference``."""
    from tqdm.auto import tqdm

    import vgen.eval as ev
    n = p.cfg.fid_samples
    out = {}
    todo = [(m, v) for m in pipes for v in p.settings if v != BASELINE and p.fits(m, v)
            and len(pipes[m].model.token_shape) != 3]
    # per batch size where the samples depend on it (window=auto), else one set for every batch size
    todo = [(m, v, b) for m, v in todo for b in (p.cfg.batch_sizes if _batch_dependent(p, m, v) else [None])]
    done = {}  # settings that differ only in compile draw the same images (up to rounding): scored once
    for m, v, b in tqdm(todo, desc="FID-photo", unit="setting"):
        name, o = p.sampler_options(v, m)
        same = (m, name, b, tuple(sorted((k, str(x)) for k, x in o.items() if k != "compile")))
        if same not in done:
            r = ev.fid(generate_images(p, pipes, m, v, n, b), p.cfg.fid_reference, isc=False,
                       kid_subset_size=min(n, 100))
            done[same] = {"fid_photo": r["fid"], "kid_photo": r["kid_mean"], "fid_samples": n}
        for bb in ([b] if b is not None else p.cfg.batch_sizes):
            out[(m, v, bb)] = done[same]
    return out


def _video_quality(p: Plan, pipes: dict) -> dict:
    """FVD-photo of ``fvd_samples`` clips per video model and setting against ``fvd_reference`` (clips-test)."""
    from tqdm.auto import tqdm

    from vgen.eval.fvd import fvd
    n = p.cfg.fvd_samples
    out = {}
    todo = [(m, v) for m in pipes for v in p.settings if v != BASELINE and p.fits(m, v)
            and len(pipes[m].model.token_shape) == 3]
    for m, v in tqdm(todo, desc="FVD-photo", unit="setting"):
        r = fvd(generate_images(p, pipes, m, v, n), p.cfg.get("fvd_reference", "clips-test"), extractor="photo")
        out[(m, v)] = {"fvd_photo": r["fvd"], "fvd_samples": n}
    return out


def _fidelity(p: Plan, pipes: dict, ref: str) -> dict:
    """Closeness of every setting to the reference setting (e.g. the full KV cache) on the same labels and
    seeds: mean PSNR against the reference images, and FID-photo with them as the reference set."""
    from tqdm.auto import tqdm

    import vgen.eval as ev
    from vgen.eval.psnr import psnr
    n = p.cfg.fidelity_samples
    out = {}
    for m in pipes:
        if not p.fits(m, ref):
            continue
        base = generate_images(p, pipes, m, ref, n)
        out[(m, ref)] = {"psnr_vs_ref": float("inf"), "fid_vs_ref": 0.0, "fidelity_samples": n}
        for v in tqdm([v for v in p.settings if v not in (ref, BASELINE) and p.fits(m, v)],
                      desc=f"fidelity to {ref}", unit="setting"):
            imgs = generate_images(p, pipes, m, v, n)
            r = ev.fid(imgs, base, isc=False, kid_subset_size=min(n, 100))
            out[(m, v)] = {"psnr_vs_ref": psnr(imgs, base), "fid_vs_ref": r["fid"], "fidelity_samples": n}
    return out


def markdown_table(rows: list[dict]) -> str:
    cols = [("model", "model", "{}"), ("sampler", "sampler", "{}"), ("batch", "batch_size", "{}"),
            ("ms/token", "ms_per_token", "{:.2f}"), ("ms/pass", "ms_per_pass", "{:.2f}"), ("tokens/s", "tokens_per_s", "{:.0f}"),
            ("images/s", "images_per_s", "{:.2f}"), ("fwd passes", "forward_passes", "{}"),
            ("tok/step", "accepted_per_step", "{:.2f}"), ("accept", "acceptance_rate", "{:.2f}"),
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
