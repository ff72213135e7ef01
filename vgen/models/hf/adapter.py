"""The transformers adapter's core (:mod:`vgen.models.hf` explains it): :class:`TransformersFamily`, what a family
module registers (:func:`register_family`; :class:`FamilyBase` its defaults); :class:`Family`, the per-model facts a
family's ``wrap`` builds; :class:`TransformersModel`, the next-token model; :class:`TransformersCache`, vgen's static
cache in the model's own slot layout."""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

import torch
import torch.nn as nn

from vgen.errors import VGenError
from vgen.interfaces import Order, TokenType
from vgen.kernels.kv_cache import KVCache
from vgen.models.gpt import GPTConfig


@dataclass
class Family:
    """What the adapter needs from one transformers architecture (built by its family's ``wrap``)."""
    name: str
    decoder: nn.Module                                  # the transformer: inputs_embeds -> last_hidden_state (normed)
    embed_prompt: Callable[[torch.Tensor], torch.Tensor]  # prompt ids (B, L) -> (B, L, d) (reads the table's module
    #                                                     at call time: quantize_weights replaces it)
    embed_codes: Callable[[torch.Tensor], torch.Tensor]   # image codes (B, S) -> (B, S, d)
    logits: Callable[[torch.Tensor], torch.Tensor]        # hidden (..., d) -> image-code logits (..., V)
    vocab_size: int                                     # image codes
    grid: tuple[int, int]                               # (h, w) codes
    null_prompt: Callable[[torch.Tensor], torch.Tensor]   # prompt ids (B, L), -1 = padding -> the CFG row (B, L')
    pad_id: int                                         # the id fed at padded slots (hidden anyway)
    text_vocab: int                                     # valid prompt ids: 0..text_vocab-1
    max_positions: int | None = None                    # the model's context (positions), None: unbounded
    row_end: int | None = None                          # a token forced after each grid row (its id), or None
    decode_image: Callable[[torch.Tensor], torch.Tensor] | None = None  # codes (B, h, w) -> pixels [-1, 1] (B, 3, H, W)
    codebook: Callable[[], torch.Tensor] | None = None   # the VQ's code vectors (V, d): gsd / lantern's similarity
    config: dict | None = None                          # what identifies the shapes (pass-cost tables)
    prompt_end: tuple[int, ...] = ()                    # the tokens that open the image: every prompt ends with them
    prompt_text: Callable[[str], str] | None = None     # a user's prompt -> the text to tokenize after BOS (a family
    #                                                     whose processor does not build image prompts itself)
    sampling: dict | None = None                        # the model card's recommended sampling settings


