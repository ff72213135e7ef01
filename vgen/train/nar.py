"""Zoo recipe: train a class-conditional NAR (LlamaGen GPT + next-neighbour heads) over the VQ codes.

The loop is the GPT recipe's (same data, codes cache, optimiser, schedule and checkpointing); what changes
is the model: every token is predicted from the tokens on earlier anti-diagonals (proximity mask), by the
right head of its left neighbour and the down head of the token above, their logits averaged where both
reach it (the official NAR training objective).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from vgen.data import NUM_CLASSES
from vgen.models.nar import NAR, NARConfig
from vgen.train.common import recipe
from vgen.train.gpt import GPTTrainConfig, train_gpt


@dataclass
class NARTrainConfig(GPTTrainConfig):
    out: str = "runs/photos-nar"
    model: dict = field(default_factory=lambda: dict(
        dim=256, n_layer=6, n_head=4, vocab_size=1024, num_classes=NUM_CLASSES, block_size=256,
        cls_token_num=1, class_dropout_prob=0.1, token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0,
        medusa_attention_num=1))


@recipe(NARTrainConfig)
def train_nar(cfg: NARTrainConfig) -> dict:
    return train_gpt(cfg, model_cls=NAR, config_cls=NARConfig, export_name="nar.safetensors", desc="nar")
