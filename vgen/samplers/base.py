"""The sampler interface, its options and the registry.

A sampler drives one generation order (:class:`vgen.interfaces.Order`) through that order's Protocol in
:mod:`vgen.interfaces` and never knows the model's family. Its options are a dataclass (``Options``): every field
carries its help text (and, where it has them, its choices), which is what the Hydra schema, the CLI and the demo
are built from. Options mean one thing everywhere: ``cfg_scale`` (1 = off) and ``top_p`` (1 = off) for every
token sampler, ``top_k`` 0 = off, ``temperature`` > 0 (0 is read as 1e-5: nearly greedy).

``sampler(model, cond, seeds, progress=False, codebook=None, batch_size=None) -> (tokens, stats)``: tokens
(N, seq_len) flat in raster order; ``stats`` (schema: :mod:`vgen.stats`) holds numbers and ``step_map``, an
(N, seq_len) tensor with the forward pass (0 = prefill) that decided each token. Sample i depends only on
``cond[i]`` and ``seeds[i]``, never on the batching.

Samplers that relax acceptance by token similarity (GSD, LANTERN) set ``needs_codebook`` and get the tokenizer's
``codebook`` (V, d); the model itself stays unaware of the tokenizer.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import math
from dataclasses import dataclass

import torch

from vgen.conditions import as_cond, kind_of, list_kinds  # noqa: F401 (as_cond: vgen.samplers.as_cond)
from vgen.errors import VGenError
from vgen.interfaces import ModelSpec, Order
from vgen.stats import merge_stats

_SAMPLERS: dict[str, dict[Order, type[Sampler]]] = {}  # name -> the class doing that method for each order


def option(default, help: str, choices: tuple | None = None):  # noqa: A002 (the dataclass metadata key)
    """A documented option field: ``help`` (one line) and, for string options, its ``choices``."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class Options:
    """Base of every sampler's options: float fields must be finite; ``aliases`` maps another spelling of an
    option (e.g. VAR's official ``cfg``) to ``(canonical name, conversion)``."""
    aliases = {}  # class attribute (not a field): {alias: (name, fn)}

    @classmethod
    def normalize(cls, options: dict) -> dict:
        """Aliases -> canonical names (an error when both spellings are given)."""
        out = dict(options)
        for alias, (name, fn) in cls.aliases.items():
            if alias in out:
                if name in out:
                    raise VGenError(f"give {name} or its alias {alias}, not both")
                out[name] = fn(out.pop(alias))
        return out

    @classmethod
    def names(cls) -> set[str]:
        """Every accepted option name: the fields and their aliases."""
        return {f.name for f in dataclasses.fields(cls)} | set(cls.aliases)

    def validate(self, spec: ModelSpec | None = None) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, str) and "int" in str(f.type) and v.strip().lstrip("-").isdigit():
                v = int(v)  # a whole number typed as text (a demo text box) is the number
                setattr(self, f.name, v)
            if isinstance(v, float) and not math.isfinite(v):
                raise VGenError(f"{f.name} must be a finite number, got {v}")
            choices = f.metadata.get("choices")
            if choices and v not in choices:
                raise VGenError(f"{f.name} must be one of {', '.join(map(str, choices))}, got {v!r}")

    def compile_pays(self, model, samples: int, batch_size: int) -> bool:
        """``compile=auto``'s decision for a job of ``samples`` in batches of ``batch_size`` on ``model``: by
        default :func:`auto_compile` (a compiled decode step's saving against its warm-up)."""
        if not getattr(model, "auto_compiles", True):  # e.g. a transformers model: compiled only when asked
            return False
        return auto_compile(model.seq_len, samples, batch_size, next(model.parameters()).device.type)


@dataclass
class TokenOptions(Options):
    """The target distribution of a token sampler: CFG-guided logits (rows [cond; uncond],
    ``uncond + cfg_scale * (cond - uncond)``), divided by ``temperature``, truncated to ``top_k`` then ``top_p``."""
    temperature: float = option(1.0, "softmax temperature (1 = the model's distribution, lower = sharper)")
    top_k: int = option(0, "keep the k most likely tokens (0 = off)")
    top_p: float = option(1.0, "keep the smallest set of tokens with this much mass (1 = off)")
    cfg_scale: float = option(1.0, "classifier-free guidance scale (1 = off)")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.temperature < 0:
            raise VGenError(f"temperature must be >= 0, got {self.temperature}: use 1.0 for the model's "
                            "distribution, lower for sharper samples")
        if self.top_k < 0:
            raise VGenError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        vocab = spec.vocab_size if spec is not None else None
        if vocab is not None and self.top_k > vocab:
            raise VGenError(f"top_k={self.top_k} is above the vocabulary size {vocab}: use 0 (off) "
                            f"or a value in 1..{vocab}")
        if not 0.0 < self.top_p <= 1.0:
            raise VGenError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.cfg_scale < 0:
            raise VGenError(f"cfg_scale must be >= 0 (1 = no guidance), got {self.cfg_scale}")

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0