@runtime_checkable
class TransformersFamily(Protocol):
    """One transformers architecture vgen drives, registered where it is defined (``register_family(...)`` at the
    bottom of ``vgen/models/hf/<family>.py``): all that :func:`vgen.models.from_transformers` and
    :mod:`vgen.hf_pipeline` know of it, so neither names a family. :class:`FamilyBase` gives the defaults a family
    overrides (``wrap`` and ``card_fields`` it must write)."""

    name: str      # the registry name, and the ``model_type`` of its folders' config.json
    releases: str  # the releases it covers, as error messages list them (e.g. "Lumina-mGPT, Anole")

    def model_class(self) -> type:
        """The transformers class whose ``from_pretrained`` loads a folder of this family."""

    def matches(self, config: dict) -> bool:
        """Whether a folder's ``config.json`` (read, no weights) is this family's."""

    def detect(self, hf_model: nn.Module) -> bool:
        """Whether a loaded model is this family's."""

    def wrap(self, hf_model: nn.Module, height: int | None, width: int | None, **options) -> Family:
        """The model's facts: its decoder, the layout of its image tokens, its CFG row, its VQ decoder."""

    def decoder(self, hf_model: nn.Module) -> nn.Module | None:
        """The module ``wrap`` names its decoder (whose linear layers ``quantize=`` takes), found on a model that may
        still be on the meta device (no weights read); None: unknown before ``wrap`` (quantized after loading)."""

    def files(self, folder: Path) -> dict[str, Path]:
        """Files beside the weights that ``wrap`` takes, by option name (e.g. an image decoder ``wrap`` takes as a
        module, loaded by :mod:`vgen.hf_pipeline`), or a one-line error naming where a missing one comes from."""

    def load_options(self, name: str, folder: Path, config: dict, height: int | None,
                     width: int | None) -> tuple[int | None, int | None, dict]:
        """Before a folder's weights load: (height, width, ``wrap`` options): the release's default grid (``name``:
        what the user gave, e.g. a repository whose name states a resolution) and what its other files state."""

    def card_fields(self, name: str, folder: Path, config: dict) -> dict:
        """A folder's card fields, read without weights: ``token_shape``, ``vocab_size``, ``sampling`` (the model
        card's recommended settings)."""

    def prompt_options(self, hf_model: nn.Module, processor, height: int | None, width: int | None,
                       negative_prompt: str | None, options: dict) -> tuple[int | None, int | None, dict]:
        """(height, width, ``wrap`` options) for a pipeline with this processor (None: prompt ids only): the grid
        the processor states, the negative prompt's ids (the CFG row)."""

    def tokenize(self, processor, hf_model: nn.Module, family: Family, prompt: str) -> torch.Tensor | None:
        """One prompt -> its ids (L,) for image generation, as the model's processor builds them; None: the family
        has no prompt template."""

    def zoo_prompt(self, tokenizer, card: dict) -> Callable[[str | None], list[int]]:
        """For a zoo model of this family (``hf_pipeline.json`` = ``card``, its caption ``tokenizer``): a prompt
        (None: the null prompt) -> its ids."""


class FamilyBase:
    """The defaults of :class:`TransformersFamily`: a folder is the family's when its ``model_type`` is ``name``, a
    model when it is a ``model_class()``; no extra files or options; prompts through ``Family.prompt_text`` after
    BOS; no zoo layout."""
    name = ""
    releases = ""

    def model_class(self) -> type:
        raise VGenError(f"the transformers family {self.name!r} names no model class: it loads no folders")

    def matches(self, config: dict) -> bool:
        return config.get("model_type") == self.name

    def detect(self, hf_model: nn.Module) -> bool:
        return isinstance(hf_model, self.model_class())

    def wrap(self, hf_model: nn.Module, height: int | None = None, width: int | None = None, **options) -> Family:
        raise NotImplementedError

    def decoder(self, hf_model: nn.Module) -> nn.Module | None:
        return None

    def files(self, folder: Path) -> dict[str, Path]:
        return {}

    def load_options(self, name: str, folder: Path, config: dict, height: int | None,
                     width: int | None) -> tuple[int | None, int | None, dict]:
        return height, width, {}

    def card_fields(self, name: str, folder: Path, config: dict) -> dict:
        raise NotImplementedError

    def prompt_options(self, hf_model: nn.Module, processor, height: int | None, width: int | None,
                       negative_prompt: str | None, options: dict) -> tuple[int | None, int | None, dict]:
        return height, width, options

    def tokenize(self, processor, hf_model: nn.Module, family: Family, prompt: str) -> torch.Tensor | None:
        if family.prompt_text is None:
            return None
        tok = getattr(processor, "tokenizer", processor)
        ids = tok(family.prompt_text(prompt), add_special_tokens=False, return_tensors="pt").input_ids[0]
        return torch.cat([torch.tensor([hf_model.config.bos_token_id]), ids])

    def zoo_prompt(self, tokenizer, card: dict) -> Callable[[str | None], list[int]]:
        raise VGenError(f"{self.releases or self.name} models have no zoo layout (hf_pipeline.json)")


class _Given(FamilyBase):
    """A family registered as ``register_family(name, detect, wrap)``: ``from_transformers`` only (no folders)."""

    def __init__(self, name: str, detect: Callable[[nn.Module], bool], wrap: Callable[..., Family]):
        self.name, self.detect, self.wrap = name, detect, wrap

    def matches(self, config: dict) -> bool:
        return False


_FAMILIES: list[TransformersFamily] = []


