"""The interfaces between vgen's parts, written down. Read this module first.

A generative model has a **generation order** (:class:`Order`): how its tokens come into being. A sampler drives
exactly one order and touches a model only through that order's Protocol below, never through its class; a
tokenizer turns pixels into the model's tokens and back. Every question "which samplers fit this model" is
answered by :func:`fitting_samplers` / :func:`check_fits` on a :class:`ModelSpec`, which can be read from a model
or from a pipeline card (so a wrong choice is refused before any weights load).

    config --> Pipeline (card + model + tokenizer) --> Sampler(options) --> model (one Protocol) --> tokens
           --> tokenizer.decode(tokens on the model's token_shape) --> pixels --> Generation.save(folder)

Tokens: ``token_shape`` is the shape of one sample's tokens as its tokenizer reads them ((h, w) for an image
grid, (t, h, w) for a video, (L,) for VAR's flat pyramid of scales); ``token_type`` says whether they are codes
(int64 ids into a vocabulary) or latents (float vectors with a channel count). Samplers hold tokens flat,
(B, prod(token_shape)) in raster order; the pipeline reshapes them for the tokenizer.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from vgen.errors import VGenError

if TYPE_CHECKING:
    from vgen.kernels.kv_cache import KVCache
    from vgen.kernels.staged_cache import CachePolicy, StagedKVCache


class Order(str, enum.Enum):
    """How a model generates: the interface its samplers drive."""
    NEXT_TOKEN = "next-token"          # one token after another in raster order (LlamaGen GPT): NextTokenModel
    NEXT_SCALE = "next-scale"          # a whole token map per scale, coarse to fine (VAR): NextScaleModel
    NEXT_NEIGHBOUR = "next-neighbour"  # one anti-diagonal of the grid per pass (NAR): NextNeighbourModel
    CONTINUOUS_NEXT_TOKEN = "continuous-next-token"  # float latents in raster order from a diffusion head (causal
                                                     # MAR "AR" variant): ContinuousNextTokenModel
    MASKED = "masked"                  # float latents, any subset of positions per step, bidirectional (MAR): MaskedModel

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class TokenType:
    """``codes``: int64 ids in [0, vocab_size). ``latents``: float vectors of ``channels`` values."""
    kind: str
    vocab_size: int | None = None
    channels: int | None = None

    @classmethod
    def codes(cls, vocab_size: int) -> TokenType:
        return cls("codes", vocab_size=int(vocab_size))

    @classmethod
    def latents(cls, channels: int) -> TokenType:
        return cls("latents", channels=int(channels))


# ---- models ---------------------------------------------------------------------------------------------------
@runtime_checkable
class GenerativeModel(Protocol):
    """What every model offers, whatever its order."""
    order: Order
    num_classes: int
    seq_len: int                     # tokens per sample = prod(token_shape)
    token_shape: tuple[int, ...]     # one sample's tokens as the tokenizer reads them
    token_type: TokenType

    def null_cond(self, cond: torch.Tensor) -> torch.Tensor:
        """The unconditional counterpart of ``cond`` for classifier-free guidance (rows [cond; uncond])."""


@runtime_checkable
class NextTokenModel(GenerativeModel, Protocol):
    """Raster-order next-token prediction over a static KV cache whose slots are positions (rollback is free)."""
    vocab_size: int
    cond_len: int                    # condition positions before image token 0

    def new_cache(self, batch_size: int) -> KVCache: ...

    def prefill(self, cond: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Condition (B,) -> logits (B, V) for token 0; fills the cache's condition slots."""

    def decode(self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: KVCache,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens (B, S) at positions (S,) or (B, S) (token i at cond_len + i) -> logits (B, S, V), each the
        next-token distribution after its input."""


@runtime_checkable
class PromptTokenModel(NextTokenModel, Protocol):
    """A next-token model conditioned on prompt token ids (``conditioning = "tokens"``: transformers' image
    generators, :mod:`vgen.models.hf`). ``cond`` is (B, L) int64, prompts left-padded with -1; ``cond_len`` is the
    prompt length of the call, bound by :meth:`prepare`, which every sampler calls first."""

    def prepare(self, cond: torch.Tensor) -> tuple[PromptTokenModel, torch.Tensor]:
        """Check the prompts (one-line errors) -> (a view of this model bound to them, the prompts as fed)."""


def satisfies(obj, protocol) -> bool:
    """Whether ``obj`` has every member of ``protocol`` (looked up with ``hasattr``). ``isinstance`` against a
    runtime-checkable protocol looks members up statically from Python 3.12 on (``inspect.getattr_static``), which
    misses what ``torch.nn.Module`` keeps in ``_modules``: a model's ``tok_embeddings`` is there."""
    import typing_extensions
    return all(hasattr(obj, name) for name in typing_extensions.get_protocol_members(protocol))


@runtime_checkable
class FeatureModel(NextTokenModel, Protocol):
    """A next-token model that also returns its last hidden states (what ``head`` turns into logits: before the
    final norm for vgen's GPT, after it for a transformers model): what a trained draft head (EAGLE,
    :mod:`vgen.models.drafter`) reads. The drafter also uses ``tok_embeddings`` (codes -> vectors, with the (V, d)
    table as ``weight``), ``positions``, ``head`` and ``config`` (the shapes it copies: ``dim``, ``n_head``,
    ``vocab_size``, ``block_size``, ``cls_token_num``, ...); its recipe uses ``teacher_features``."""
    tok_embeddings: torch.nn.Module
    config: Any

    def prefill_features(self, cond: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """``prefill`` plus the hidden state after the condition: (logits (B, V), hidden (B, d))."""

    def decode_features(self, tokens: torch.Tensor, input_pos: torch.Tensor,
                        cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """``decode`` plus the hidden states: (logits (B, S, V), hidden (B, S, d))."""

    def positions(self, h: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def head(self, h: torch.Tensor) -> torch.Tensor: ...

    def teacher_features(self, tokens: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Teacher-forced hidden states over tokens (B, L): (B, L, d), row i predicts token i."""


@runtime_checkable
class NextNeighbourModel(GenerativeModel, Protocol):
    """Next-neighbour prediction (NAR): each head predicts one neighbour, one step along one grid axis."""
    vocab_size: int
    cond_len: int
    neighbour_offsets: tuple[tuple[int, ...], ...]

    def new_cache(self, batch_size: int) -> KVCache: ...

    def prefill(self, cond: torch.Tensor, cache: KVCache) -> torch.Tensor: ...

    def decode_neighbours(self, tokens: torch.Tensor, input_pos: torch.Tensor,
                          cache: KVCache) -> tuple[torch.Tensor, ...]:
        """Tokens (B, S) under the proximity mask -> one (B, S, V) logits tensor per neighbour offset."""


@runtime_checkable
class NextScaleModel(GenerativeModel, Protocol):
    """Next-scale prediction (VAR): every token of a scale at once from the coarser scales."""
    vocab_size: int
    patch_nums: list[int]

    def new_cache(self, batch_size: int, policy: CachePolicy | None = None) -> StagedKVCache: ...

    def scale_logits(self, si: int, cond: torch.Tensor, x: torch.Tensor | None,
                     cache: StagedKVCache) -> torch.Tensor:
        """Scale ``si``'s logits (B, pn*pn, V) from the cache and this scale's input (None for the first)."""

    def start_fhat(self, batch_size: int) -> torch.Tensor: ...

    def next_scale_input(self, si: int, f_hat: torch.Tensor, idx: torch.Tensor): ...


@dataclass
class HeadSample:
    """A head's draw: the token (B, C), and the Gaussian of its last step (mean, log-std, both already divided
    by ``sqrt(abar)`` of the output level and with the temperature applied): the token's density given the path.
    With ``path=True``: ``states`` (S + 1, B, C), the reverse process from the start noise to the last step's output
    (before the division), and ``path_logpdf`` (B,), the sum of the steps' log-densities (float64)."""
    token: torch.Tensor
    mean: torch.Tensor
    log_std: torch.Tensor
    states: torch.Tensor | None = None
    path_logpdf: torch.Tensor | None = None


class DiffusionHeadModel(GenerativeModel, Protocol):
    """A model whose tokens are float latents drawn by a per-token diffusion head (MAR's "Diffusion Loss") from a
    condition vector ``z`` the transformer computes: ``token_type`` is ``latents`` with ``token_channels`` values."""
    token_channels: int
    num_sampling_steps: int          # the head's default number of respaced reverse steps

    def sample_head(self, z: torch.Tensor, noise: torch.Tensor, step_noise: torch.Tensor, temperature: float = 1.0,
                    cfg: float | torch.Tensor = 1.0, num_steps: int | None = None, last_noise: bool = False,
                    stop_sigma: float = 0.0, clip_x0: float = 0.0, path: bool = False,
                    refresh: int = 1, compiled: bool = False) -> HeadSample:
        """Conditions ``z`` (B, D) ((2B, D) rows [cond; uncond] when guided), start noise (B, C), per-step noise
        (steps, B, C) -> the token (B, C) and its last step's Gaussian (see :mod:`vgen.models.diffusion_head`);
        ``path``: also the reverse process's states and their log-density; ``refresh``: run the network every this many
        steps only (a cheaper draft); ``compiled``: run the reverse process through ``torch.compile``."""

    def head_path_logpdf(self, z: torch.Tensor, states: torch.Tensor, temperature: float = 1.0,
                         cfg: float | torch.Tensor = 1.0, num_steps: int | None = None, stop_sigma: float = 0.0,
                         clip_x0: float = 0.0, refresh: int = 1) -> torch.Tensor:
        """log-density (B,) of reverse paths ``states`` (S + 1, B, C) under the head, all steps in one batch."""


@runtime_checkable
class ContinuousNextTokenModel(DiffusionHeadModel, Protocol):
    """Raster-order causal model over float latents with a static KV cache (slots are positions)."""
    cond_len: int

    def new_cache(self, batch_size: int) -> KVCache: ...

    def prefill(self, cond: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Condition (B,) -> the head condition (B, D) for token 0; fills the cache's condition slots."""

    def decode(self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: KVCache,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Latent tokens (B, S, C) at positions (S,) or (B, S) -> head conditions (B, S, D), each for the token
        after its input."""


@runtime_checkable
class MaskedModel(DiffusionHeadModel, Protocol):
    """Bidirectional masked model (MAR): every call sees all known tokens and predicts conditions everywhere."""

    def conditions(self, tokens: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor,
                   unknown: int | None = None) -> torch.Tensor:
        """Tokens (B, L, C) with ``mask`` (B, L) (1 = unknown, to predict), class ids (B,) (the null class for
        the unconditional rows) -> head conditions (B, L, D). ``unknown``: how many tokens every row's mask hides,
        when the caller knows it (no host read of the mask: a sampler's schedule says it)."""


# ---- tokenizers -----------------------------------------------------------------------------------------------
@runtime_checkable
class Tokenizer(Protocol):
    """Pixels in [-1, 1] (B, 3, H, W) <-> tokens (B, *token_shape) for its own grid."""

    def encode(self, pixels: torch.Tensor) -> torch.Tensor: ...

    def decode(self, tokens: torch.Tensor) -> torch.Tensor: ...


# ---- what jobs, the bench and the demo use of a pipeline ----------------------------------------------------------
@runtime_checkable
class SamplingPipeline(Protocol):
    """A model with what sampling needs wired in (tokenizer or decoder, text encoder or processor, draft head): what
    sampling jobs (``vgen sample``), ``vgen bench`` and the demo use of a pipeline. :class:`vgen.pipeline.Pipeline`
    (vgen's models) and :class:`vgen.hf_pipeline.TransformersPipeline` (transformers' image generators) implement
    it; both ``generate`` methods sample and decode through one function, :func:`vgen.pipeline.sample_and_decode`,
    which resolves ``compile=auto`` for the whole call (:meth:`vgen.samplers.base.Sampler.resolved`), so the stats
    record what ran."""
    card: Any            # the model card it was loaded from (vgen.cards.Card), read before any weights load
    model: Any           # the model the samplers drive

    @property
    def device(self) -> torch.device: ...

    def make_sampler(self, sampler: str | None = None, **options): ...

    def encode(self, cond) -> torch.Tensor:
        """A checked condition (vgen.conditions) -> what the samplers read."""

    def sample_tokens(self, sampler, cond: torch.Tensor, seeds: list[int], batch_size: int | None = None,
                      progress: bool = False, prefix: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]: ...

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens (N, ...) -> uint8 pixels (N, 3, H, W) (video: (N, T, 3, H, W))."""

    def generate(self, *args, **kwargs): ...

    def quantize(self, mode: str, group_size: int = 32) -> dict:
        """Store the sampled transformer's weight matrices in int8 / int4 (:mod:`vgen.kernels.quant`), in place;
        returns what changed (recorded as ``quantization`` in the stats)."""


# ---- what a sampler needs to know about a model, from the model or from its card -------------------------------
@dataclass(frozen=True)
class ModelSpec:
    """The facts samplers check their options against: read from a loaded model or from a pipeline card, so the
    same check runs before weights load and after."""
    order: Order
    num_classes: int
    token_type: TokenType
    name: str = "this model"
    token_shape: tuple[int, ...] | None = None  # (h, w) image grid, (t, h, w) video grid; None: not known
    conditioning: str = "class"  # class (class ids) | text (prompts through a text encoder): vgen.conditions |
                                 # tokens (prompt token ids (B, L), -1 = left padding: a PromptTokenModel)

    @property
    def is_video(self) -> bool:
        return self.token_shape is not None and len(self.token_shape) == 3

    @property
    def vocab_size(self) -> int | None:
        return self.token_type.vocab_size

    def token_mismatch(self, other: ModelSpec) -> tuple[str, object, object] | None:
        """The first of generation order, token type, token grid and classes where ``other`` (e.g. a draft)
        differs from this model: (what, other's, this one's), or None when it makes the same tokens."""
        for what, a, b in (("generation order", other.order, self.order),
                           ("token type", other.token_type, self.token_type),
                           ("token grid", other.token_shape, self.token_shape),
                           ("conditioning", other.conditioning, self.conditioning),
                           ("number of classes", other.num_classes, self.num_classes)):
            if a != b:
                return what, a, b
        return None

    def check_draft(self, draft: ModelSpec, name: str = "the draft") -> None:
        """A draft must make this model's tokens: the same order, token type, grid and classes (one-line error)."""
        bad = self.token_mismatch(draft)
        if bad:
            raise VGenError(f"{name} has another {bad[0]} ({bad[1]}) than the target ({bad[2]}): a draft must be "
                            "trained on the target's tokenizer and grid")

    @classmethod
    def of(cls, model_or_card) -> ModelSpec:
        """The spec of a model, of a pipeline card (:class:`vgen.cards.Card`: its ``spec``) or a spec itself."""
        if isinstance(model_or_card, ModelSpec):
            return model_or_card
        spec = getattr(model_or_card, "spec", None)
        if isinstance(spec, ModelSpec):
            return spec
        m = model_or_card
        shape = getattr(m, "token_shape", None)
        from vgen.conditions import kind_of
        kind = kind_of(m)
        return cls(Order(m.order), int(m.num_classes) if kind.has_classes else 0, m.token_type, type(m).__name__,
                   tuple(shape) if shape is not None else None, kind.name)

    @classmethod
    def from_card(cls, card) -> ModelSpec:
        """The spec a pipeline card (:class:`vgen.cards.Card`) states, before any weights load."""
        return cls(card.order, card.num_classes, card.token_type, f"this model ({card.name})", card.token_shape,
                   card.model_conditioning)
