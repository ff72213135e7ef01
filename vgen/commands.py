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


def _output_dir(cfg) -> Path:
    """Hydra's job folder: ``outdir`` for a single run, ``outdir/<job number>`` in a multirun sweep."""
    try:
        from hydra.core.hydra_config import HydraConfig
        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # called outside a Hydra app
        return Path(cfg.outdir)


def sample(cfg: DictConfig):
    import torch
    from tqdm.auto import tqdm

    from vgen.io import atomic_write_json, make_grid, save_png
    from vgen.pipeline import Pipeline, read_card, resolve_sampler

    name = cfg.model.path or cfg.model.name
    card = read_card(name)
    sampler_name = cfg.sampler.name
    opts = dataclasses.asdict(resolve_sampler(card, sampler_name, card.get("vocab_size"), **_options(cfg.sampler)).options)
    labels = _labels(cfg, int(card["num_classes"]))

    pipe = Pipeline.from_pretrained(name, device=cfg.device)
    out = _output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    images, stats_all = [], []
    bar = tqdm(total=len(labels), desc=f"sample {sampler_name}", unit="img", disable=not cfg.progress)
    for i in range(0, len(labels), cfg.batch_size):
        chunk = labels[i:i + cfg.batch_size]
        gen = pipe.generate(chunk, sampler=sampler_name, seed=cfg.seed + i, **opts)
        for j, img in enumerate(gen.images):
            save_png(out / f"{i + j:06d}.png", img)
        images.append(gen.images)
        stats_all.append(gen.stats)
        bar.update(len(chunk))
    bar.close()
    images = torch.cat(images)
    save_png(out / "grid.png", make_grid(images, nrow=cfg.grid_nrow))
    summary = {
        "model": name, "sampler": sampler_name, "options": stats_all[0]["options"], "num_samples": len(labels),
        "labels": labels, "seed": cfg.seed,
        "forward_passes": sum(s["forward_passes"] for s in stats_all),
        "tokens": sum(s["tokens"] for s in stats_all),
        "seconds": sum(s["sample_seconds"] for s in stats_all),
        "decode_seconds": sum(s["decode_seconds"] for s in stats_all),
        "kv_cache_bytes": max(s["kv_cache_bytes"] for s in stats_all),
        "nll": sum(s["nll"] * s["num_samples"] for s in stats_all) / len(labels),
    }
    for key in ("accepted_per_step", "acceptance_rate"):  # per-sample means (speculative samplers)
        if all(key in s for s in stats_all):
            summary[key] = sum(s[key] * s["num_samples"] for s in stats_all) / len(labels)
    summary["ms_per_token"] = 1e3 * summary["seconds"] / summary["tokens"]
    atomic_write_json(out / "stats.json", summary)
    extra = (f", {summary['accepted_per_step']:.2f} tokens per pass per sample"
             if "accepted_per_step" in summary else "")
    print(f"wrote {len(labels)} images, grid.png and stats.json to {out} "
          f"({summary['seconds']:.2f} s sampling, {summary['forward_passes']} forward passes{extra})")
    return summary


def bench(cfg: DictConfig):
    from vgen.eval.bench import run_bench
    return run_bench(cfg)


def train(cfg: DictConfig):
    recipe = OmegaConf.to_object(cfg.recipe)
    from vgen.train.gpt import GPTTrainConfig, train_gpt
    from vgen.train.vq import VQTrainConfig, train_vq
    if isinstance(recipe, VQTrainConfig):
        metrics = train_vq(recipe)
    elif isinstance(recipe, GPTTrainConfig):
        if not Path(recipe.tokenizer).exists():
            raise VGenError(f"tokenizer {recipe.tokenizer} not found: train it first (vgen train recipe=vq) or "
                            "point recipe.tokenizer at a VQ safetensors file")
        metrics = train_gpt(recipe)
    else:
        raise VGenError(f"unknown recipe {type(recipe).__name__}")
    print(json.dumps(metrics, indent=2))
    return metrics