def compile_value(value) -> bool | str:
    """An option ``compile`` as given (a bool, or "true" / "false" / "auto" in any case) -> True, False or "auto"."""
    if isinstance(value, bool):
        return value
    v = value.strip().lower() if isinstance(value, str) else None
    if v not in ("true", "false", "auto"):
        raise VGenError(f"compile must be true, false or auto, got {value!r}")
    return "auto" if v == "auto" else v == "true"


# compile=auto's cost model: a compiled forward pass saves about AUTO_SAVED_S_PER_PASS seconds over an eager one
# (mostly per-op dispatch), and compiling one batch shape (its four KV-length graphs) on an empty inductor cache takes
# about AUTO_WARMUP_S; compile when the job's passes repay the warm-up. The constants, their measurement and the
# break-even they give are in docs/compile.md.
AUTO_SAVED_S_PER_PASS = 0.003
AUTO_WARMUP_S = 70.0
# The same on CUDA, where the compiled step is a CUDA graph: the smallest saving per pass and the largest warm-up
# measured over LlamaGen's shapes and photos-gpt (docs/compile.md, docs/benchmarks-gpu.md).
CUDA_SAVED_S_PER_PASS = 0.0035
CUDA_WARMUP_S = 33.0
_JOB: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("vgen_sampling_job", default=None)


@contextlib.contextmanager
def sampling_job(samples: int, batch_size: int):
    """Within this block ``compile=auto`` (and ``window=auto``'s cost table) decides for a whole job of ``samples``
    samples in batches of ``batch_size`` (drawn by many sampler calls, e.g. ``vgen sample``'s batches and ranks), the
    same way in every call."""
    token = _JOB.set((samples, batch_size))
    try:
        yield
    finally:
        _JOB.reset(token)


def job_shape(samples: int, batch_size: int) -> tuple[int, int]:
    """(samples, batch size) of the job a sampler call belongs to: the open :func:`sampling_job`'s, else this
    call's. Choices made from it (compile=auto, window=auto's pass costs) are the same in every call of a job."""
    return _JOB.get() or (samples, batch_size)


