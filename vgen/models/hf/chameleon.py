"""Chameleon weights (transformers' ``ChameleonForConditionalGeneration``) as image generators: Lumina-mGPT and Anole.

transformers' Chameleon forward sets every image-token logit to the dtype's minimum and its VQ keeps only the encoder.
The adapter needs neither: the logits are the language-model head's rows of the image tokens (``IMGIMG...`` in the
vocabulary, code k = the digits of its name), read from the decoder's hidden state directly, and images decode through
:mod:`vgen.tokenizers.vqgan` (the decoder half of Meta's VQGAN, ``tokenizer/vqgan.ckpt``).

Two layouts, as the official code writes images:

* ``lumina`` (Alpha-VLLM/Lumina-mGPT): ``<racm3:break>`` (begin of image), the height and width tokens
  ``<reserved{8800 + n}>`` with n = pixels / 32 (= tokens / 2), then each row of codes followed by the row end
  ``<reserved08799>``, then ``<eoss>``. The three opening tokens end every prompt (vgen appends them where a prompt
  lacks them) and the row end is forced (the sampler never drafts it). CFG: the unconditional row is the image's
  opening alone (Lumina-mGPT's ``LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor`` runs it as a
  second, unbatched forward from the begin-of-image token on); logits mixed ``u + s (c - u)``.
* ``anole`` (Chameleon's own image decoder, which Anole re-enables): the prompt ends with ``<racm3:break>``, then
  h x w codes (32 x 32 at 512 px) with no row ends. CFG: the unconditional row keeps only BOS, the image's begin / end
  tokens and image tokens of the prompt (Chameleon's "image-conditioned" stream; for a text prompt that is
  ``<s><racm3:break>``, which is also its unconditioned stream, so its three-stream CFG is this two-row CFG with the
  text scale).

Detection: a config whose architectures name ``ChameleonXLLMXForConditionalGeneration`` (Lumina-mGPT's release) is
``lumina``; any other Chameleon is ``anole`` unless ``layout=`` says otherwise.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn as nn

from vgen.errors import VGenError
from vgen.models.hf.adapter import Family, FamilyBase, register_family

BOI, EOI, ROW_END = "<racm3:break>", "<eoss>", "<reserved08799>"
LAYOUTS = ("lumina", "anole")
LUMINA_SEPARATOR = "<reserved08706>"  # Lumina-mGPT's conversation: each turn ends with it
# the recommended settings: Lumina-mGPT's inference solver (cfg 3, image top-k 2000); Chameleon's image options,
# which Anole keeps (text guidance 3, temperature 0.7, top-p 0.9)
SAMPLING = {"lumina": {"cfg_scale": 3.0, "top_k": 2000}, "anole": {"cfg_scale": 3.0, "temperature": 0.7, "top_p": 0.9}}
VQGAN_FILES = ("vqgan.safetensors", "vqgan.ckpt")  # the image decoder, beside the model's files


def size_token(n: int) -> str:
    """Lumina-mGPT's size token for n units of 32 pixels (= 2 n codes)."""
    return f"<reserved{8800 + n:05d}>"


def default_layout(architectures) -> str:
    """The layout a config's ``architectures`` imply: Lumina-mGPT's class name, or Anole."""
    return "lumina" if "ChameleonXLLMXForConditionalGeneration" in (architectures or []) else "anole"


def _id(vocab: dict, name: str, what: str) -> int:
    if name not in vocab:
        raise VGenError(f"this Chameleon's vocabulary_map has no {name} ({what}): load the released config.json")
    return int(vocab[name])