def registered_families() -> list[TransformersFamily]:
    """The registered families, in registration order."""
    return list(_FAMILIES)


def registered() -> list[tuple[str, Callable[[nn.Module], bool], Callable[..., Family]]]:
    """The registered families as (name, detect, wrap), in registration order."""
    return [(f.name, f.detect, f.wrap) for f in _FAMILIES]


def register_family(family: TransformersFamily | str, detect: Callable[[nn.Module], bool] | None = None,
                    wrap: Callable[..., Family] | None = None) -> None:
    """Make ``from_transformers`` and :mod:`vgen.hf_pipeline` accept the models and folders ``family`` recognises
    (a :class:`TransformersFamily`; one of the same name is replaced). ``register_family(name, detect, wrap)``
    (``wrap(hf_model, height, width) -> Family``) registers a family for ``from_transformers`` alone."""
    if isinstance(family, str):
        family = _Given(family, detect, wrap)
    elif detect is not None or wrap is not None or not isinstance(family, TransformersFamily):
        raise TypeError("register_family takes a TransformersFamily, or (name, detect, wrap)")
    for i, f in enumerate(_FAMILIES):
        if f.name == family.name:
            _FAMILIES[i] = family
            return
    _FAMILIES.append(family)


class TransformersCache(KVCache):
    """vgen's static KV cache for a transformers decoder. Masks, ``limit``, ``bucket``, ``write_at`` and ``move`` speak
    vgen's slots (prompt slots, one slot per grid token, then a tree pass's scratch slots); the keys live in the
    model's own layout underneath (a row-end slot after each grid row when the family forces one, a row-end slot
    beside each scratch slot, and one slot no query ever reads). ``pad`` (B,): each row's left padding, set by the
    prefill."""

    def __init__(self, layout: _Layout, n_layer: int, batch_size: int, n_kv_head: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device):
        self.layout = layout
        self.hf_max = layout.hf_len(max_len) + 1  # + the scratch slot
        super().__init__(n_layer, batch_size, n_kv_head, self.hf_max, head_dim, dtype, device)
        self.max_len = max_len
        self.slots = torch.arange(max_len, device=device)
        self.length = max_len
        self.hf_length = self.hf_max
        self.pad = torch.zeros(batch_size, dtype=torch.long, device=device)
        layout.columns(self.hf_max, device)  # every pass slices these (built once)

    def limit(self, n: int | None) -> None:
        super().limit(n)
        self.hf_length = self.hf_max if n is None else min(self.hf_max - 1, self.layout.hf_len(self.length))

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy keys and values from vgen slots ``src`` to ``dst`` ((B, M) each; a tree pass keeps its accepted path),
        with the forced row end that follows a ``dst`` which ends a grid row (written beside its scratch slot)."""
        lay = self.layout
        if not lay.row_end:
            return super().move(src, dst)
        ms, md = lay.slot(src), lay.slot(dst)
        super().move(ms, md)
        end = lay.ends_row(dst)
        super().move(torch.where(end, ms + 1, md), torch.where(end, md + 1, md))  # elsewhere: a copy onto itself

    def update(self, layer: int, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, H, S, D) at model slots ``input_pos`` ((S,) or (B, S)); K, V over the readable slots."""
        kc, vc = self.k[layer], self.v[layer]
        if input_pos.dim() == 1:
            kc[:, :, input_pos] = k
            vc[:, :, input_pos] = v
        else:
            b = self.rows[: k.shape[0], None]
            kc[b, :, input_pos] = k.transpose(1, 2)
            vc[b, :, input_pos] = v.transpose(1, 2)
        return kc[:, :, : self.hf_length], vc[:, :, : self.hf_length]


class _CacheView:
    """What a transformers attention layer calls: ``update(k, v, layer_idx)`` writes at this pass's slots."""

    def __init__(self, cache: TransformersCache, pos: torch.Tensor):
        self.cache, self.pos = cache, pos

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.cache.update(layer_idx, self.pos, key_states, value_states)


