"""The CLI commands' bodies (each takes the composed Hydra config). Validation happens first, before any
weights are loaded or any model work starts."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vgen.errors import VGenError


def _options(node) -> dict:
    d = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    return {k: v for k, v in d.items() if k != "name" and v is not None}


def _labels(cfg, num_classes: int) -> list[int]:
    if cfg.num_samples < 1:
        raise VGenError(f"num_samples must be >= 1, got {cfg.num_samples}")
    if cfg.batch_size < 1:
        raise VGenError(f"batch_size must be >= 1, got {cfg.batch_size}")
    base = list(cfg.labels) if cfg.labels is not None else list(range(num_classes))
    if not base:
        raise VGenError("labels is empty: give class ids, e.g. labels=[0,3], or labels=null for every class")
    for c in base:
        if not 0 <= int(c) < num_classes:
            raise VGenError(f"class id {c} out of range: this model has classes 0..{num_classes - 1}")
    return [int(base[i % len(base)]) for i in range(cfg.num_samples)]


def _overridden(key: str) -> bool:
    """Whether the command line chose config group ``key`` (e.g. sampler=...)."""
    from vgen.eval.bench import _overrides
    return any(o.split("=")[0].lstrip("+~") == key for o in _overrides())


def _output_dir(cfg) -> Path:
    """Hydra's job folder: ``outdir`` for a single run, ``outdir/<job number>`` in a multirun sweep."""
    try:
        from hydra.core.hydra_config import HydraConfig
        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # called outside a Hydra app
        return Path(cfg.outdir)


GRID_MAX = 256  # grid.png shows at most this many samples


def sample(cfg: DictConfig):
    """Sharded over torchrun ranks by global index, resumable (indices already on disk are skipped), every
    file written atomically. Rank 0 writes grid.png and the merged stats.json."""
    import time

    from tqdm.auto import tqdm

    from vgen import distributed as vd
    from vgen.io import atomic_write_json, make_grid, save_png
    from vgen.pipeline import Pipeline, read_card, resolve_sampler

    name = cfg.model.path or cfg.model.name
    card = read_card(name)
    sampler_name, given = cfg.sampler.name, _options(cfg.sampler)
    if card.get("generation", "next-token") != "next-token" and sampler_name == "ar" and not _overridden("sampler"):
        from vgen.demo import baseline_sampler
        sampler_name, given = baseline_sampler(card), {}  # `vgen sample model=photos-var`: its own plain sampler
    opts = dataclasses.asdict(resolve_sampler(card, sampler_name, card.get("vocab_size"), **given).options)
    labels = _labels(cfg, int(card["num_classes"]))
    out = _output_dir(cfg)
    n = len(labels)
    run_key = {"model": name, "sampler": sampler_name, "options": opts, "seed": cfg.seed,
               "labels": None if cfg.labels is None else [int(c) for c in cfg.labels]}
    t_start = time.perf_counter()
    with vd.process_group(cfg.device) as (rank, world, device):
        todo = None
        if rank == 0:  # one view of what is done, shared with every rank before anyone writes
            todo = _prepare_outdir(out, run_key, n)
        todo = vd.broadcast(todo)
        mine = todo[rank::world]
        pipe = Pipeline.from_pretrained(name, device=device)
        parts = out / ".parts"
        bar = tqdm(total=len(mine), desc=f"sample {sampler_name}" + (f" [rank {rank}/{world}]" if world > 1 else ""),
                   unit="img", disable=not cfg.progress)
        for k in range(0, len(mine), cfg.batch_size):
            idx = mine[k:k + cfg.batch_size]
            gen = pipe.generate([labels[i] for i in idx], sampler=sampler_name,
                                seeds=[cfg.seed + i for i in idx], **opts)
            for i, img in zip(idx, gen.images):
                save_png(out / f"{i:06d}.png", img)
            st = {k2: v for k2, v in gen.stats.items() if isinstance(v, (int, float))}
            atomic_write_json(parts / f"{idx[0]:06d}-{len(idx)}-r{rank}.json", {"indices": idx, **st})
            bar.update(len(idx))
        bar.close()
        vd.barrier()
        summary = None
        if rank == 0:
            summary = _merge(out, n, labels, run_key, opts)
            summary.update(processes=world, generated_now=len(todo), skipped=n - len(todo),
                           wall_seconds=time.perf_counter() - t_start)
            files = [out / f"{i:06d}.png" for i in range(min(n, GRID_MAX))]
            save_png(out / "grid.png", make_grid(_read_pngs(files), nrow=cfg.grid_nrow))
            atomic_write_json(out / "stats.json", summary)
            extra = (f", {summary['accepted_per_step']:.2f} tokens per pass per sample"
                     if "accepted_per_step" in summary else "")
            resumed = f" ({n - len(todo)} already on disk)" if len(todo) < n else ""
            procs = f" on {world} processes" if world > 1 else ""
            print(f"wrote {n} images{resumed}, grid.png and stats.json to {out}{procs} "
                  f"({summary['seconds']:.2f} s sampling, {summary['forward_passes']} forward passes{extra})")
        vd.barrier()
    return summary