def _right_align(keep: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The kept ids of each row in order, right-aligned, -1 before them, as narrow as the longest row."""
    order = torch.sort(keep.int(), dim=1, stable=True).indices
    out = torch.where(keep.gather(1, order), ids.gather(1, order), -1)
    return out[:, out.shape[1] - max(int(keep.sum(1).max()), 1):]


def decoder(m) -> nn.Module:
    """Chameleon's model under its output layer (what runs once per token)."""
    return m.model


def wrap(m, height: int | None = None, width: int | None = None, layout: str | None = None,
         negative_prompt_ids=None, vqgan=None) -> Family:
    layout = layout or default_layout(getattr(m.config, "architectures", None))
    if layout not in LAYOUTS:
        raise VGenError(f"layout must be one of {', '.join(LAYOUTS)} (Lumina-mGPT / Anole), got {layout!r}")
    vocab = m.config.vocabulary_map or {}
    vm = m.model.vocabulary_mapping
    codes = len(vm.image_tokens)
    if codes == 0:
        raise VGenError("this Chameleon's vocabulary_map has no image tokens (IMGIMG...): load the released config")
    boi = _id(vocab, BOI, "begin of image")
    if layout == "anole":
        height, width = (32, 32) if height is None and width is None else (height, width)
    if height is None or width is None:
        raise VGenError("Lumina-mGPT generates any grid: give height= and width= in tokens (pixels / 16, even; the "
                        "released 768 model: 48 x 48)")
    height, width = int(height), int(width)
    if height < 1 or width < 1:
        raise VGenError(f"height and width must be >= 1 tokens, got {height} x {width}")
    if layout == "lumina":
        if height % 2 or width % 2:
            raise VGenError(f"Lumina-mGPT's grid is in units of 2 tokens (32 px): got {height} x {width}, use even "
                            "sizes")
        opening = (boi, _id(vocab, size_token(height // 2), "height token"),
                   _id(vocab, size_token(width // 2), "width token"))
        row_end = _id(vocab, ROW_END, "row end")
    else:
        opening, row_end = (boi,), None
    ids = torch.tensor([vm.img2bpe[k] for k in range(codes)], dtype=torch.long)  # code k -> its token id
    text = decoder(m)
    head = m.lm_head
    lo = int(ids[0])
    if bool((ids == lo + torch.arange(codes)).all()):
        def logits(h: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(h, head.weight[lo: lo + codes])
    else:
        rows = head.weight.detach()[ids]  # one gather at wrap time

        def logits(h: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(h, rows.to(h.device))

    on_device: dict = {}

    def embed_codes(t: torch.Tensor) -> torch.Tensor:
        table = on_device.get(t.device)
        if table is None:
            table = on_device[t.device] = ids.to(t.device)
        return text.embed_tokens(table[t])

    neg = None
    if negative_prompt_ids is not None:
        neg = torch.as_tensor(negative_prompt_ids, dtype=torch.long).reshape(1, -1)
        if neg.numel() == 0:
            raise VGenError("negative_prompt_ids is empty")
        if neg.shape[1] < len(opening) or neg[0, -len(opening):].tolist() != list(opening):
            neg = torch.cat([neg, torch.tensor([opening])], 1)
    bos = m.config.bos_token_id  # Chameleon's image-conditioned stream keeps these of a prompt: BOS, image tokens
    marks = [boi, _id(vocab, EOI, "end of image")] + ([int(bos)] if bos is not None else [])
    kept = torch.cat([ids, torch.tensor(marks)])

    def null_prompt(cond: torch.Tensor) -> torch.Tensor:
        if neg is not None:
            return neg.to(cond.device).expand(cond.shape[0], -1)
        if layout == "lumina":
            return cond[:, -len(opening):]
        return _right_align(torch.isin(cond, kept.to(cond.device)), cond)

    vq = vqgan
    if vq is not None and not hasattr(vq, "decode_codes"):
        raise VGenError(f"vqgan= takes the decoder module (vgen.tokenizers.vqgan.load_vqgan(<vqgan.ckpt>)), got "
                        f"{type(vq).__name__}")

    def decode_image(grid: torch.Tensor) -> torch.Tensor:
        if vq is None:
            raise VGenError("transformers' Chameleon has no VQ decoder: pass vqgan=vgen.tokenizers.vqgan.load_vqgan("
                            "<tokenizer/vqgan.ckpt of Meta's Chameleon release>) to from_transformers (or put "
                            "vqgan.ckpt in the model's folder and use vgen.load_pipeline)")
        if vq.codebook_size != codes:
            raise VGenError(f"the VQGAN has {vq.codebook_size} codes, the model {codes} image tokens")
        return vq.decode_codes(grid.to(next(vq.parameters()).device)).clamp(-1, 1)

    def prompt_text(text: str) -> str:  # Lumina-mGPT's conversation: the request, then the turn separator
        if layout == "lumina":
            return (f"Generate an image of {width * 16}x{height * 16} according to the following prompt:\n{text}"
                    f"{LUMINA_SEPARATOR}")
        return text

    tc = m.config
    return Family(
        name="Lumina-mGPT" if layout == "lumina" else "Anole", decoder=text,
        embed_prompt=lambda t: text.embed_tokens(t),
        embed_codes=embed_codes, logits=logits, vocab_size=codes, grid=(height, width), null_prompt=null_prompt,
        pad_id=int(tc.pad_token_id if tc.pad_token_id is not None else 1), text_vocab=int(tc.vocab_size),
        max_positions=getattr(tc, "max_position_embeddings", None),
        codebook=lambda: m.model.vqmodel.quantize.embedding.weight.detach(), row_end=row_end,
        decode_image=decode_image, prompt_end=opening, prompt_text=prompt_text, sampling=dict(SAMPLING[layout]),
        config={"hidden": tc.hidden_size, "layers": tc.num_hidden_layers, "heads": tc.num_attention_heads,
                "vocab": codes, "layout": layout, "negative": None if neg is None else neg.tolist()})


def vqgan_file(folder: Path) -> Path:
    """The VQGAN decoder in a model folder (``vqgan.safetensors`` or Meta's ``vqgan.ckpt``), or a one-line error
    naming where it comes from."""
    for name in VQGAN_FILES:
        if (folder / name).is_file():
            return folder / name
    raise VGenError(f"{folder} has no vqgan.ckpt: Chameleon models decode through the VQGAN of Meta's Chameleon "
                    "release (tokenizer/vqgan.ckpt; Lumina-mGPT keeps it in ckpts/chameleon/tokenizer/): copy it "
                    "into the model's folder")


def release_grid(name, layout: str) -> tuple[int, int]:
    """The default token grid of a release: Anole 32 x 32 (512 px); Lumina-mGPT from the resolution in its name
    (Alpha-VLLM/Lumina-mGPT-7B-512 / -768 / -1024: pixels / 16), 768 px when the name states none."""
    if layout == "anole":
        return 32, 32
    m = re.search(r"(?<!\d)(512|768|1024)(?!\d)", str(name))
    n = int(m.group(1)) // 16 if m else 48
    return n, n


class Chameleon(FamilyBase):
    """Lumina-mGPT and Anole for :func:`vgen.models.from_transformers` and :mod:`vgen.hf_pipeline`: the layout from
    the config's architectures, the grid from the release's name, the VQGAN decoder from the folder (``vqgan``), a
    negative prompt as BOS + its text (the adapter appends the image's opening), prompts through ``prompt_text``."""
    name = "chameleon"
    releases = "Lumina-mGPT, Anole"

    def model_class(self) -> type:
        from transformers import ChameleonForConditionalGeneration
        return ChameleonForConditionalGeneration

    def wrap(self, hf_model, height=None, width=None, **options) -> Family:
        return wrap(hf_model, height, width, **options)

    def decoder(self, hf_model) -> nn.Module:
        return decoder(hf_model)

    def files(self, folder: Path) -> dict[str, Path]:
        return {"vqgan": vqgan_file(folder)}

    def load_options(self, name: str, folder: Path, config: dict, height, width):
        if height is None and width is None:
            height, width = release_grid(name, default_layout(config.get("architectures")))
        return height, width, {}

    def card_fields(self, name: str, folder: Path, config: dict) -> dict:
        self.files(folder)  # the decoder's file, named before anything loads
        layout = default_layout(config.get("architectures"))
        vocab = config.get("vocabulary_map") or {}
        return {"token_shape": list(release_grid(name, layout)),
                "vocab_size": sum(k.startswith("IMGIMG") for k in vocab), "sampling": dict(SAMPLING[layout])}

    def prompt_options(self, hf_model, processor, height, width, negative_prompt, options):
        if negative_prompt and processor is not None:
            tok = getattr(processor, "tokenizer", processor)  # BOS + the text; the family appends the opening
            options = {**options, "negative_prompt_ids": [hf_model.config.bos_token_id]
                       + tok(negative_prompt, add_special_tokens=False).input_ids}
        return height, width, options


register_family(Chameleon())
