"""torch.distributed for scale-out jobs started with ``torchrun`` (gloo on CPU, nccl on CUDA).

Work is split by *global sample index* and every sample's seed derives from that index, so the output of
N processes is byte-identical to one process. Without torchrun's environment everything here is a no-op.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import torch.distributed as dist


def env_world() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment (0, 1 outside torchrun)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


@contextmanager
def process_group(device: str = "cpu"):
    """Join the torchrun job (if any) for the duration of the block; yields (rank, world, device)."""
    rank, world = env_world()
    dev = torch.device(device)
    own = False
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if dev.type == "cuda":
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(dev)
        dist.init_process_group(backend=backend)
        own = True
    try:
        yield rank, world, dev
    finally:
        if own:
            dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast(obj, src: int = 0):
    """Rank ``src``'s Python object on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