def _prepare_outdir(out: Path, run_key: dict, n: int) -> list[int]:
    """Check the folder holds this run (or nothing), drop temp files of a killed run, list missing indices."""
    from vgen.io import atomic_write_json
    out.mkdir(parents=True, exist_ok=True)
    key_file = out / "run.json"
    if key_file.exists():
        old = json.loads(key_file.read_text())
        if old != json.loads(json.dumps(run_key)):
            diff = sorted(k for k in set(old) | set(run_key) if old.get(k) != json.loads(json.dumps(run_key)).get(k))
            raise VGenError(f"{out} holds samples of another run (differs in {', '.join(diff)}): resume with the "
                            "same settings, or choose a new outdir")
    elif any(out.glob("[0-9][0-9][0-9][0-9][0-9][0-9].png")):
        raise VGenError(f"{out} already holds numbered PNGs from an unknown run: choose a new outdir")
    atomic_write_json(key_file, run_key)
    for tmp in list(out.glob(".*.tmp")) + list((out / ".parts").glob(".*.tmp")):
        tmp.unlink(missing_ok=True)  # left by a killed writer; the final names are never partial
    return [i for i in range(n) if not (out / f"{i:06d}.png").exists()]


def _read_pngs(files: list[Path]):
    import numpy as np
    import torch
    from PIL import Image
    arrs = []
    for f in files:
        with Image.open(f) as im:
            arrs.append(np.asarray(im.convert("RGB")))
    return torch.from_numpy(np.stack(arrs)).permute(0, 3, 1, 2)


def _merge(out: Path, n: int, labels: list[int], run_key: dict, opts: dict) -> dict:
    """Merged stats of every chunk on disk (this run and earlier, resumed ones) for indices < n."""
    parts, seen = [], set()
    for f in sorted((out / ".parts").glob("*.json")):
        p = json.loads(f.read_text())
        idx = [i for i in p["indices"] if i < n and i not in seen]
        if len(idx) == len(p["indices"]):
            parts.append(p)
            seen.update(idx)
    summary = {**run_key, "options": opts, "num_samples": n, "labels": labels,
               "samples_with_stats": sum(p["num_samples"] for p in parts)}
    if parts:
        m = summary["samples_with_stats"]
        summary.update(
            forward_passes=sum(p["forward_passes"] for p in parts), tokens=sum(p["tokens"] for p in parts),
            seconds=sum(p["sample_seconds"] for p in parts), decode_seconds=sum(p["decode_seconds"] for p in parts),
            kv_cache_bytes=max(p["kv_cache_bytes"] for p in parts),
            nll=sum(p["nll"] * p["num_samples"] for p in parts) / m)
        for key in ("accepted_per_step", "acceptance_rate"):  # per-sample means (speculative samplers)
            if all(key in p for p in parts):
                summary[key] = sum(p[key] * p["num_samples"] for p in parts) / m
        summary["ms_per_token"] = 1e3 * summary["seconds"] / summary["tokens"]
    else:
        summary.update(forward_passes=0, tokens=0, seconds=0.0)
    return summary


def bench(cfg: DictConfig):
    from vgen.eval.bench import run_bench
    return run_bench(cfg)


def eval(cfg: DictConfig):  # noqa: A001 (the command's name)
    from vgen.eval.metrics import BACKENDS, export_npz, fid, load_images
    from vgen.io import atomic_write_json
    metric = cfg.metric
    if metric not in ("fid", "npz"):
        raise VGenError(f"unknown eval metric {metric!r}: use `vgen eval fid ...` or `vgen eval npz ...`")
    if cfg.backend not in BACKENDS:
        raise VGenError(f"unknown backend {cfg.backend!r}: use one of {', '.join(BACKENDS)}")
    if OmegaConf.is_missing(cfg, "samples"):
        raise VGenError(f"say what to score: vgen eval {metric} samples=<folder of images | .npz>")
    samples = cfg.samples
    if metric == "npz":
        out = Path(cfg.out or (str(Path(samples).with_suffix("")) + ".npz"))
        n = len(load_images(samples, "samples")[0])
        export_npz(samples, out)
        print(f"wrote {n} images to {out} (arr_0, uint8 NHWC: the ADM evaluator's sample batch)")
        return str(out)
    sp = Path(samples)
    out = Path(cfg.out) if cfg.out else (sp / "metrics.json" if sp.is_dir() else Path("metrics.json"))
    res = fid(samples, cfg.reference, extractor=cfg.extractor, backend=cfg.backend, isc=cfg.isc,
              kid_subset_size=cfg.kid_subset_size, inception_weights=cfg.inception_weights,
              classifier=cfg.classifier, batch_size=cfg.batch_size, device=cfg.device, progress=cfg.progress)
    res["samples"] = str(samples)
    atomic_write_json(out, res)
    tag = "FID-photo" if cfg.extractor == "photo" else "FID"
    isc = f", IS {res['isc_mean']:.3f}" if "isc_mean" in res else ""
    print(f"{tag} {res['fid']:.3f}, KID {res['kid_mean']:.5f} +- {res['kid_std']:.5f}{isc} "
          f"({res['num_samples']} samples vs {res['num_reference']} reference, {cfg.backend}); wrote {out}")
    return res


