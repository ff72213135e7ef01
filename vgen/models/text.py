"""Prompts -> caption features, the way LlamaGen's ``sample_t2i.py`` and ``language/t5.py`` make them.

A T5 encoder (transformers' ``T5EncoderModel``: FLAN-T5-XL for the released LlamaGen-T2I, a zoo-sized one trained
here for ``photos-t2i``) and its tokenizer, both read from one local folder (or a hub id already in the local
Hugging Face cache; nothing is downloaded):

1. tokenize to ``max_tokens`` positions (the GPT's ``cls_token_num``: 120 for LlamaGen-T2I), padded and truncated;
   a prompt longer than that is truncated with a warning, as the official code does (silently there);
2. ``last_hidden_state`` of the encoder under the tokenizer's attention mask;
3. the valid features moved to the end (**left padding**) and the padding rows zeroed.

The GPT reads the caption mask back from the zero rows (:meth:`vgen.models.gpt.GPT.cond_mask`). Each prompt is
encoded on its own (batch 1), so its features, and the samples drawn from them, are the same bytes whatever other
prompts share its batch.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from vgen.errors import VGenError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "spiece.model")


def left_pad(features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Right-padded features (B, T, D) with their mask (B, T) -> the valid rows moved to the end, the rest zero."""
    out = torch.zeros_like(features)
    for i, (f, m) in enumerate(zip(features, mask.bool())):
        n = int(m.sum())
        if n:
            out[i, -n:] = f[m]
    return out


def find_folder(src: str | Path) -> Path:
    """A local folder, or a hub id (``google/flan-t5-xl``) already in the local Hugging Face cache."""
    p = Path(src).expanduser()
    if p.is_dir():
        return p
    if not p.is_absolute() and str(src).count("/") == 1 and not p.exists():
        try:
            from huggingface_hub import snapshot_download
            return Path(snapshot_download(str(src), local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the cache: the one-line error below names what to fetch
            pass
    raise VGenError(f"text encoder {src} not found: give a folder holding a T5 encoder and its tokenizer (for "
                    f"LlamaGen-T2I: huggingface-cli download google/flan-t5-xl --local-dir <folder>)")


def check_folder(folder: Path) -> None:
    """Every file the encoder needs is there (one line naming what is missing and where it comes from)."""
    missing = []
    if not (folder / "config.json").is_file():
        missing.append("config.json")
    if not any((folder / f).is_file() for f in WEIGHT_FILES):
        missing.append(" or ".join(WEIGHT_FILES[::2]))
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        missing.append(" or ".join(TOKENIZER_FILES))
    if missing:
        raise VGenError(f"text encoder folder {folder} lacks {', '.join(missing)}: it needs the T5 encoder's "
                        "config, weights and tokenizer (huggingface-cli download google/flan-t5-xl --local-dir "
                        f"{folder}, or `vgen train recipe=t2i` for the zoo's)")


class TextEncoder(torch.nn.Module):
    """A tokenizer and a T5 encoder: ``encoder(prompts)`` -> caption features (B, max_tokens, d_model), left-padded
    with zero rows."""

    def __init__(self, tokenizer, encoder, max_tokens: int):
        super().__init__()
        self.tokenizer, self.encoder, self.max_tokens = tokenizer, encoder, int(max_tokens)

    @classmethod
    def load(cls, src: str | Path, max_tokens: int, device="cpu", dtype=None) -> TextEncoder:
        folder = find_folder(src)
        check_folder(folder)
        from transformers import AutoTokenizer, T5EncoderModel
        from transformers.utils import logging as hf_logging
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # a full T5 checkpoint's decoder weights are expected to be unused
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            enc = T5EncoderModel.from_pretrained(str(folder), local_files_only=True, dtype=dtype or torch.float32)
        except (OSError, ValueError) as e:
            raise VGenError(f"text encoder folder {folder} could not be read ({str(e).splitlines()[0]}): download "
                            "it again") from None
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
        return cls(tok, enc.to(device).eval(), max_tokens)

    @property
    def dim(self) -> int:
        return self.encoder.config.d_model

    @property
    def device(self) -> torch.device:
        return next(self.encoder.parameters()).device

    def tokenize(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask (B, max_tokens), right-padded; warns once per prompt that is cut."""
        full = self.tokenizer(list(prompts), truncation=False)["input_ids"]
        long = [i for i, ids in enumerate(full) if len(ids) > self.max_tokens]
        if long:
            warnings.warn(f"{len(long)} prompt(s) longer than the text encoder's {self.max_tokens} tokens were "
                          f"truncated (the first: prompt {long[0]}, {len(full[long[0]])} tokens), as the official "
                          "code does", stacklevel=2)
        t = self.tokenizer(list(prompts), max_length=self.max_tokens, padding="max_length", truncation=True,
                           return_tensors="pt")
        return t["input_ids"], t["attention_mask"]

    def features(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Encoder output for token ids (B, T) under ``mask``, left-padded with zero rows (differentiable: the zoo
        recipe trains through it)."""
        h = self.encoder(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
        return left_pad(h, mask.to(h.device))

    @torch.inference_mode()
    def forward(self, prompts: list[str]) -> torch.Tensor:
        ids, mask = self.tokenize(prompts)
        return torch.cat([self.features(ids[i:i + 1], mask[i:i + 1]) for i in range(len(prompts))])

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        self.encoder.save_pretrained(str(folder))
        self.tokenizer.save_pretrained(str(folder))
        return folder
