"""The CLI commands' bodies (each takes the composed Hydra config). Validation happens first, before any
weights are loaded or any model work starts."""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vgen.errors import VGenError


def _options(node) -> dict:
    d = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    return {k: v for k, v in d.items() if k != "name" and v is not None}


def _output_dir(cfg) -> Path:
    """The job's folder: ``outdir`` for a single run, ``outdir/<job number>`` in a multirun sweep (Hydra's sweep
    folder; a single run's Hydra folder is ``.``, so Hydra itself creates nothing before the run is accepted)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            return Path(hc.runtime.output_dir)
    except ValueError:  # called outside a Hydra app
        pass
    return Path(cfg.outdir)


def sample(cfg: DictConfig):
    from vgen.conditions import kind_of
    from vgen.configs import chosen_on_command_line
    from vgen.jobs import SampleJob
    from vgen.samplers.base import sampling_job
    sampler, options = cfg.sampler.name, _options(cfg.sampler)
    num_samples = cfg.num_samples
    from vgen.pipeline import load_card
    if cfg.samples_per_class is not None:  # the papers' protocol: every class equally often (sample i: class i % C)
        if cfg.labels is not None:
            raise VGenError(f"samples_per_class={cfg.samples_per_class} draws every class in turn: drop labels=... "
                            "(or set samples_per_class=null to sample the given labels)")
        if not kind_of(load_card(cfg.model.path or cfg.model.name)).has_classes:
            raise VGenError("samples_per_class is for class models; a text model samples its prompts in turn: set "
                            "num_samples (sample i has prompt i % the number of prompts)")
        if cfg.samples_per_class < 1:
            raise VGenError(f"samples_per_class must be >= 1, got {cfg.samples_per_class}")
        num_samples = cfg.samples_per_class * load_card(cfg.model.path or cfg.model.name).num_classes
    if not chosen_on_command_line("sampler"):  # the group's default (ar): the model's own plain sampler instead,
        from vgen.samplers import (
            plain_sampler,  # with the options given that it takes
            sampler_class,
        )
        card = load_card(cfg.model.path or cfg.model.name)
        sampler = plain_sampler(card)
        options = {k: v for k, v in options.items() if k in sampler_class(sampler, card).Options.names()}
    job = SampleJob(model=cfg.model.path or cfg.model.name, sampler=sampler, options=options,
                    labels=None if cfg.labels is None else list(cfg.labels), num_samples=num_samples,
                    seed=cfg.seed, batch_size=cfg.batch_size, outdir=cfg.outdir, device=cfg.device,
                    dtype=cfg.dtype, quantize=cfg.quantize, quantize_group=cfg.quantize_group, grid_nrow=cfg.grid_nrow, progress=cfg.progress, prompt=cfg.prompt,
                    prompt_frames=cfg.prompt_frames, prompts=None if cfg.prompts is None else list(cfg.prompts),
                    prompt_file=cfg.prompt_file, prompt_column=cfg.prompt_column)
    from vgen.configs import record_config
    with sampling_job(num_samples, cfg.batch_size):  # compile=auto: one choice for the whole job, every rank
        return job.run(_output_dir(cfg), accepted=lambda folder: record_config(cfg, folder))


def bench(cfg: DictConfig):
    from vgen import validate
    from vgen.configs import record_config
    from vgen.eval import hf_speed, load_memory, shapes
    from vgen.eval.bench import plan, report, run
    p = plan(cfg)  # every setting checked before anything is written or loaded
    measure_shapes = shapes.check(cfg)  # the released GPT shapes with random weights (+experiment=gpu)
    measure_loads = load_memory.check(cfg)  # loading their checkpoints: peak memory (+experiment=quantized-load)
    measure_hf = hf_speed.check(cfg)  # Janus / Emu3 shapes against transformers' generate (+experiment=transformers)
    measure_hf_zoo = hf_speed.check_zoo(cfg)  # samplers on the zoo's transformers model (photos-emu3)
    out = validate.outdir(cfg.outdir)
    record_config(cfg, out)
    rep = report(p, *run(p))
    if measure_shapes:
        from vgen.io import atomic_write_json
        rep["shapes"] = shapes.run(cfg, done=lambda so_far: atomic_write_json(out / "bench.json",
                                                                              {**rep, "shapes": so_far}))
        _add_section(out, rep, "Released GPT shapes (random weights)", shapes.markdown(rep["shapes"]))
    if measure_loads:
        rep["loads"] = load_memory.run(cfg)
        _add_section(out, rep, "Loading released GPT shapes (random weights)", load_memory.markdown(rep["loads"]))
    if measure_hf or measure_hf_zoo:
        rep["transformers"] = hf_speed.run(cfg)
        rep["transformers_zoo"] = hf_speed.run_zoo(cfg)
        _add_section(out, rep, "transformers' generate against vgen ar (random weights)",
                     hf_speed.markdown(rep["transformers"]) + "\n\n" + hf_speed.markdown_zoo(rep["transformers_zoo"]))
    return rep


def _add_section(out, rep: dict, title: str, table: str) -> None:
    """A bench measurement beyond the sampler table: printed, ``rep`` (holding it) rewritten as bench.json, and the
    table appended to bench.md under ``title``."""
    from vgen.io import atomic_write_bytes, atomic_write_json
    print(table)
    atomic_write_json(out / "bench.json", rep)
    md = (out / "bench.md").read_text() + f"\n## {title}\n\n" + table + "\n"
    atomic_write_bytes(out / "bench.md", md.encode())


def eval(cfg: DictConfig):  # noqa: A001 (the command's name)
    from vgen import validate
    from vgen.eval.metrics import BACKENDS, export_npz, fid
    from vgen.eval.sources import load_images
    from vgen.io import atomic_write_json
    metric = cfg.metric
    if cfg.batch_size is not None and cfg.batch_size < 1:
        raise VGenError(f"batch_size must be >= 1, got {cfg.batch_size}")
    if cfg.kid_subset_size < 2:
        raise VGenError(f"kid_subset_size must be >= 2 (images per KID subset), got {cfg.kid_subset_size}")
    if cfg.suite is not None:
        if metric != "fid":
            raise VGenError(f"suite={cfg.suite} scores images with its own table: drop {metric!r} "
                            f"(vgen eval suite={cfg.suite} samples=... reference=...)")
        return _eval_suite(cfg)
    if metric not in ("fid", "fvd", "clip", "npz"):
        raise VGenError(f"unknown eval metric {metric!r}: use `vgen eval fid ...`, `vgen eval fvd ...`, "
                        "`vgen eval clip ...` or `vgen eval npz ...`")
    if cfg.backend not in BACKENDS:
        raise VGenError(f"unknown backend {cfg.backend!r}: use one of {', '.join(BACKENDS)}")
    if OmegaConf.is_missing(cfg, "samples"):
        what = "folder of clips (.mp4 / .gif) | .npz" if metric == "fvd" else "folder of images | .npz"
        raise VGenError(f"say what to score: vgen eval {metric} samples=<{what}>")
    samples = cfg.samples
    if metric == "fvd":
        return _eval_fvd(cfg)
    if metric == "clip":
        return _eval_clip(cfg)
    if metric == "npz":
        out = validate.out_file(cfg.out or (str(Path(samples).with_suffix("")) + ".npz"))
        n = len(load_images(samples, "samples")[0])
        export_npz(samples, out)
        print(f"wrote {n} images to {out} (arr_0, uint8 NHWC: the ADM evaluator's sample batch)")
        return str(out)
    sp = Path(samples)
    out = validate.out_file(cfg.out or (sp / "metrics.json" if sp.is_dir() else "metrics.json"))
    res = fid(samples, cfg.reference or "photos-test", extractor=cfg.extractor, backend=cfg.backend, isc=cfg.isc,
              kid_subset_size=cfg.kid_subset_size, inception_weights=cfg.inception_weights,
              classifier=cfg.classifier, batch_size=cfg.batch_size or 64, device=cfg.device, progress=cfg.progress)
    res["samples"] = str(samples)
    atomic_write_json(out, res)
    tag = "FID-photo" if cfg.extractor == "photo" else "FID"
    isc = f", IS {res['isc_mean']:.3f}" if "isc_mean" in res else ""
    print(f"{tag} {res['fid']:.3f}, KID {res['kid_mean']:.5f} +- {res['kid_std']:.5f}{isc} "
          f"({res['num_samples']} samples vs {res['num_reference']} reference, {cfg.backend}); wrote {out}")
    return res


def _eval_suite(cfg: DictConfig) -> dict:
    """`vgen eval suite=adm samples=<dir | .npz> reference=<name | dir | .npz> [extractor=inception ...]`: FID,
    sFID, IS, Precision, Recall, KID -> out (JSON) and the same name with .md (the table and how each number was
    computed). Every input is checked before any feature is computed."""
    import warnings

    from vgen import validate
    from vgen.errors import VGenWarning
    from vgen.eval.adm import SUITES, evaluate, markdown
    from vgen.io import atomic_write_bytes, atomic_write_json
    if cfg.suite not in SUITES + ("t2i",):
        raise VGenError(f"unknown suite {cfg.suite!r}: use one of {', '.join(SUITES + ('t2i',))}")
    if OmegaConf.is_missing(cfg, "samples"):
        raise VGenError(f"say what to score: vgen eval suite={cfg.suite} samples=<folder of images | .npz>")
    sp = Path(cfg.samples)
    default = sp / f"{cfg.suite}.json" if sp.is_dir() else sp.with_name(f"{sp.stem}.{cfg.suite}.json")
    out = validate.out_file(cfg.out or default)
    md = out.with_suffix(".md")
    if cfg.suite == "t2i":
        return _eval_t2i(cfg, out, md)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", VGenWarning)
        res = evaluate(cfg.samples, cfg.reference or "photos-test", suite=cfg.suite, extractor=cfg.extractor,
                       weights=cfg.inception_weights if cfg.extractor == "inception" else cfg.classifier,
                       batch_size=cfg.batch_size or 64, device=cfg.device, kid_subset_size=cfg.kid_subset_size,
                       progress=cfg.progress, fd_dinov2=cfg.fd_dinov2, dinov2_weights=cfg.dinov2_weights,
                       dinov2_model=cfg.dinov2_model)
    import sys
    for w in caught:
        print(f"vgen eval: warning: {w.message}", file=sys.stderr)
    atomic_write_json(out, res)
    table = markdown(res)
    atomic_write_bytes(md, table.encode())
    print(table + f"wrote {out} and {md}")
    return res


def _eval_t2i(cfg: DictConfig, out: Path, md: Path) -> dict:
    """`vgen eval suite=t2i samples=<dir | .npz> [prompts=<file>] [reference=...] [clip_weights=...]`: the ADM table,
    CLIP score and (zoo prompts) prompt accuracy -> out (JSON) and .md (:mod:`vgen.eval.t2i`)."""
    import warnings

    from vgen.errors import VGenWarning
    from vgen.eval.t2i import evaluate, markdown
    from vgen.io import atomic_write_bytes, atomic_write_json, read_prompts
    prompts = None if cfg.prompts is None else read_prompts(cfg.prompts, cfg.prompt_column)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always", VGenWarning)
        res = evaluate(cfg.samples, prompts, cfg.reference or "photos-test", extractor=cfg.extractor,
                       weights=cfg.inception_weights if cfg.extractor == "inception" else cfg.classifier,
                       clip_model=cfg.clip_model, clip_weights=cfg.clip_weights, classifier=cfg.classifier,
                       batch_size=cfg.batch_size or 64, device=cfg.device, kid_subset_size=cfg.kid_subset_size,
                       progress=cfg.progress)
    import sys
    for w in res["warnings"]:
        print(f"vgen eval: warning: {w}", file=sys.stderr)
    atomic_write_json(out, res)
    table = markdown(res)
    atomic_write_bytes(md, table.encode())
    print(table + f"wrote {out} and {md}")
    return res


def _eval_fvd(cfg: DictConfig) -> dict:
    """`vgen eval fvd samples=<folder of clips> [reference=clips-test extractor=photo|i3d i3d_weights=...]`:
    FVD -> <samples>/fvd.json. Every input is checked (weights, folders, clip shapes) before any features."""
    from vgen.eval.fvd import fvd
    from vgen.io import atomic_write_json
    samples = cfg.samples
    sp = Path(samples)
    from vgen import validate
    out = validate.out_file(cfg.out or (sp / "fvd.json" if sp.is_dir() else "fvd.json"))
    res = fvd(samples, cfg.reference or "clips-test", extractor=cfg.extractor, i3d_weights=cfg.i3d_weights,
              video_classifier=cfg.video_classifier, batch_size=cfg.batch_size or 16, device=cfg.device,
              progress=cfg.progress)
    res["samples"] = str(samples)
    atomic_write_json(out, res)
    tag = "FVD-photo" if cfg.extractor == "photo" else "FVD (I3D)"
    print(f"{tag} {res['fvd']:.3f} ({res['num_samples']} clips vs {res['num_reference']} reference, "
          f"{res['frames']} frames seen); wrote {out}")
    return res


def _eval_clip(cfg: DictConfig) -> dict:
    """`vgen eval clip samples=<folder | .npz> prompts=<.txt | .jsonl | .csv | .json> [clip_model=ViT-L/14
    clip_weights=<folder> prompt_column=...]`: CLIP score -> <samples>/clip.json. Sample i (sorted file order)
    pairs with prompt i. The prompts, the weights folder, the images and their count are checked before the model
    is loaded."""
    from vgen import validate
    from vgen.eval.clip import clip_score, clip_weights_folder, read_config
    from vgen.eval.sources import ImageSource
    from vgen.io import atomic_write_json, read_prompts
    if cfg.prompts is None:  # a vgen sample folder records its prompts
        from vgen.eval.t2i import sample_prompts
        prompts = sample_prompts(cfg.samples)
    else:
        prompts = read_prompts(cfg.prompts, cfg.prompt_column)
    sp = Path(cfg.samples)
    out = validate.out_file(cfg.out or (sp / "clip.json" if sp.is_dir() else sp.with_name(f"{sp.stem}.clip.json")))
    folder = clip_weights_folder(cfg.clip_weights, cfg.clip_model)
    read_config(folder, cfg.clip_model)
    src = ImageSource(cfg.samples, "samples")
    if len(src) != len(prompts):
        raise VGenError(f"{cfg.samples} holds {len(src)} images but {cfg.prompts} {len(prompts)} prompts: sample i "
                        "(sorted file order) is scored against prompt i, give one prompt per sample")
    res = clip_score(src, prompts, model=cfg.clip_model, weights=folder, batch_size=cfg.batch_size or 64,
                     device=cfg.device, progress=cfg.progress)
    res.update(samples=str(cfg.samples), prompts=str(cfg.prompts))
    atomic_write_json(out, res)
    extra = f", {res['truncated']} prompts cut to 77 tokens" if res["truncated"] else ""
    print(f"CLIP score {res['mean']:.4f} +- {res['std']:.4f} ({res['model']}, {res['n']} image-prompt pairs{extra}); "
          f"wrote {out}")
    return res


def demo(cfg: DictConfig):
    import importlib.util

    from vgen.cards import list_models
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
    _port_free(cfg.server_name, cfg.server_port)
    from vgen.demo import launch
    launch(cfg)


def _port_free(host: str, port: int) -> None:
    """The demo's port must be free: say which one is taken and offer one that is not."""
    import socket
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return
        except OSError as e:
            reason = e.strerror or str(e)
    with socket.socket() as s:
        s.bind((host, 0))
        free = s.getsockname()[1]
    raise VGenError(f"cannot serve on {host}:{port} ({reason}): choose another port, e.g. server_port={free}")


