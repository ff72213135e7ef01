"""Float32 matmul precision on CUDA for vgen's commands.

LlamaGen's sampling scripts (``sample_c2i.py``, ``sample_t2i.py``) set ``torch.backends.cuda.matmul.allow_tf32 =
True`` before anything runs, so their float32 models multiply in TF32 on a GPU. vgen's commands (``vgen sample``,
``bench``, ``demo``) do the same by default (``tf32=true``; ``tf32=false`` keeps full float32), for the length of
the command only: a command run in process (tests, notebooks) leaves the caller's setting as it found it. Python
callers of the library keep PyTorch's setting, theirs to choose.

It matters beyond the last bits: cuBLAS's full-float32 kernel choice for a few rows (a 4-token speculative pass
with CFG on a small model) can make a wide pass cost several times AR's step, which TF32 avoids (the measurements
are in docs/benchmarks-gpu.md). CPUs and half-precision models are unaffected. Samplers stay exact: they reproduce the
distribution of the model's logits, whatever precision computed them.
"""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def cuda_tf32(enabled: bool | None):
    """CUDA float32 matmuls in TF32 (``enabled``) or full float32 inside the block, restored after it; None: left as
    it is."""
    if enabled is None:
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = bool(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