class _Layout:
    """vgen slots -> the model's slots for prompts of ``C`` tokens and ``L`` grid codes, the grid ``w`` codes wide
    with a forced token after each row (``row_end``) or none. vgen slots from ``base`` = C + L on are a tree pass's
    scratch slots (:mod:`vgen.kernels.tree`); with row ends each takes two model slots, the node's and its row end's
    (written only when the node's position ends a row)."""

    def __init__(self, C: int, w: int, row_end: bool, L: int):
        self.C, self.w, self.row_end, self.base = C, w, row_end, C + L
        self.hf_base = self._grid_len(self.base)
        self._columns: dict = {}

    def _grid_slot(self, s):
        img = s - self.C
        return s + (img.clamp_min(0) if isinstance(img, torch.Tensor) else max(img, 0)) // self.w

    def _grid_len(self, n: int) -> int:
        if n <= self.C or not self.row_end:
            return n
        last = n - 1
        return self._grid_slot(last) + 1 + int((last - self.C) % self.w == self.w - 1)

    def slot(self, s):
        """The model slot of vgen slot ``s`` (an int or a tensor)."""
        if not self.row_end:
            return s
        scratch = self.hf_base + 2 * (s - self.base)
        if isinstance(s, torch.Tensor):
            return torch.where(s >= self.base, scratch, self._grid_slot(s))
        return scratch if s >= self.base else self._grid_slot(s)

    def ends_row(self, pos: torch.Tensor) -> torch.Tensor:
        """Whether the code at vgen position ``pos`` (a grid slot) is the last of its row: a row end follows it."""
        return ((pos - self.C) % self.w == self.w - 1) & (pos >= self.C) & (pos < self.base)

    def hf_len(self, n: int) -> int:
        """Model slots that cover vgen slots [0, n), with the row end after slot n - 1 when it ends a row."""
        if n <= self.base or not self.row_end:
            return self._grid_len(n)
        return self.hf_base + 2 * (n - self.base)

    def columns(self, hf_len: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For each model slot t < hf_len: the vgen slot whose visibility it takes (a row end: its row's last
        token), whether it is a row end, and t itself. A slot's entries do not depend on hf_len, so they are built
        once per device for the longest length asked and sliced: a pass allocates nothing here."""
        key = str(device)
        have = self._columns.get(key)
        if have is None or have[2].numel() < hf_len:
            t = torch.arange(hf_len, device=device)
            img = (t - self.C).clamp_min(0)
            row, col = img // (self.w + 1), img % (self.w + 1)
            is_end = (t >= self.C) & (col == self.w) if self.row_end else torch.zeros_like(t, dtype=torch.bool)
            src = torch.where(t < self.C, t, self.C + row * self.w + col.clamp_max(self.w - 1)) if self.row_end else t
            if self.row_end:  # the scratch region: (node, its row end) per scratch slot
                j = (t - self.hf_base).clamp_min(0)
                scratch = t >= self.hf_base
                src = torch.where(scratch, self.base + j // 2, src)
                is_end = torch.where(scratch, j % 2 == 1, is_end)
            have = self._columns[key] = (src, is_end, t)
        return tuple(x[:hf_len] for x in have)


def _ending_with(cond: torch.Tensor, end: tuple[int, ...]) -> torch.Tensor:
    """Left-padded prompts (B, L) with ``end`` appended to each row that does not already end with it (rows that do
    get one more column of padding instead)."""
    if not end:
        return cond
    k = len(end)
    tail = torch.tensor(end, dtype=cond.dtype, device=cond.device)
    has = (cond[:, -k:] == tail).all(1) if cond.shape[1] >= k else torch.zeros(cond.shape[0], dtype=torch.bool,
                                                                              device=cond.device)
    if bool(has.all()):
        return cond
    grown = torch.cat([cond, tail.expand(cond.shape[0], -1)], 1)
    kept = torch.cat([cond.new_full((cond.shape[0], k), -1), cond], 1)
    return torch.where(has[:, None], kept, grown)


class TransformersModel(nn.Module):
    """A :class:`vgen.interfaces.NextTokenModel` over a transformers image generator (see the module docstring).
    ``hf`` is the wrapped model itself (its parameters are this module's)."""
    order = Order.NEXT_TOKEN
    num_classes = 0
    conditioning = "tokens"
    auto_compiles = False  # compile=auto leaves transformers' forward eager (compile=true still compiles)

    def __init__(self, family: Family, hf_model: nn.Module):
        super().__init__()
        self.family = family
        self.hf = hf_model
        self.cond_len = 0  # bound per call by prepare()
        self.examples = None
        params = inspect.signature(family.decoder.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        cfg = family.decoder.config
        self._n_layer = cfg.num_hidden_layers
        self._n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self._head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self._eager = getattr(cfg, "_attn_implementation", "sdpa") not in ("sdpa", "flash_attention_2",
                                                                            "flex_attention")

    def quantize_weights(self, mode: str, group_size: int = 32) -> dict:
        """The decoder's linear layers (what runs once per token) in int8 / int4 and its input table in int8, with any
        output layer tied to it (:func:`vgen.kernels.quant.quantize_embedding`), in place; the image head, vision
        towers and the VQ stay as loaded. Returns what changed and the model's weight bytes."""
        from vgen.kernels.quant import quantize_embedding, quantize_linears, weight_bytes
        dec = self.family.decoder
        info = quantize_linears(dec, mode, group_size)
        emb = dec.get_input_embeddings() if hasattr(dec, "get_input_embeddings") else None
        info["embeddings"] = quantize_embedding(self.hf, emb) if type(emb) is nn.Embedding else 0
        if info["embeddings"]:  # the float table, read for the last time (a mapped file's pages leave memory)
            from vgen.models.loading import page_out
            page_out(emb.weight)
        info["weight_bytes"] = weight_bytes(self.hf)
        return info

    # ---- what samplers read -----------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.family.vocab_size

    @property
    def token_shape(self) -> tuple[int, int]:
        return self.family.grid

    @property
    def seq_len(self) -> int:
        return self.family.grid[0] * self.family.grid[1]

    @property
    def token_type(self) -> TokenType:
        return TokenType.codes(self.family.vocab_size)

    def config_dict(self) -> dict:
        return {"family": self.family.name, "grid": list(self.family.grid), "cond_len": self.cond_len,
                **(self.family.config or {})}

    def codebook(self) -> torch.Tensor:
        """The model's own VQ codebook (V, d): what gsd and lantern measure token similarity in."""
        if self.family.codebook is None:
            raise VGenError(f"{self.family.name} exposes no VQ codebook: pass codebook= to the sampler")
        return self.family.codebook()

    def decode_image(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, h, w) -> pixels in [-1, 1] (B, 3, H, W) through the model's own VQ decoder."""
        return self.family.decode_image(codes)

    def _layout(self) -> _Layout:
        return _Layout(self.cond_len, self.family.grid[1], self.family.row_end is not None, self.seq_len)

    # ---- conditions -----------------------------------------------------------------------------------------
    def prepare(self, cond: torch.Tensor) -> tuple[TransformersModel, torch.Tensor]:
        """Check prompt ids (B, L) (-1 = left padding) and bind a view of this model to them: (view, cond), with the
        family's image opening appended where a prompt lacks it (Lumina-mGPT, Anole) and left-padded further when
        the null prompt (Emu3's negative prompt) is longer. One-line errors before any forward pass."""
        if not isinstance(cond, torch.Tensor) or cond.dim() != 2 or cond.is_floating_point() or cond.dtype == torch.bool:
            shape = tuple(cond.shape) if isinstance(cond, torch.Tensor) else type(cond).__name__
            raise VGenError(f"{self.family.name} reads prompt token ids: give an int64 tensor (B, L) of equal-length "
                            f"prompts (-1 = left padding), got {getattr(cond, 'dtype', '')} {shape}")
        cond = cond.long()
        if cond.shape[1] == 0:
            raise VGenError("the prompts are empty: give at least one token per prompt")
        valid = cond >= 0
        if not bool(valid[:, -1].all()) or bool((valid[:, :-1] & ~valid[:, 1:]).any()):
            raise VGenError("prompt padding must be on the left (-1 before the first real token) and every prompt "
                            "needs a last real token")
        if int(cond.max()) >= self.family.text_vocab or bool((cond < -1).any()):
            raise VGenError(f"prompt ids must be in 0..{self.family.text_vocab - 1} (-1 = padding): tokenize with "
                            "this model's processor")
        cond = _ending_with(cond, self.family.prompt_end)
        null = self.family.null_prompt(cond)
        L = max(cond.shape[1], null.shape[1])
        if cond.shape[1] < L:
            cond = torch.cat([cond.new_full((cond.shape[0], L - cond.shape[1]), -1), cond], 1)
        hf_len = _Layout(L, self.family.grid[1], self.family.row_end is not None, self.seq_len).hf_len(L + self.seq_len)
        if self.family.max_positions is not None and hf_len > self.family.max_positions:
            raise VGenError(f"a {L}-token prompt plus the {hf_len - L} image positions exceeds {self.family.name}'s "
                            f"context of {self.family.max_positions} positions: shorten the prompt")
        view = self if L == self.cond_len else copy.copy(self)
        view.cond_len = L
        view.examples = cond[:1]
        return view, cond

    def null_cond(self, cond: torch.Tensor) -> torch.Tensor:
        """The CFG row of each prompt (Janus: every token but BOS and begin-of-image padded, as transformers does;
        Emu3: the negative prompt, or the prompt's last token), left-padded to the prompts' length."""
        null = self.family.null_prompt(cond)
        if null.shape[1] > cond.shape[1]:
            raise VGenError("the null prompt is longer than the prompts: call model.prepare(cond) first")
        return torch.cat([null.new_full((null.shape[0], cond.shape[1] - null.shape[1]), -1), null], 1)

    # ---- cache and passes -----------------------------------------------------------------------------------
    def new_cache(self, batch_size: int, max_len: int | None = None, dtype=None, device=None) -> TransformersCache:
        w = next(self.hf.parameters())
        return TransformersCache(self._layout(), self._n_layer, batch_size, self._n_kv,
                                 max_len or self.cond_len + self.seq_len, self._head_dim, dtype or w.dtype,
                                 device or w.device)

    def _run(self, x: torch.Tensor, slots: torch.Tensor, rope_pos: torch.Tensor, mask: torch.Tensor,
             cache: TransformersCache) -> torch.Tensor:
        """The decoder over embeddings x (B, S, d) written at model slots ``slots`` ((S,) or (B, S)) with RoPE
        positions (B, S) and a boolean mask (B or 1, 1, S, readable model slots): the last hidden states (normed)."""
        if self._eager:
            mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(~mask, torch.finfo(x.dtype).min)
        out = self.family.decoder(inputs_embeds=x, attention_mask=mask, position_ids=rope_pos, use_cache=True,
                                  **{self._cache_kw: _CacheView(cache, slots)})
        return out.last_hidden_state

    def prefill(self, cond: torch.Tensor, cache: TransformersCache) -> torch.Tensor:
        """Prompts (B, C) (-1 = left padding) -> logits (B, V) for grid token 0; fills the prompt slots."""
        return self.head(self._prefill_hidden(cond, cache))

    def prefill_features(self, cond: torch.Tensor, cache: TransformersCache) -> tuple[torch.Tensor, torch.Tensor]:
        """``prefill`` plus the hidden state after the prompt (B, d): what a draft head reads."""
        h = self._prefill_hidden(cond, cache)
        return self.head(h), h

    def _prefill_hidden(self, cond: torch.Tensor, cache: TransformersCache) -> torch.Tensor:
        valid = cond >= 0
        cache.pad = (~valid).sum(1)
        cache.mask_keys(valid)
        C = cond.shape[1]
        pos = torch.arange(C, device=cond.device)
        x = self.family.embed_prompt(torch.where(valid, cond, self.family.pad_id))
        mask = cache.causal_mask(pos) | (cache.slots[: cache.length] == pos[:, None])[None, None]
        mask = cache.visible(mask)
        cols, _, _ = cache.layout.columns(cache.hf_length, cond.device)
        h = self._run(x, pos, (pos[None] - cache.pad[:, None]).clamp_min(0), mask[..., cols.clamp_max(mask.shape[-1] - 1)]
                      & (cols < mask.shape[-1]), cache)
        return h[:, -1]

    def decode(self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: TransformersCache,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Grid codes (B, S) at vgen slots ``input_pos`` ((S,) or (B, S); code i at cond_len + i) -> logits
        (B, S, V), each the distribution of the next code (after a forced row end where one follows)."""
        return self.head(self._decode_hidden(tokens, input_pos, cache, attn_mask))

    def decode_features(self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: TransformersCache,
                        attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``decode`` plus the hidden states (B, S, d) the logits come from (after a forced row end: its state)."""
        h = self._decode_hidden(tokens, input_pos, cache, attn_mask)
        return self.head(h), h

    def _decode_hidden(self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: TransformersCache,
                       attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, S = tokens.shape
        mask = cache.visible(cache.causal_mask(input_pos) if attn_mask is None else attn_mask)
        lay = cache.layout
        x = self.family.embed_codes(tokens)
        hf_len = cache.hf_length
        n_v = mask.shape[-1]
        write = cache.write_slots  # a tree pass: nodes written at scratch slots, RoPE from their positions
        if not lay.row_end:  # model slots are vgen slots: the mask as it is (a never-read scratch column aside)
            m = mask if hf_len == n_v else torch.nn.functional.pad(mask, (0, hf_len - n_v))
            rope = (input_pos if input_pos.dim() == 2 else input_pos[None]) - cache.pad[:, None]
            return self._run(x, input_pos if write is None else write, rope, m, cache)
        cols, is_end, t = lay.columns(hf_len, tokens.device)
        ok = cols < n_v
        cols = cols.clamp_max(n_v - 1)
        pos = input_pos if input_pos.dim() == 2 else input_pos[None].expand(B, -1)
        rslots = lay.slot(pos)                                          # (B, S) model positions (RoPE)
        wslots = rslots if write is None else lay.slot(write if write.dim() == 2 else write[None].expand(B, -1))
        ends = lay.ends_row(pos)
        k = int(ends.sum(1).max())  # host read: how many row ends this pass feeds (0 on most AR steps)
        if write is not None:  # a scratch row end is readable only where this pass writes one (its node ends a row)
            written = torch.zeros(B, hf_len + 1, dtype=torch.bool, device=tokens.device)
            written.scatter_(1, torch.where(ends & (wslots >= lay.hf_base), wslots + 1, hf_len), True)
            scratch_end = is_end & (t >= lay.hf_base)
            ok = (ok[None] & (~scratch_end[None] | written[:, :hf_len]))[:, None, None]
        if k == 0:
            m = mask[..., cols] & ok
            hide = is_end[None, None, :] & (wslots[:, :, None] + 1 == t)
            m = m & ~hide[:, None]
            w = wslots if input_pos.dim() == 2 or write is not None else lay.slot(input_pos)
            return self._run(x, w, rslots - cache.pad[:, None], m, cache)
        # feed the forced row end after each row's last code in this pass: k extra queries per row
        ar = torch.arange(S, device=tokens.device)
        order = torch.where(ends, ar, S).sort(1).values[:, :k]       # (B, k) the row-ending queries, in order
        real = order < S
        src = order.clamp_max(S - 1)
        scratch = cache.hf_max - 1
        end_slots = torch.where(real, wslots.gather(1, src) + 1, scratch)
        all_slots = torch.cat([wslots, end_slots], 1)                 # (B, S + k) where each query writes
        rope = torch.cat([rslots, rslots.gather(1, src) + 1], 1) - cache.pad[:, None]
        xe = self.family.embed_prompt(torch.full((B, k), self.family.row_end, device=tokens.device))
        mrows = mask.expand(B, -1, -1, -1)
        mrows = torch.cat([mrows, mrows.gather(2, src[:, None, :, None].expand(-1, 1, -1, n_v))], 2)
        m = mrows[..., cols] & ok
        hide = is_end[None, None, :] & (all_slots[:, :, None] + 1 == t)
        hide[:, S:] = False  # a row end reads itself
        m = m & ~hide[:, None]
        h = self._run(torch.cat([x, xe], 1), all_slots, rope, m, cache)
        out = h[:, :S].clone()
        rows = torch.arange(B, device=tokens.device)[:, None].expand(-1, k)
        out[rows[real], src[real]] = h[:, S:][real]
        return out

    # ---- what a trained draft head reads (vgen.interfaces.FeatureModel: sampler eagle) ------------------------
    # The features are the decoder's output as transformers returns it (after its final norm) and ``head`` is the
    # family's image-code head on them; the head's positions are a 1-D RoPE over vgen slots of its own.
    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., d) -> float image-code logits (..., V)."""
        return self.family.logits(h).float()

    @property
    def config(self) -> GPTConfig:
        """The shapes a draft head copies (:class:`vgen.models.drafter.Drafter`): the decoder's width, heads and
        norm epsilon, the codes and the grid; ``cls_token_num`` 0 (prompt lengths vary per call)."""
        cfg = self.family.decoder.config
        return GPTConfig(dim=cfg.hidden_size, n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads,
                         vocab_size=self.vocab_size, block_size=self.seq_len, cls_token_num=0,
                         norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-5)))

    @property
    def tok_embeddings(self) -> "CodeEmbedding":
        """Codes -> the decoder's input vectors (the family's code embedding), with ``weight`` the (V, d) table."""
        return CodeEmbedding(self.family.embed_codes, self.vocab_size, next(self.hf.parameters()).device)

    def positions(self, h: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A draft head's positions: (h, 1-D RoPE rows (S, hd/2, 2) of its head size at vgen slots ``input_pos``)."""
        c = self.config
        n = int(input_pos.max()) + 1 if input_pos.numel() else 1
        return h, rope_table_1d(max(n, self.cond_len + self.seq_len), c.head_dim, c.rope_base).to(h.device)[input_pos]

    def teacher_features(self, tokens: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Teacher-forced hidden states over codes (B, L) after prompts ``cond`` (bound by :meth:`prepare`):
        (B, L, d), row i predicts code i (row 0: the state after the prompt)."""
        if cond.shape[1] != self.cond_len:
            raise VGenError("call model.prepare(cond) first: teacher_features reads the prompts of its call")
        if tokens.dim() != 2 or tokens.shape[1] != self.seq_len:
            raise VGenError(f"teacher_features takes codes (B, {self.seq_len}), got shape {tuple(tokens.shape)}")
        cache = self.new_cache(tokens.shape[0])
        cache.limit(None)
        h0 = self._prefill_hidden(cond, cache)
        pos = self.cond_len + torch.arange(tokens.shape[1] - 1, device=tokens.device)
        return torch.cat([h0[:, None], self._decode_hidden(tokens[:, :-1], pos, cache)], 1)


class CodeEmbedding:
    """``embed(codes)`` as a draft head calls its target's token embedding; ``weight``: the (V, d) table of every
    code's vector (computed when read)."""

    def __init__(self, embed: Callable[[torch.Tensor], torch.Tensor], vocab_size: int, device):
        self.embed, self.vocab_size, self.device = embed, vocab_size, device

    def __call__(self, codes: torch.Tensor) -> torch.Tensor:
        return self.embed(codes)

    @property
    def weight(self) -> torch.Tensor:
        return self.embed(torch.arange(self.vocab_size, device=self.device)[None])[0]


def rope_table_1d(n: int, head_dim: int, base: float) -> torch.Tensor:
    """(n, head_dim // 2, 2) cos / sin rows of a 1-D RoPE over positions 0..n-1."""
    half = head_dim // 2
    freqs = 1.0 / (base ** (torch.arange(half, dtype=torch.float32) * 2 / head_dim))
    ang = torch.outer(torch.arange(n, dtype=torch.float32), freqs)
    return torch.stack([ang.cos(), ang.sin()], -1)