def train(cfg: DictConfig):
    import vgen.train.recipes  # noqa: F401  (registers every recipe)
    from vgen.configs import record_config
    from vgen.train.common import run_recipe
    # Hydra creates nothing (hydra.run.dir is "."): the run folder and its .hydra/ appear once the recipe's inputs
    # have been checked
    metrics = run_recipe(OmegaConf.to_object(cfg.recipe), accepted=lambda folder: record_config(cfg, folder))
    print(json.dumps(metrics, indent=2))
    return metrics


def scalekv(cfg: DictConfig):
    """`vgen scalekv calibrate model=<zoo model> (or model.path=<folder>) budget=0.1 [num_samples=16 out=...]`."""
    from vgen.cards import Card
    from vgen.interfaces import Order
    from vgen.io import atomic_write_json
    from vgen.pipeline import Pipeline
    if cfg.action != "calibrate":
        raise VGenError(f"unknown scalekv action {cfg.action!r}: use `vgen scalekv calibrate model=...`")
    name = cfg.model.path or cfg.model.name
    card = Card.load(name)
    if card.order != Order.NEXT_SCALE:
        raise VGenError(f"{name} is not a next-scale model: ScaleKV compresses the growing cache of VAR-style "
                        "models (e.g. model=photos-var)")
    if not 0 < cfg.budget <= 1:
        raise VGenError(f"budget must be in (0, 1] (fraction of the full cache kept), got {cfg.budget}")
    if cfg.num_samples < 1:
        raise VGenError(f"num_samples must be >= 1, got {cfg.num_samples}")
    if not cfg.max_ratio >= 1 or cfg.max_ratio == float("inf"):
        raise VGenError(f"max_ratio must be a finite number >= 1 (how much more cache a drafter layer may keep than "
                        f"a refiner), got {cfg.max_ratio}")
    if cfg.batch_size is not None and cfg.batch_size < 1:
        raise VGenError(f"batch_size must be >= 1, got {cfg.batch_size}")
    from vgen import validate
    out = validate.out_file(cfg.out or f"scalekv_{Path(str(name)).name}_{cfg.budget:g}.json")
    from vgen.samplers.var import calibrate_scalekv
    pipe = Pipeline.from_card(card, device=cfg.device)
    cal = calibrate_scalekv(pipe, cfg.budget, cfg.num_samples, cfg.seed, cfg.batch_size, cfg.max_ratio,
                            progress=cfg.progress)
    atomic_write_json(out, cal)
    for e in cal["scales"]:
        print(f"after scale {e['keep_after_scale']} (used by {e['used_by_scale']}): drafters {e['drafters']} "
              f"x{e['drafter_ratio']:.2f}, weights {[round(w, 2) for w in e['weights']]}")
    print(f"wrote {out}")
    return cal
