"""Zoo recipes for video: a video GPT (3-D RoPE) and a video NAR (right, down and time heads) over clips.

Clips (``vgen.data.clips``) are tokenized frame by frame with the photos VQ tokenizer (convolutional: a 32x32
frame gives 8x8 codes), so a clip of T frames is a (T, 8, 8) token grid in raster order. The loop, optimiser,
schedule, checkpointing and export are the GPT recipe's; only the data and the model differ.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
from tqdm.auto import tqdm

from vgen.data import NUM_CLASSES
from vgen.models.nar_video import NARVideo, NARVideoConfig
from vgen.models.video_gpt import VideoGPT, VideoGPTConfig
from vgen.train.common import recipe
from vgen.train.gpt import GPTTrainConfig, train_gpt

ZOO_VQ = "vgen/zoo/photos-gpt/vq.safetensors"  # the photos tokenizer, shipped with photos-gpt


@torch.no_grad()
def encode_clips(tokenizer, split: str, n: int, seed: int, frames: int = 8, size: int = 32, batch: int = 32,
                 desc: str = "encode") -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` clips of a split -> (codes int16 (n, T*h*w) in (t, h, w) raster order, labels (n,)), on the CPU."""
    from vgen.data import clips, to_model_range
    device = next(tokenizer.parameters()).device
    codes, labels = [], []
    for i in tqdm(range(0, n, batch), desc=f"{desc} {split} clips", leave=False):
        m = min(batch, n - i)
        data = clips(split, m, seed=seed * 1_000_003 + i, frames=frames, size=size)
        x = to_model_range(data.videos.flatten(0, 1).to(device))
        codes.append(tokenizer.encode_to_codes(x).to(torch.int16).cpu().reshape(m, -1))
        labels.append(data.labels)
    return torch.cat(codes), torch.cat(labels)


_COMMON = dict(dim=256, n_layer=6, n_head=4, vocab_size=1024, num_classes=NUM_CLASSES, cls_token_num=1,
               class_dropout_prob=0.1, token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)


@dataclass
class VideoGPTTrainConfig(GPTTrainConfig):
    out: str = "runs/photos-video-gpt"
    tokenizer: str = ZOO_VQ
    frames: int = 8
    size: int = 32
    steps: int = 400
    batch_size: int = 16
    precision: str = "fp32"
    n_train: int = 8000
    n_test: int = 256
    model: dict = field(default_factory=lambda: dict(_COMMON, latent_shape=[8, 8, 8]))


@recipe(VideoGPTTrainConfig)
def train_video_gpt(cfg: VideoGPTTrainConfig) -> dict:
    return train_gpt(cfg, model_cls=VideoGPT, config_cls=VideoGPTConfig, export_name="video-gpt.safetensors",
                     desc="video-gpt", encode=partial(encode_clips, frames=cfg.frames, size=cfg.size))


@dataclass
class VideoNARTrainConfig(VideoGPTTrainConfig):
    out: str = "runs/photos-video-nar"
    model: dict = field(default_factory=lambda: dict(_COMMON, n_layer=5, latent_shape=[8, 8, 8], max_seq_len=512,
                                                     attn_num_back=1, attn_num_down=1))


@recipe(VideoNARTrainConfig)
def train_video_nar(cfg: VideoNARTrainConfig) -> dict:
    return train_gpt(cfg, model_cls=NARVideo, config_cls=NARVideoConfig, export_name="nar-video.safetensors",
                     desc="video-nar", encode=partial(encode_clips, frames=cfg.frames, size=cfg.size))
