"""The zoo's Emu3-layout vocabulary and sequences (``photos-emu3``, trained by ``vgen train recipe=emu3``): caption
words (the caption tokenizer's ids), Emu3's special tokens, then one visual token per VQ code. Shared by the recipe
and the zoo pipeline (:mod:`vgen.hf_pipeline`)."""
from __future__ import annotations

import torch

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|extra_200|>", "<|extra_201|>", "<|image end|>", "<|image token|>",
            "<|image start|>", "<image>"]
N_SPECIAL = 16  # slots reserved after the words (the specials, then spare)


def vocabulary(words: int, codes: int) -> tuple[dict[str, int], dict[str, int]]:
    """(Emu3's vocabulary_map, the special ids by name) for ``words`` caption ids and ``codes`` visual tokens."""
    special = {name: words + i for i, name in enumerate(SPECIALS)}
    vmap = dict(special)
    vmap.update({f"<|visual token {k:06d}|>": words + N_SPECIAL + k for k in range(codes)})
    return vmap, special


class Layout:
    """Prompt and image ids in the model's layout (one place, used by training, the pipeline and the tests)."""

    def __init__(self, tokenizer, special: dict[str, int], codes: int, grid: tuple[int, int], max_words: int):
        self.tok, self.sp, self.codes, self.grid, self.max_words = tokenizer, special, codes, grid, max_words
        self.words = len(tokenizer)

    def prompt(self, text: str | None) -> list[int]:
        """BOS caption <|image start|> <|image token|> (the caption's words without the tokenizer's EOS, at most
        max_words); ``None``: the null prompt."""
        ids = [] if text is None else [i for i in self.tok(text)["input_ids"] if i != self.tok.eos_token_id]
        return [self.sp["<|bos|>"], *ids[: self.max_words], self.sp["<|image start|>"], self.sp["<|image token|>"]]

    def image(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, h*w) -> the image part of the sequence (B, h*(w+1) + 3), visual ids with row ends and the ends."""
        h, w = self.grid
        b = codes.shape[0]
        rows = (codes.view(b, h, w) + self.words + N_SPECIAL)
        rows = torch.cat([rows, rows.new_full((b, h, 1), self.sp["<|extra_200|>"])], -1).flatten(1)
        tail = rows.new_tensor([self.sp["<|extra_201|>"], self.sp["<|image end|>"], self.sp["<|eos|>"]])
        return torch.cat([rows, tail.expand(b, -1)], 1)

    def batch(self, prompts: list[list[int]], codes: torch.Tensor):
        """Left-padded (ids, attention mask, position ids, loss mask) for prompts + their images."""
        img = self.image(codes)
        P = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), P + img.shape[1]), self.sp["<|pad|>"], dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, P - len(p): P] = torch.tensor(p)
            att[i, P - len(p):] = 1
        ids[:, P:] = img
        pos = (att.cumsum(1) - 1).clamp_min(0)
        loss = torch.zeros_like(ids, dtype=torch.bool)
        loss[:, P:] = True
        return ids, att, pos, loss
