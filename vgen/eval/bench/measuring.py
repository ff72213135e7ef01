"""``vgen bench``'s second step: every cell timed, interleaved, with its peak memory (:func:`run`), and the quality
columns.
"""
from __future__ import annotations

import contextlib
import functools
import os
import resource
import time
from pathlib import Path

import torch

from vgen.eval.bench.planning import BASELINE, Plan
from vgen.stats import numeric


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError):
        return peak_rss_mb()


def free_memory() -> None:
    """Collect garbage and hand freed heap pages back to the system (glibc's ``malloc_trim``; CUDA's cache), so the
    next :class:`RssPeak` measures the next model, not what the last one left."""
    import gc
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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


@functools.lru_cache(maxsize=1)
def code_version() -> str | None:
    """vgen's commit (where it runs from a git checkout), read once: the bench calls it when it starts, so a commit
    made while a long run goes on is not the one its JSON names. ``+dirty`` where the package's tracked files differ
    from that commit (what ran is then not exactly a commit)."""
    import subprocess
    here = Path(__file__).parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=here).stdout.strip() or None
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", str(here.parents[1])],
                                 capture_output=True, text=True, timeout=5, cwd=here).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}+dirty" if commit and changed else commit


def run(p: Plan) -> tuple[dict, dict]:
    """Time every cell: one untimed warm-up each (compilation), then ``repeats`` rounds over all cells, so machine
    noise hits them alike, in turn forward and backward (a cell's place in a round, e.g. right after a compiled
    cell, does not bias its ratios). Returns (per-cell runs, per-cell memory and warm-up) and the quality columns."""
    from tqdm.auto import tqdm

    from vgen.pipeline import pipeline_for
    from vgen.samplers.speculative.widths import time_any_job
    code_version()  # the commit this run starts from (the JSON names it, whatever is committed meanwhile)
    cfg = p.cfg
    from vgen.eval.bench.planning import model_quantize
    pipes = {m: pipeline_for(p.cards[m], device=cfg.device, dtype=cfg.get("dtype"),
                             quantize=model_quantize(m, cfg.get("quantize")),
                             quantize_group=cfg.get("quantize_group", 32)) for m in cfg.models}

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
    return {"runs": runs, "mem": mem, "dtypes": {m: weights_dtype(pipe) for m, pipe in pipes.items()}}, quality


def weights_dtype(pipe) -> str | None:
    """The dtype a pipeline's model computes in (its first floating-point parameter's; int8 / int4 models keep their
    activations in it), e.g. "float32"; None where the pipeline holds no torch module."""
    params = getattr(getattr(pipe, "model", None), "parameters", None)
    for t in (params() if params else ()):
        if t.is_floating_point():
            return str(t.dtype).removeprefix("torch.")
    return None


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
