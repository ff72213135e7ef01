"""Decode steps: one model call plus guidance, filtering and the draw, as one function that
``torch.compile`` can fuse. Everything that changes per step (token, position, uniform) is a tensor
argument, so one compiled graph serves the whole loop."""
from __future__ import annotations

import functools

import torch

from vgen.kernels.sampling import filter_probs, guide, sample_from_probs


def token_step(logits: torch.Tensor, u: torch.Tensor, cfg: bool, apply_cfg, cfg_scale: float,
               temperature: float, top_k: int, top_p: float):
    """Logits (B or 2B, ..., V) with uniforms u (B, ...) -> (tokens (B, ...), log-prob of each under the target):
    one position per sample (AR) or several at once (NAR's anti-diagonal). ``apply_cfg``: a bool for every
    position, or a bool tensor over the positions (guidance per token, as ``cfg_interval`` decides)."""
    if cfg:
        cond = logits[: logits.shape[0] // 2]
        if isinstance(apply_cfg, torch.Tensor):
            logits = torch.where(apply_cfg[..., None], guide(logits, cfg_scale), cond)
        else:
            logits = guide(logits, cfg_scale) if apply_cfg else cond
    probs = filter_probs(logits, temperature, top_k, top_p)
    tok = sample_from_probs(probs, u)
    return tok, probs.gather(-1, tok[..., None]).squeeze(-1).clamp_min(1e-30).log()


def ar_decode_step(model, cache, tok: torch.Tensor, pos: torch.Tensor, u: torch.Tensor, cfg: bool,
                   apply_cfg: bool, cfg_scale: float, temperature: float, top_k: int, top_p: float):
    """Feed tokens (B, 1) at position ``pos`` (1,), draw the next token with uniforms ``u`` (B,)."""
    x = torch.cat([tok, tok]) if cfg else tok
    logits = model.decode(x, pos, cache)[:, -1]
    return token_step(logits, u, cfg, apply_cfg, cfg_scale, temperature, top_k, top_p)


# Inductor options for the decode step (per compile, not global): ``freezing`` folds the weights into the
# graph as constants (lets it pre-pack them), ``cpp_wrapper`` drives the kernels from C++ instead of Python.
# Measured on a 2-core CPU, 5.6M GPT, CFG: 2.9 ms/token at batch 1 vs 7.7 eager (docs/benchmarks.md).
COMPILE_OPTIONS = {"freezing": True, "cpp_wrapper": True}


@functools.cache
def compiled(fn, dynamic: bool = False):
    """A process-wide compiled version of a step function (compiled once per model and settings; dynamo's
    guards recompile for another model or other shapes). ``dynamic=True`` compiles one shape-generic graph,
    for steps whose token count changes every call (NAR's anti-diagonals). Weights are frozen into the graph:
    after changing a model's weights in place, call ``compiled.cache_clear()`` and ``torch._dynamo.reset()``."""
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(fn, dynamic=dynamic, options=COMPILE_OPTIONS)

