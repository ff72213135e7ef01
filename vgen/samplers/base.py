"""The sampler interface and registry.

A sampler drives any model with the small interface below and never knows its family:

* ``vocab_size``, ``num_classes``, ``seq_len`` (image tokens), ``cond_len`` (condition positions),
  ``grid`` (h, w)
* ``null_cond(cond)``, ``new_cache(batch_size)``
* ``prefill(cond, cache) -> logits (B, V)``, ``decode(tokens, input_pos, cache, attn_mask=None) -> (B, S, V)``

Samplers that relax acceptance by token similarity (GSD, LANTERN) also take the tokenizer's ``codebook``
(V, d); the model itself stays unaware of the tokenizer.

A sampler returns ``(tokens (B, seq_len), stats)``: ``stats`` holds numbers (forward_passes, tokens, seconds,
kv_cache_bytes, nll, accepted_per_step, ...) and ``step_map``, a (B, seq_len) tensor with the forward pass
(0 = prefill) at which each token was decided.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from vgen.errors import VGenError

_REGISTRY: dict[str, type[Sampler]] = {}


@dataclass
class SamplingOptions:
    """Options every token sampler shares. The target distribution is: CFG-guided logits (rows
    [cond; uncond], ``uncond + cfg_scale * (cond - uncond)``), divided by ``temperature``, truncated to
    ``top_k`` (0 = off) then ``top_p`` (1 = off)."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    cfg_scale: float = 1.0
    cfg_interval: int = -1  # official LlamaGen semantics: tokens after index cfg_interval+1 are unguided
    compile: bool = False  # torch.compile the decode step (worth it for long jobs; costs a warm-up)

    def validate(self, vocab_size: int | None = None) -> None:
        if self.temperature < 0:
            raise VGenError(f"temperature must be >= 0, got {self.temperature}: use 1.0 for the model's "
                            "distribution, lower for sharper samples")
        if self.top_k < 0:
            raise VGenError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if vocab_size is not None and self.top_k > vocab_size:
            raise VGenError(f"top_k={self.top_k} is above the vocabulary size {vocab_size}: use 0 (off) "
                            f"or a value in 1..{vocab_size}")
        if not 0.0 < self.top_p <= 1.0:
            raise VGenError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.cfg_scale < 0:
            raise VGenError(f"cfg_scale must be >= 0 (1 = no guidance), got {self.cfg_scale}")
        if self.cfg_interval < -1:
            raise VGenError(f"cfg_interval must be >= -1 (-1 = guide every token), got {self.cfg_interval}")

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0


class Sampler:
    """Base class: subclasses set ``name`` and ``Options`` and implement ``_sample``."""

    name: str = ""
    Options: type = SamplingOptions
    needs_codebook: bool = False  # acceptance uses token similarity in the tokenizer's codebook
    generation: str = "next-token"  # the model interface it drives: next-token (GPT), next-scale (VAR), next-neighbour (NAR)

    def __init__(self, **options):
        fields = {f.name for f in dataclasses.fields(self.Options)}
        unknown = sorted(set(options) - fields)
        if unknown:
            raise VGenError(f"unknown option(s) {unknown} for sampler {self.name!r}; valid options: "
                            f"{sorted(fields)}")
        self.options = self.Options(**options)

    def validate(self, model, cond: torch.Tensor) -> None:
        kind = getattr(model, "generation", "next-token")
        if kind != self.generation:
            fits = [n for n, c in _REGISTRY.items() if c.generation == kind]
            raise VGenError(f"sampler {self.name!r} does {self.generation} generation but {type(model).__name__} is a "
                            f"{kind} model: use one of {', '.join(sorted(fits))}")
        self.options.validate(model.vocab_size)
        if cond.dtype in (torch.int32, torch.int64):
            bad = cond[(cond < 0) | (cond >= model.num_classes)]
            if bad.numel():
                raise VGenError(f"class id {int(bad[0])} out of range: this model has classes "
                                f"0..{model.num_classes - 1}")

    @torch.inference_mode()
    def __call__(self, model, cond: torch.Tensor, seeds: list[int], progress: bool = False,
                 codebook: torch.Tensor | None = None, batch_size: int | None = None):
        """Sample one image per condition. ``batch_size`` caps the samples run in one forward pass (default:
        all); sample i's result depends only on ``cond[i]`` and ``seeds[i]``, never on the batching."""
        self.validate(model, cond)
        if len(seeds) != cond.shape[0]:
            raise VGenError(f"got {len(seeds)} seeds for {cond.shape[0]} conditions: give one seed per sample")
        if batch_size is not None and batch_size < 1:
            raise VGenError(f"batch_size must be >= 1, got {batch_size}")
        kw = {}
        if self.needs_codebook:
            if codebook is None:
                raise VGenError(f"sampler {self.name!r} measures token similarity in the tokenizer's codebook: pass "
                                "codebook=tokenizer.codebook() (a Pipeline does this for you)")
            if codebook.dim() != 2 or codebook.shape[0] < model.vocab_size:
                raise VGenError(f"codebook of shape {tuple(codebook.shape)} does not cover the model's "
                                f"{model.vocab_size} image tokens: pass the (vocab_size, dim) codebook of the "
                                "tokenizer this model was trained with")
            kw["codebook"] = codebook[: model.vocab_size]
        return self._run(model, cond, list(seeds), progress, batch_size or cond.shape[0], **kw)

    def _run(self, model, cond, seeds, progress, batch_size, **kw):
        """Default batching: consecutive chunks of ``batch_size`` (samplers with ragged progress override this
        to refill finished rows instead)."""
        n = cond.shape[0]
        if batch_size >= n:
            return self._sample(model, cond, seeds, progress, **kw)
        parts = [self._sample(model, cond[i:i + batch_size], seeds[i:i + batch_size], progress, **kw)
                 for i in range(0, n, batch_size)]
        return torch.cat([t for t, _ in parts]), merge_stats([(st, t.shape[0]) for t, st in parts])

    def _sample(self, model, cond, seeds, progress, codebook=None):  # pragma: no cover - abstract
        raise NotImplementedError