def demo(cfg: DictConfig):
    import importlib.util

    from vgen.pipeline import list_models
    if importlib.util.find_spec("gradio") is None:
        raise VGenError("the demo needs Gradio: pip install -e \".[demo]\" (or pip install \"gradio>=6,<7\")")
    if cfg.model.path:
        folder = Path(cfg.model.path).expanduser().resolve()
        if not (folder / "pipeline.json").exists():
            raise VGenError(f"model.path={cfg.model.path}: no pipeline.json there")
        if not any(folder.is_relative_to(Path(d).expanduser().resolve()) for d in cfg.allowed_dirs or []):
            raise VGenError(f"model.path={cfg.model.path} is outside allowed_dirs: add its parent, e.g. "
                            f"allowed_dirs=[{folder.parent}]")
    elif cfg.model.name not in list_models():
        raise VGenError(f"unknown zoo model {cfg.model.name!r}; available: {', '.join(list_models())}")
    if not 0 < cfg.server_port < 65536:
        raise VGenError(f"server_port must be in 1..65535, got {cfg.server_port}")
    for d in cfg.allowed_dirs or []:
        if not Path(d).expanduser().is_dir():
            raise VGenError(f"allowed_dirs: {d} is not a directory")
    from vgen.demo import launch
    launch(cfg)


def train(cfg: DictConfig):
    recipe = OmegaConf.to_object(cfg.recipe)
    from vgen.train.gpt import GPTTrainConfig, train_gpt
    from vgen.train.photo import PhotoTrainConfig, train_photo
    from vgen.train.msvq import MSVQTrainConfig, train_msvq
    from vgen.train.nar import NARTrainConfig, train_nar
    from vgen.train.var import VARTrainConfig, train_var
    from vgen.train.vq import VQTrainConfig, train_vq
    if isinstance(recipe, PhotoTrainConfig):
        metrics = train_photo(recipe)
    elif isinstance(recipe, VQTrainConfig):
        metrics = train_vq(recipe)
    elif isinstance(recipe, GPTTrainConfig):
        if not Path(recipe.tokenizer).exists():
            raise VGenError(f"tokenizer {recipe.tokenizer} not found: train it first (vgen train recipe=vq) or "
                            "point recipe.tokenizer at a VQ safetensors file")
        metrics = train_nar(recipe) if isinstance(recipe, NARTrainConfig) else train_gpt(recipe)
    elif isinstance(recipe, MSVQTrainConfig):
        metrics = train_msvq(recipe)
    elif isinstance(recipe, VARTrainConfig):
        if not Path(recipe.tokenizer).exists():
            raise VGenError(f"tokenizer {recipe.tokenizer} not found: train it first (vgen train recipe=msvq) or "
                            "point recipe.tokenizer at a multi-scale VQVAE safetensors file")
        metrics = train_var(recipe)
    else:
        raise VGenError(f"unknown recipe {type(recipe).__name__}")
    print(json.dumps(metrics, indent=2))
    return metrics


def scalekv(cfg: DictConfig):
    """`vgen scalekv calibrate model=<zoo model> (or model.path=<folder>) budget=0.1 [num_samples=16 out=...]`."""
    from vgen.io import atomic_write_json
    from vgen.pipeline import Pipeline, read_card
    if cfg.action != "calibrate":
        raise VGenError(f"unknown scalekv action {cfg.action!r}: use `vgen scalekv calibrate model=...`")
    name = cfg.model.path or cfg.model.name
    card = read_card(name)
    if card.get("generation", "next-token") != "next-scale" and card.get("model_kind") != "var":
        raise VGenError(f"{name} is not a next-scale model: ScaleKV compresses the growing cache of VAR-style "
                        "models (e.g. model=photos-var)")
    if not 0 < cfg.budget <= 1:
        raise VGenError(f"budget must be in (0, 1] (fraction of the full cache kept), got {cfg.budget}")
    if cfg.num_samples < 1:
        raise VGenError(f"num_samples must be >= 1, got {cfg.num_samples}")
    out = Path(cfg.out or f"scalekv_{Path(str(name)).name}_{cfg.budget:g}.json")
    from vgen.samplers.var import calibrate_scalekv
    pipe = Pipeline.from_pretrained(name, device=cfg.device)
    cal = calibrate_scalekv(pipe, cfg.budget, cfg.num_samples, cfg.seed, cfg.batch_size, cfg.max_ratio,
                            progress=cfg.progress)
    atomic_write_json(out, cal)
    for e in cal["scales"]:
        print(f"after scale {e['keep_after_scale']} (used by {e['used_by_scale']}): drafters {e['drafters']} "
              f"x{e['drafter_ratio']:.2f}, weights {[round(w, 2) for w in e['weights']]}")
    print(f"wrote {out}")
    return cal
