"""Hydra configs shipped in the package (``pkg://vgen.configs``) and their structured schemas.

Two config groups are generated instead of written as YAML:

- ``sampler``, from the sampler registry: one entry per sampler, its fields the sampler's ``Options`` (and their
  aliases), every one optional (``null`` means "the model card's recommendation, else the sampler default"). A new
  sampler therefore gets its validated ``sampler=<name>`` entry without touching this file, and the config cannot
  drift from the options dataclass. ``vgen sample sampler=sjd --cfg job`` shows one.
- ``model``, from the zoo: one entry per pipeline in ``vgen/zoo/`` (``name`` the zoo name, ``path`` null), so a new
  zoo pipeline is a ``model=<name>`` choice of every command without a YAML. Per-model settings (the recommended
  sampler options, the draft model, the plain sampler) live in the pipeline card, not in the config.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from vgen.io import command_line


def sampler_schema(*sampler_classes) -> type:
    """The ``sampler=<name>`` config node of the classes registered under one name (one per generation order):
    ``name`` plus every option of any of them, all defaulting to None (the sampler checks what it takes)."""
    first = sampler_classes[0]
    fields, seen = [("name", str, dataclasses.field(default=first.name))], {"name"}
    for cls in sampler_classes:
        for f in dataclasses.fields(cls.Options):
            if f.name not in seen:
                seen.add(f.name)
                fields.append((f.name, Optional[_resolve(f.type)], dataclasses.field(default=None)))
        for alias in cls.Options.aliases:
            if alias not in seen:
                seen.add(alias)
                fields.append((alias, Optional[Any], dataclasses.field(default=None)))
    return dataclasses.make_dataclass(f"{first.__name__}Config", fields)


def _resolve(t):
    if not isinstance(t, str):
        return t
    return {"float": float, "int": int, "bool": bool, "str": str}.get(t, Any)


def record_config(cfg, folder) -> None:
    """What Hydra's ``output_subdir`` would write, written only once the run has been accepted (a refused run
    must leave its folder untouched): ``folder/.hydra/config.yaml`` (the composed config) and ``overrides.yaml``
    (the command line), atomically. Outside a Hydra app, or on a torchrun rank other than 0, it writes nothing."""
    import os
    from pathlib import Path

    from omegaconf import OmegaConf

    from vgen.io import atomic_write_bytes
    if int(os.environ.get("RANK", 0)) > 0:
        return
    try:
        from hydra.core.hydra_config import HydraConfig
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:
        return
    d = Path(folder) / ".hydra"
    atomic_write_bytes(d / "config.yaml", OmegaConf.to_yaml(cfg).encode())
    atomic_write_bytes(d / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(overrides)).encode())


def chosen_on_command_line(key: str) -> bool:
    """Whether the command line chose config group ``key`` (e.g. ``sampler=...``)."""
    return any(o.split("=")[0].lstrip("+~") == key for o in command_line())


def at_least(default, lo, **kw):
    """A schema field whose value (each item, for a list) is a whole number or a finite number >= ``lo``: checked by
    :func:`vgen.validate.config` before any command runs. A float field is always checked finite."""
    if callable(default):
        return field(default_factory=default, metadata={"min": lo, **kw})
    return field(default=default, metadata={"min": lo, **kw})


def writes(default, kind: str):
    """A schema field naming where a command writes: ``kind`` "dir" (a folder that exists or can be created) or
    "file" (a file whose folder is writable); checked, nothing created, before any command runs."""
    return field(default=default, metadata={"writes": kind})


def reads(default):
    """A schema field naming a file a command reads: when given, it must exist (checked before any command runs)."""
    return field(default=default, metadata={"reads": True})


@dataclass
class ModelSchema:
    """The ``model=<zoo name>`` config node (one per zoo pipeline: ``register``)."""
    name: str = "photos-gpt"
    path: Optional[str] = None  # a local folder with pipeline.json overrides the zoo name


@dataclass
class SampleSchema:
    model: Any = None
    sampler: Any = None
    labels: Optional[list[int]] = None  # null: cycle through every class
    num_samples: int = at_least(16, 1)
    samples_per_class: Optional[int] = at_least(None, 1)  # num_samples = this x the classes (labels must be null)
    seed: int = 0
    batch_size: int = at_least(8, 1)
    outdir: str = writes("samples", "dir")
    device: str = "cpu"
    dtype: Optional[str] = None  # the model's weights and KV cache: float32 | bfloat16 | float16; null: the card's
    quantize: Optional[str] = None  # int8 | int4: the transformer's weight matrices in fewer bits (weight-only)
    quantize_group: int = at_least(32, 1)  # int4: inputs per scale and offset (32, 64, 128, 256)
    threads: Optional[int] = at_least(None, 1)  # intra-op CPU threads; null: this process's share of the cores
    tf32: bool = True  # CUDA: float32 matmuls in TF32, as LlamaGen's sampling scripts (vgen.kernels.precision)
    grid_nrow: int = at_least(8, 1)
    progress: bool = True
    prompt: Optional[str] = reads(None)  # video models: a clip (MP4 / GIF) whose first prompt_frames are continued
    prompt_frames: int = at_least(1, 1)
    prompts: Optional[list[str]] = None  # text models: cycled over the samples
    prompt_file: Optional[str] = reads(None)  # text models: .txt (one per line), .jsonl / .csv (a caption column)
    prompt_column: Optional[str] = None  # .jsonl / .csv: the column (default: caption, prompt or text)


@dataclass
class BenchSchema:
    models: list[str] = field(default_factory=lambda: ["photos-gpt"])  # `vgen bench model=<name>` sets one (vgen.cli)
    samplers: list[str] = field(default_factory=lambda: ["ar"])  # "name" or "name:key=value,key=value"
    batch_sizes: list[int] = at_least(lambda: [1, 8], 1)
    num_samples: int = at_least(8, 1)  # images per cell and repeat, generated in batches of batch_size
    repeats: int = at_least(3, 1)
    warmup: bool = True
    warmup_samples: Optional[int] = at_least(None, 1)  # the warm-up round's images per cell (null: num_samples)
    as_jobs: bool = False  # window=auto as a job of num_samples decides it (small: the prior), not as a large job's
    seed: int = 0
    baseline: bool = True  # include the official-style LlamaGen generate() loop
    compile: bool = True
    outdir: str = writes("bench", "dir")
    device: str = "cpu"
    dtype: Optional[str] = None  # every model's weights and KV cache (float32 | bfloat16 | float16); null: the card's
    quantize: Optional[str] = None  # int8 | int4: the transformer's weight matrices in fewer bits (weight-only)
    quantize_group: int = at_least(32, 1)  # int4: inputs per scale and offset (32, 64, 128, 256)
    threads: Optional[int] = at_least(None, 1)  # intra-op CPU threads; null: this process's share of the cores
    tf32: bool = True  # CUDA: float32 matmuls in TF32, as LlamaGen's sampling scripts (vgen.kernels.precision)
    options: dict = field(default_factory=dict)
    fid_samples: int = at_least(0, 0)  # FID-photo of this many samples per setting (0: off)
    fidelity_reference: Optional[str] = None  # a sampler setting (e.g. "var": the full KV cache) to compare to
    fidelity_samples: int = at_least(0, 0)  # PSNR / FID-photo against the reference's images on this many samples
    fid_reference: str = "photos-test"
    fvd_samples: int = at_least(0, 0)  # FVD-photo of this many clips per setting of a video model (0: off)
    fvd_reference: str = "clips-test"
    shapes: list[str] = field(default_factory=list)  # on CUDA: LlamaGen GPT shapes (B, L, XL, XXL, XL-t2i), random weights
    cpu_shapes: list[str] = field(default_factory=list)  # elsewhere: small shapes (cpu-S, cpu-M) instead
    shape_dtypes: list[str] = field(default_factory=lambda: ["float32"])  # the shapes' dtypes
    shape_quantize: list[str] = field(default_factory=list)  # also each shape with int8 / int4 weights (weight-only)
    pass_widths: list[int] = at_least(lambda: [1, 2, 4, 8, 16, 32], 1)  # tokens per pass (pass_cost)
    shape_batches: list[int] = at_least(list, 1)  # the shapes' AR batch sizes; empty: batch_sizes
    load_shapes: list[str] = field(default_factory=list)  # peak memory of loading these shapes' checkpoints (GPT
    #                                                       shapes; janus-pro-1b / -7b through transformers)
    load_formats: list[str] = field(default_factory=lambda: ["pt"])  # their files: pt (LlamaGen's release), safetensors
    load_quantize: list[str] = field(default_factory=lambda: ["int8", "int4"])  # loaded in float, then quantized; and
    #                                                                       quantized while loading
    hf_models: list[str] = field(default_factory=list)  # on CUDA: Janus / Emu3 released shapes vs transformers' generate
    hf_cpu_models: list[str] = field(default_factory=list)  # elsewhere: scaled copies (janus-cpu, emu3-cpu) instead
    hf_batch_sizes: list[int] = at_least(lambda: [1, 8], 1)
    hf_repeats: int = at_least(1, 1)  # timed runs per cell (after a warm-up when hf_warmup)
    hf_warmup: bool = False
    hf_dtype: Optional[str] = None  # null: bfloat16 on CUDA, float32 elsewhere
    hf_quantize: list[str] = field(default_factory=list)  # also time vgen's ar with these weights (int8, int4)
    hf_grid: Optional[int] = at_least(None, 1)  # tokens per side instead of each shape's grid (Emu3's 90 x 90: slow)
    hf_zoo_models: list[str] = field(default_factory=list)  # transformers zoo models (photos-emu3): samplers side by side
    hf_samplers: list[str] = field(default_factory=lambda: ["ar"])  # their settings ("sjd:window=4", ...)
    hf_shape_samplers: list[str] = field(default_factory=list)  # samplers run on the shapes (hf_models / hf_cpu_models)
    #                                  beside ar, in float and each hf_quantize format ("sjd:window=8", ...; no draft)
    hf_zoo_samples: int = at_least(8, 1)  # images per cell (the card's example prompts in turn)
    hf_zoo_generate: bool = True  # also time transformers' own generate on the zoo model (CFG, row ends forced)


@dataclass
class EvalSchema:
    metric: str = "fid"
    suite: Optional[str] = None  # adm: FID, sFID, IS, Precision, Recall, KID in one table
    fd_dinov2: bool = False  # suite: add FD-DINOv2 (implied by dinov2_weights)
    dinov2_weights: Optional[str] = None  # dinov2_vit*14_pretrain.pth (or $VGEN_DINOV2_WEIGHTS)
    dinov2_model: Optional[str] = None  # dinov2-vit-s-14 | -b-14 | -l-14 (default) | -g-14
    samples: str = "???"
    reference: Optional[str] = None  # null: photos-test (fid), clips-test (fvd)
    extractor: str = "photo"
    backend: str = "torch-fidelity"
    inception_weights: Optional[str] = None
    classifier: Optional[str] = reads(None)
    i3d_weights: Optional[str] = None  # fvd extractor=i3d (or $VGEN_I3D_WEIGHTS)
    video_classifier: Optional[str] = None  # fvd extractor=photo; null = the zoo's
    isc: bool = True
    kid_subset_size: int = at_least(1000, 2)
    clip_model: str = "ViT-B/32"  # clip: ViT-B/32 | ViT-L/14
    clip_weights: Optional[str] = None  # clip: folder of the model's HF files (or $VGEN_CLIP_WEIGHTS, or the HF cache)
    prompts: Optional[str] = None  # clip: .txt (one per line) | .jsonl | .csv | .json; prompt i pairs with sample i
    prompt_column: Optional[str] = None  # clip: the prompts' column (.jsonl / .csv / .json); null: caption, prompt, text
    batch_size: Optional[int] = at_least(None, 1)  # null: 64 (fid, clip), 16 (fvd)
    out: Optional[str] = writes(None, "file")
    device: str = "cpu"
    threads: Optional[int] = at_least(None, 1)  # intra-op CPU threads; null: this process's share of the cores
    progress: bool = True


@dataclass
class DemoSchema:
    server_name: str = "127.0.0.1"
    server_port: int = at_least(7860, 1)
    share: bool = False
    model: Any = None  # the model group: a zoo name (model=photos-var) or model.path=<folder>
    allowed_dirs: list[str] = field(default_factory=list)
    device: str = "cpu"
    dtype: Optional[str] = None  # the models' weights and KV cache (float32 | bfloat16 | float16); null: the card's
    quantize: Optional[str] = None  # int8 | int4: the transformer's weight matrices in fewer bits (weight-only)
    quantize_group: int = at_least(32, 1)  # int4: inputs per scale and offset (32, 64, 128, 256)
    threads: Optional[int] = at_least(None, 1)  # intra-op CPU threads; null: this process's share of the cores
    tf32: bool = True  # CUDA: float32 matmuls in TF32, as LlamaGen's sampling scripts (vgen.kernels.precision)


@dataclass
class ScaleKVSchema:
    action: str = "calibrate"
    model: Any = None
    budget: float = 0.1
    num_samples: int = at_least(16, 1)
    seed: int = 0
    batch_size: int = at_least(8, 1)
    max_ratio: float = at_least(8.0, 1)
    out: Optional[str] = writes(None, "file")  # default: scalekv_<model>_<budget>.json in the current directory
    device: str = "cpu"
    progress: bool = True


@dataclass
class TrainSchema:
    recipe: Any = None


SCHEMAS = {"sample": SampleSchema, "bench": BenchSchema, "eval": EvalSchema, "demo": DemoSchema,
           "scalekv": ScaleKVSchema, "train": TrainSchema}  # command -> its schema (vgen.validate.config)


_REGISTERED: tuple = ()  # the models and sampler classes the config store holds nodes for


def register() -> None:
    """Store every schema, model and sampler node in Hydra's config store, once per set of models and sampler
    classes (a model or sampler registered later in the process is stored at the next call): a command run in
    process again (tests, notebooks) composes without rebuilding the nodes (0.24 s each time)."""
    global _REGISTERED
    from vgen.cards import list_models, list_transformers_models
    from vgen.samplers import list_samplers, sampler_classes
    models = list_models() + list_transformers_models()
    samplers = [(name, *sampler_classes(name)) for name in list_samplers(include_hidden=True)]
    if _REGISTERED == (models, samplers):
        return
    from vgen.train.recipes import (
        CarDistillConfig,
        ContinuousTrainConfig,
        DrafterTrainConfig,
        Emu3TrainConfig,
        GPTTrainConfig,
        KLTrainConfig,
        MSVQTrainConfig,
        NARTrainConfig,
        PhotoTrainConfig,
        T2ITrainConfig,
        VARTrainConfig,
        VideoClassifierTrainConfig,
        VideoGPTTrainConfig,
        VideoNARTrainConfig,
        VQTrainConfig,
    )
    cs = ConfigStore.instance()
    cs.store(name="sample_schema", node=SampleSchema)
    cs.store(name="bench_schema", node=BenchSchema)
    cs.store(name="train_schema", node=TrainSchema)
    cs.store(name="eval_schema", node=EvalSchema)
    cs.store(name="demo_schema", node=DemoSchema)
    cs.store(name="scalekv_schema", node=ScaleKVSchema)
    for name in models:
        cs.store(group="model", name=name, node=ModelSchema(name=name))
    for name, *classes in samplers:
        cs.store(group="sampler", name=name, node=sampler_schema(*classes))
    cs.store(group="vgen_schema", name="recipe_vq", node=VQTrainConfig)
    cs.store(group="vgen_schema", name="recipe_gpt", node=GPTTrainConfig)
    cs.store(group="vgen_schema", name="recipe_photo", node=PhotoTrainConfig)
    cs.store(group="vgen_schema", name="recipe_msvq", node=MSVQTrainConfig)
    cs.store(group="vgen_schema", name="recipe_var", node=VARTrainConfig)
    cs.store(group="vgen_schema", name="recipe_nar", node=NARTrainConfig)
    cs.store(group="vgen_schema", name="recipe_video_gpt", node=VideoGPTTrainConfig)
    cs.store(group="vgen_schema", name="recipe_video_nar", node=VideoNARTrainConfig)
    cs.store(group="vgen_schema", name="recipe_video_classifier", node=VideoClassifierTrainConfig)
    cs.store(group="vgen_schema", name="recipe_kl", node=KLTrainConfig)
    cs.store(group="vgen_schema", name="recipe_continuous", node=ContinuousTrainConfig)
    cs.store(group="vgen_schema", name="recipe_drafter", node=DrafterTrainConfig)
    cs.store(group="vgen_schema", name="recipe_car_distill", node=CarDistillConfig)
    cs.store(group="vgen_schema", name="recipe_t2i", node=T2ITrainConfig)
    cs.store(group="vgen_schema", name="recipe_emu3", node=Emu3TrainConfig)
    _REGISTERED = (models, samplers)
