"""``vgen bench``'s first step: every setting checked against every model card before any weights load (:func:`plan`).
"""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import OmegaConf

from vgen.errors import VGenError

BASELINE = "llamagen-loop"  # the hidden sampler that re-enacts the official LlamaGen loop


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


def model_name(entry: str) -> str:
    """A bench ``models`` entry without its weight format: ``photos-gpt@int8`` -> ``photos-gpt``."""
    return str(entry).rpartition("@")[0] if "@" in str(entry) else str(entry)


def model_quantize(entry: str, default: str | None) -> str | None:
    """A ``models`` entry's weight format (``@int8``, ``@int4``; ``@float``: none), else ``default`` (``quantize``)."""
    if "@" not in str(entry):
        return default
    mode = str(entry).rpartition("@")[2]
    return None if mode == "float" else mode


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
    from vgen.kernels.quant import check_mode
    check_mode(cfg.get("quantize"), cfg.get("quantize_group", 32))
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
    if cfg.baseline and (cfg.get("quantize") or any(model_quantize(m, None) for m in cfg.models)):
        raise VGenError(f"baseline=true times the official loop ({BASELINE}), which runs float linear layers and takes "
                        "no quantized model: set baseline=false")
    if cfg.baseline:
        settings = {BASELINE: (BASELINE, {}), **settings}
    for m in cfg.models:  # "photos-gpt@int8": that model with int8 weights, side by side with the float one
        check_mode(model_quantize(m, None), cfg.get("quantize_group", 32))
    p = Plan(cfg, {m: load_card(model_name(m)) for m in cfg.models}, settings, [], opts_all,
             cfg.get("fidelity_reference"))
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