def auto_compile(seq_len: int, samples: int, batch_size: int, device: str = "cpu") -> bool:
    """``compile=auto``'s decision for ``samples`` samples of ``seq_len`` tokens, ``batch_size`` per forward pass:
    compile when the job's forward passes (ceil(samples / batch_size) x seq_len; an upper bound for samplers that
    decide several tokens per pass) save more than the warm-up of each batch shape it compiles (a smaller last
    batch is a second shape), with the costs of ``device`` (a device type: CUDA's, else the CPU's). It counts a cold
    inductor cache whatever the cache holds, so a command's choice
    (and its samples' bytes: compiled kernels round differently) never depends on earlier runs."""
    passes = -(-samples // batch_size) * seq_len
    shapes = 1 + (samples > batch_size and samples % batch_size != 0)
    saved, warmup = ((CUDA_SAVED_S_PER_PASS, CUDA_WARMUP_S) if device == "cuda"
                     else (AUTO_SAVED_S_PER_PASS, AUTO_WARMUP_S))
    return passes * saved >= shapes * warmup


@dataclass
class SamplingOptions(TokenOptions):
    """Options of the raster / next-neighbour token samplers."""
    cfg_interval: int = option(-1, "guide only the first cfg_interval+1 tokens (-1 = every token; LlamaGen's)")
    compile: bool | str = option("auto", "torch.compile the decode step: true, false, or auto (compiled when the "
                                 "job is long enough to repay the warm-up; docs/compile.md)")
    prefix_attention: bool = option(True, "attention reads only the filled KV-cache slots (false: the whole "
                                    "static cache every step, gpt-fast's way); same tokens either way")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.cfg_interval < -1:
            raise VGenError(f"cfg_interval must be >= -1 (-1 = guide every token), got {self.cfg_interval}")
        self.compile = compile_value(self.compile)


class Sampler:
    """Base class: subclasses set ``name``, ``Options`` and ``order`` and implement ``_sample`` (or ``_run`` for
    their own batching). ``plain``: the order's plain sampler (the default and the baseline); ``hidden``: kept
    out of ``list_samplers()`` (reference implementations used by benchmarks); ``prefix``: whether it can continue
    given tokens (``prefix=`` in the call: e.g. the first frames of a clip, for frame-conditioned video);
    ``conditionings``: the condition kinds of the models it drives (:attr:`ModelSpec.conditioning`: class ids,
    caption features, prompt token ids; None: every registered kind, :mod:`vgen.conditions`); :meth:`fits` says
    whether it drives a model."""

    name: str = ""
    Options: type[Options] = SamplingOptions
    order: Order = Order.NEXT_TOKEN
    plain: bool = False
    hidden: bool = False
    needs_codebook: bool = False
    needs_draft: bool = False
    draft_kind: str = "model"  # what a needs_draft sampler drafts with: "model" (a pipeline) or "head" (a draft head)
    prefix: bool = False
    conditionings: tuple[str, ...] | None = None  # None: every registered condition kind

    @classmethod
    def fits(cls, spec: ModelSpec) -> bool:
        """Does this sampler drive models like ``spec``: its generation order and its kind of condition?"""
        return spec.order == cls.order and (cls.conditionings is None or spec.conditioning in cls.conditionings)

    def __init__(self, **options):
        unknown = sorted(set(options) - self.Options.names())
        if unknown:
            raise VGenError(f"unknown option(s) {unknown} for sampler {self.name!r}; valid options: "
                            f"{sorted(self.Options.names())}")
        self.options = self.Options(**self.Options.normalize(options))

    def validate(self, model_or_card) -> ModelSpec:
        """Does this sampler fit the model, and do its options? (A card works too: nothing needs weights.)"""
        spec = ModelSpec.of(model_or_card)
        check_fits(self.name, spec)
        if spec.order != self.order:
            raise VGenError(f"this {self.name!r} sampler does {self.order} generation and {spec.name} is a "
                            f"{spec.order} model: get the one that fits with get_sampler({self.name!r}, model=...)")
        self.options.validate(spec)
        return spec

    @torch.inference_mode()
    def __call__(self, model, cond: torch.Tensor, seeds: list[int], progress: bool = False,
                 codebook: torch.Tensor | None = None, batch_size: int | None = None,
                 prefix: torch.Tensor | None = None, draft=None):
        """Sample one token sequence per condition, at most ``batch_size`` (default: all) per forward pass.
        ``prefix`` (N, P) int: the first P tokens of every sequence are given (not sampled): the sampler continues
        them (token P on is drawn exactly as if tokens < P had been drawn). ``draft``: the draft model of a sampler
        that needs one (``needs_draft``)."""
        spec = self.validate(model)
        kind = kind_of(spec)
        model, cond = kind.bind(model, cond)  # prompt token ids (B, L): the model binds a view to their length
        kind.check_tensor(cond, spec)
        if len(seeds) != cond.shape[0]:
            raise VGenError(f"got {len(seeds)} seeds for {cond.shape[0]} conditions: give one seed per sample")
        if batch_size is not None and batch_size < 1:
            raise VGenError(f"batch_size must be >= 1, got {batch_size}")
        kw = {}
        if self.needs_codebook:
            if codebook is None:
                raise VGenError(f"sampler {self.name!r} measures token similarity in the tokenizer's codebook: pass "
                                "codebook=tokenizer.codebook() (a Pipeline does this for you)")
            if codebook.dim() != 2 or codebook.shape[0] < spec.vocab_size:
                raise VGenError(f"codebook of shape {tuple(codebook.shape)} does not cover the model's "
                                f"{spec.vocab_size} image tokens: pass the (vocab_size, dim) codebook of the "
                                "tokenizer this model was trained with")
            kw["codebook"] = codebook[: spec.vocab_size]
        if prefix is not None:
            kw["prefix"] = self.check_prefix(model, prefix, cond.shape[0]).to(cond.device)
        if self.needs_draft:
            kw["draft"] = self.check_draft(model, draft)
        elif draft is not None:
            raise VGenError(f"sampler {self.name!r} takes no draft model")
        batch_size = batch_size or cond.shape[0]
        run = self.resolved(model, cond.shape[0], batch_size)
        return run._run(model, cond, list(seeds), progress, batch_size, **kw)

    def resolved(self, model, n: int, batch_size: int) -> Sampler:
        """The sampler that runs a call of ``n`` samples on ``model``, ``batch_size`` per pass: this one, or where its
        option ``compile`` is "auto" a copy with its options' ``compile_pays`` decision (for the job of :func:`sampling_job`
        if one is open), so ``_run`` and ``_sample`` only ever see a bool."""
        if getattr(self.options, "compile", None) != "auto":
            return self
        run = copy.copy(self)
        job = job_shape(n, batch_size)
        run.options = dataclasses.replace(self.options, compile=self.options.compile_pays(model, *job))
        return run

    def check_prefix(self, model, prefix: torch.Tensor, n: int) -> torch.Tensor:
        if not self.prefix:
            raise VGenError(f"sampler {self.name!r} cannot continue given tokens: use "
                            f"{', '.join(s for s in list_samplers() if sampler_class(s, self.order).prefix)}")
        if not isinstance(prefix, torch.Tensor) or prefix.dim() != 2 or prefix.is_floating_point():
            raise VGenError("prefix must be an integer token tensor (N, P)")
        if prefix.shape[0] != n:
            raise VGenError(f"got {prefix.shape[0]} prefixes for {n} samples: give one per sample")
        if not 1 <= prefix.shape[1] < model.seq_len:
            raise VGenError(f"a prefix of {prefix.shape[1]} tokens leaves nothing to generate: the model makes "
                            f"{model.seq_len} tokens, give 1..{model.seq_len - 1}")
        if prefix.numel() and (int(prefix.min()) < 0 or int(prefix.max()) >= model.vocab_size):
            raise VGenError(f"prefix tokens must be in 0..{model.vocab_size - 1}: encode the prompt with this "
                            "model's tokenizer")
        return prefix.long()

    def check_draft(self, model, draft):
        """A draft must make the target's tokens: same order, grid, token type and classes."""
        if draft is None:
            raise VGenError(f"sampler {self.name!r} needs a draft model: pass draft=<model> (a Pipeline loads the one "
                            "its card names, or draft=<zoo name or folder>)")
        ModelSpec.of(model).check_draft(ModelSpec.of(draft))
        return draft

    def _run(self, model, cond, seeds, progress, batch_size, **kw):
        """Default batching: consecutive chunks of ``batch_size`` (samplers with ragged progress override this
        to refill finished rows instead)."""
        n = cond.shape[0]
        if batch_size >= n:
            return self._sample(model, cond, seeds, progress, **kw)
        pre = kw.pop("prefix", None)
        parts = [self._sample(model, cond[i:i + batch_size], seeds[i:i + batch_size], progress, **kw,
                              **({} if pre is None else {"prefix": pre[i:i + batch_size]}))
                 for i in range(0, n, batch_size)]
        return torch.cat([t for t, _ in parts]), merge_stats([(st, t.shape[0]) for t, st in parts])

    def _sample(self, model, cond, seeds, progress, codebook=None):  # pragma: no cover - abstract
        raise NotImplementedError


def register_sampler(cls: type[Sampler]) -> type[Sampler]:
    """Class decorator: make a sampler reachable by its ``name`` (CLI, pipelines, bench, demo). One name may
    name one method for several generation orders (``ar``: codes or latents), one class per order."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _SAMPLERS.setdefault(cls.name, {})[Order(cls.order)] = cls
    return cls


def unregister_sampler(name: str) -> None:
    """Forget sampler ``name`` (a sampler registered for a while, e.g. by a test; unknown names are ignored)."""
    _SAMPLERS.pop(name, None)


def list_samplers(include_hidden: bool = False) -> list[str]:
    """The registered sampler names, sorted (``include_hidden``: also the reference loops benchmarks use)."""
    return sorted(n for n, by in _SAMPLERS.items() if include_hidden or not all(c.hidden for c in by.values()))


def sampler_classes(name: str) -> list[type[Sampler]]:
    """Every class registered under ``name`` (one per generation order it serves)."""
    if name not in _SAMPLERS:
        raise VGenError(f"unknown sampler {name!r}; available samplers: {', '.join(list_samplers())}")
    return list(_SAMPLERS[name].values())


def sampler_class(name: str, model=None) -> type[Sampler]:
    """The class of sampler ``name``; for ``model`` (a model, card, :class:`ModelSpec` or :class:`Order`) the one
    doing that model's order (the first registered when none is given or none fits: ``validate`` then says why)."""
    classes = sampler_classes(name)
    if model is not None:
        order = model if isinstance(model, Order) else ModelSpec.of(model).order
        return _SAMPLERS[name].get(order, classes[0])
    return classes[0]


def fitting_samplers(model_or_card, include_hidden: bool = False) -> list[str]:
    """Names of the registered samplers that drive this model (:meth:`Sampler.fits`: its order and conditions)."""
    spec = ModelSpec.of(model_or_card)
    return [n for n in list_samplers(include_hidden)
            if any(c.fits(spec) and (include_hidden or not c.hidden) for c in sampler_classes(n))]


def check_fits(sampler: str, model_or_card) -> None:
    """A one-line error when ``sampler`` cannot drive this model (before any weights load, given a card)."""
    spec = ModelSpec.of(model_or_card)
    classes = sampler_classes(sampler)
    orders = [c.order for c in classes]
    if spec.order not in orders:
        raise VGenError(f"sampler {sampler!r} does {' / '.join(map(str, orders))} generation but {spec.name} is a "
                        f"{spec.order} model: use one of {', '.join(fitting_samplers(spec))}")
    if not any(c.fits(spec) for c in classes):
        kinds = sorted({k for c in classes if c.order == spec.order for k in (c.conditionings or list_kinds())})
        raise VGenError(f"sampler {sampler!r} drives models conditioned on {' / '.join(kinds)} and {spec.name} reads "
                        f"{spec.conditioning}: use one of {', '.join(fitting_samplers(spec))}")


def plain_sampler(model_or_card) -> str:
    """The model's plain sampler (``ar``, ``var``, ``nar``): what runs when none is named, the baseline others
    are compared to."""
    order = ModelSpec.of(model_or_card).order
    for n in list_samplers(include_hidden=True):
        if any(c.order == order and c.plain for c in sampler_classes(n)):
            return n
    raise VGenError(f"no sampler is registered for {order} models")


def option_names(name: str) -> set[str]:
    """Every option ``name`` takes for some order."""
    return set().union(*(c.Options.names() for c in sampler_classes(name)))


def get_sampler(name: str, model=None, **options) -> Sampler:
    """Sampler ``name`` with ``options``; give ``model`` (or its card) for names serving several orders."""
    return sampler_class(name, model)(**options)


def example_cond(model, k: int, device=None) -> torch.Tensor:
    """``k`` conditions to calibrate a sampler on ``model`` with (``window=auto``): the encoded examples a pipeline
    attached (``model.examples``: its card's example prompts or classes) in turn, else class ids spread over the
    classes. A text model needs the examples: its prompts go through a text encoder the model does not hold."""
    ex = getattr(model, "examples", None)
    if ex is not None:
        return ex[torch.arange(k) % ex.shape[0]].to(device)
    return kind_of(model).fallback(model, k, device)  # class ids spread over the classes; a text model: an error


def sample(model, labels, sampler: str = "ar", seed: int = 0, progress: bool = False,
           codebook: torch.Tensor | None = None, batch_size: int | None = None,
           prefix: torch.Tensor | None = None, draft=None, **options):
    """Sample tokens: returns ``(tokens (N, seq_len), stats dict)``. Sample i uses seed ``seed + i``: it is
    identical to running it alone with that seed. ``prefix`` (N, P): given first tokens to continue; ``draft``: the
    draft model of a sampler that needs one (``cspd``)."""
    from vgen import validate
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "order"):
        raise VGenError(f"model must be a vgen model (vgen.models.load_official, or pipe.model), got "
                        f"{type(model).__name__}")
    s = get_sampler(sampler, model=model, **options)
    dev = next(model.parameters()).device
    cond = kind_of(model).as_tensor(labels, dev)  # class ids, caption features, prompt token ids (B, L)
    if codebook is None and s.needs_codebook and callable(getattr(model, "codebook", None)):
        codebook = model.codebook()  # a model that carries its tokenizer (a transformers model's own VQ)
    seed = validate.seed(seed, cond.shape[0])
    return s(model, cond, [seed + i for i in range(cond.shape[0])], progress, codebook=codebook,
             batch_size=batch_size, prefix=prefix, draft=draft)