def merge_stats(parts: list[tuple[dict, int]]) -> dict:
    """Stats of consecutive runs (each with its number of samples) -> stats of the whole: counts and time
    add up, the KV cache is the largest, per-sample means are weighted, step maps are concatenated."""
    out = {}
    for k in parts[0][0]:
        vals = [(st[k], w) for st, w in parts if k in st]
        if isinstance(vals[0][0], torch.Tensor):
            out[k] = torch.cat([v for v, _ in vals])
        elif k in ("forward_passes", "tokens", "seconds"):
            out[k] = sum(v for v, _ in vals)
        elif k in ("kv_cache_bytes", "kv_full_bytes"):
            out[k] = max(v for v, _ in vals)
        elif isinstance(vals[0][0], list):  # per-stage numbers: the largest run's
            out[k] = [max(x) for x in zip(*[v for v, _ in vals])]
        elif isinstance(vals[0][0], (int, float)):
            out[k] = sum(v * w for v, w in vals) / sum(w for _, w in vals)
    return out


# the plain sampler of each generation order: what runs when none is named, and what others are compared to
BASELINES = {"next-token": "ar", "next-scale": "var", "next-neighbour": "nar"}


def baseline_for(generation: str) -> str:
    return BASELINES.get(generation, "ar")


def register_sampler(cls: type[Sampler]) -> type[Sampler]:
    _REGISTRY[cls.name] = cls
    return cls


def list_samplers() -> list[str]:
    return sorted(_REGISTRY)


def get_sampler(name: str, **options) -> Sampler:
    if name not in _REGISTRY:
        raise VGenError(f"unknown sampler {name!r}; available samplers: {', '.join(list_samplers())}")
    return _REGISTRY[name](**options)


def as_cond(labels, device=None) -> torch.Tensor:
    if isinstance(labels, int):
        labels = [labels]
    t = labels if isinstance(labels, torch.Tensor) else torch.as_tensor(labels)
    if t.dim() == 0:
        t = t[None]
    if not t.is_floating_point():
        t = t.long()
    return t.to(device) if device is not None else t


def sample(model, labels, sampler: str = "ar", seed: int = 0, progress: bool = False,
           codebook: torch.Tensor | None = None, batch_size: int | None = None, **options):
    """Sample image tokens: returns ``(tokens (N, seq_len) int64, stats dict)``.

    Sample i uses seed ``seed + i``: it is identical to running it alone with that seed."""
    s = get_sampler(sampler, **options)
    dev = next(model.parameters()).device
    cond = as_cond(labels, dev)
    return s(model, cond, [seed + i for i in range(cond.shape[0])], progress, codebook=codebook,
             batch_size=batch_size)
