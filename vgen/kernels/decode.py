"""Decode steps: one model call plus guidance, filtering and the draw, as one function that
``torch.compile`` can fuse. Everything that changes per step (token, position, uniform) is a tensor
argument, so one compiled graph serves the whole loop."""
from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import torch

from vgen.errors import VGenError
from vgen.io import cache_dir as vgen_cache
from vgen.kernels.gumbel import gumbel_draw
from vgen.kernels.quant import graph_rows
from vgen.kernels.sampling import filter_probs, guide, sample_from_probs


def token_step(logits: torch.Tensor, u: torch.Tensor, cfg: bool, apply_cfg, cfg_scale: float,
               temperature: float, top_k: int, top_p: float, gkey: torch.Tensor | None = None):
    """Logits (B or 2B, ..., V) with uniforms u (B, ...) -> (tokens (B, ...), log-prob of each under the target):
    one position per sample (AR) or several at once (NAR's anti-diagonal). ``apply_cfg``: a bool for every
    position, or a bool tensor over the positions (guidance per token, as ``cfg_interval`` decides). With Gumbel
    position keys ``gkey`` (B, ...) the draw is Gumbel-max with those positions' counter-based noise instead of
    inverse-CDF from ``u`` (:mod:`vgen.kernels.gumbel`)."""
    if cfg:
        cond = logits[: logits.shape[0] // 2]
        if isinstance(apply_cfg, torch.Tensor):
            logits = torch.where(apply_cfg[..., None], guide(logits, cfg_scale), cond)
        else:
            logits = guide(logits, cfg_scale) if apply_cfg else cond
    probs = filter_probs(logits, temperature, top_k, top_p)
    tok = sample_from_probs(probs, u) if gkey is None else gumbel_draw(probs, gkey)
    return tok, probs.gather(-1, tok[..., None]).squeeze(-1).clamp_min(1e-30).log()


def ar_decode_step(model, cache, tok: torch.Tensor, pos: torch.Tensor, u: torch.Tensor, cfg: bool,
                   apply_cfg: bool, cfg_scale: float, temperature: float, top_k: int, top_p: float,
                   gkey: torch.Tensor | None = None):
    """Feed tokens (B, 1) at position ``pos`` (1,), draw the next token with uniforms ``u`` (B,) (or Gumbel-max
    with the drawn position's keys ``gkey`` (B,), see :func:`token_step`)."""
    x = torch.cat([tok, tok]) if cfg else tok
    logits = model.decode(x, pos, cache)[:, -1]
    return token_step(logits, u, cfg, apply_cfg, cfg_scale, temperature, top_k, top_p, gkey)


def ar_loop_step(model, cache, tokens: torch.Tensor, logp: torch.Tensor, u: torch.Tensor, gkeys: torch.Tensor | None,
                 t: torch.Tensor, cfg: bool, apply_cfg: bool, cfg_scale: float, temperature: float, top_k: int,
                 top_p: float) -> None:
    """AR's loop step with its state in place: advance the token counter ``t`` (a 0-d tensor), feed token t - 1 of
    ``tokens`` (B, L) at its position and draw token t (:func:`ar_decode_step`, with column t of the uniforms ``u``
    (B, L) or of the Gumbel keys ``gkeys`` (B, L)) into ``tokens`` and ``logp`` (B, L). Nothing is returned: on CUDA
    these tensors are static addresses, so a replay of the compiled step copies nothing in or out."""
    t.add_(1)
    i = t.view(1)  # a tensor index: no host read
    gkey = None if gkeys is None else gkeys.index_select(1, i)[:, 0]
    tok, lp = ar_decode_step(model, cache, tokens.index_select(1, i - 1), model.cond_len + i - 1,
                             u.index_select(1, i)[:, 0], cfg, apply_cfg, cfg_scale, temperature, top_k, top_p, gkey)
    tokens.index_copy_(1, i, tok[:, None])
    logp.index_copy_(1, i, lp[:, None])


# Inductor options for a CPU decode step (per compile, not global): ``cpp_wrapper`` drives the kernels from C++
# instead of Python. Not ``freezing`` (weights folded into the graph as constants): it bypasses AOTAutograd's
# on-disk cache, so a later process compiles again instead of loading (docs/compile.md has the measurements).
COMPILE_OPTIONS = {"cpp_wrapper": True}


def compile_options() -> dict:
    """:data:`COMPILE_OPTIONS`, or with ``$VGEN_CPP_WRAPPER=0`` the kernels driven from Python: a model of many layers
    (LlamaGen-XL's 36) makes one long C++ wrapper that g++ builds for tens of minutes on a small CPU, while the Python
    wrapper's cost per kernel launch is small beside such a step (docs/compile.md)."""
    v = os.environ.get("VGEN_CPP_WRAPPER", "1").strip().lower()
    if v not in ("0", "1"):
        raise VGenError(f"VGEN_CPP_WRAPPER must be 1 (the C++ wrapper, the default) or 0 (the Python one), got {v!r}")
    return COMPILE_OPTIONS if v == "1" else {**COMPILE_OPTIONS, "cpp_wrapper": False}


def cache_dir() -> Path:
    """Where compiled steps are kept across processes: ``$TORCHINDUCTOR_CACHE_DIR`` where the user set it, else
    ``$VGEN_CACHE_DIR``, else ``inductor`` under ``$VGEN_CACHE`` or ``~/.cache/vgen``. (Importing ``torch._dynamo``
    sets ``$TORCHINDUCTOR_CACHE_DIR`` to torch's default, a per-user folder in /tmp: that value is not the user's.)"""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    own = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if own and os.path.abspath(own) != os.path.abspath(default_cache_dir()):
        return Path(own)
    d = os.environ.get("VGEN_CACHE_DIR")
    return Path(d).expanduser() if d else vgen_cache() / "inductor"


def use_cache_dir() -> Path:
    """Point inductor's on-disk caches (FX graphs, AOTAutograd graphs, compiled C++) at :func:`cache_dir` for the
    rest of this process. Called by :func:`compiled` only, before its first compile."""
    d = cache_dir()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(d)
    return d


# How many graphs dynamo keeps per step function (``recompile_limit``) and over the process
# (``accumulated_recompile_limit``). A decode step is compiled once per batch size, pass width, KV-length bucket and
# sampler setting, and dynamo keeps one list of graphs per Python function, shared by every sampler that runs it
# (sjd, gsd, lantern and scd all run ``jacobi_step``). One `vgen bench +experiment=readme` process needs about 200
# graphs of ``jacobi_step``; past the limit dynamo silently runs the step eager, with a warning (a 64-graph limit
# made compiled ``scd`` run 0.42x compiled ``ar`` there: docs/lab/benchmarks-log.md, "recompile limit"). A step
# looks up its graph most-recently-used first, so a long list costs a loop nothing while its shape stays.
RECOMPILE_LIMIT = 1024
ACCUMULATED_RECOMPILE_LIMIT = 8192


def raise_recompile_limits() -> None:
    """Let dynamo keep :data:`RECOMPILE_LIMIT` graphs per function and :data:`ACCUMULATED_RECOMPILE_LIMIT` in all
    (never lowers a limit the user raised further; torch versions before the rename use ``cache_size_limit``)."""
    import torch._dynamo
    cfg = torch._dynamo.config
    for names, least in ((("recompile_limit", "cache_size_limit"), RECOMPILE_LIMIT),
                         (("accumulated_recompile_limit", "accumulated_cache_size_limit"), ACCUMULATED_RECOMPILE_LIMIT)):
        name = next((n for n in names if hasattr(cfg, n)), None)
        if name is not None:
            setattr(cfg, name, max(getattr(cfg, name), least))


@functools.cache
def compiled(fn, dynamic: bool = False, device: str = "cpu"):
    """A process-wide compiled version of a step function (compiled once per model and settings; dynamo's
    guards recompile for another model or other shapes). ``dynamic=True`` compiles one shape-generic graph,
    for steps whose token count changes every call (NAR's anti-diagonals). Compiled code is cached on disk
    (:func:`cache_dir`): a later process compiling the same step loads it instead.

    ``device``: the device type the step runs on. On a CPU, inductor's default mode with :func:`compile_options`.
    On CUDA, ``mode="reduce-overhead"`` with ``fullgraph=True`` (gpt-fast's decode): the step is recorded once as a
    CUDA graph and replayed, one launch per step instead of one per kernel, which is what a GPU step at small batch
    waits on. The KV cache's tensors are static addresses there (:class:`vgen.kernels.kv_cache.KVCache`), so the
    replay updates the cache in place; each call's outputs are copied out of the graph's memory (the next replay
    overwrites it), see :func:`graphed`."""
    use_cache_dir()
    raise_recompile_limits()
    graph_rows()  # int8 layers in the step read their product's rule as a constant
    options = compile_options()  # a bad value fails before anything compiles
    if device == "cuda":
        return graphed(torch.compile(fn, dynamic=dynamic, mode="reduce-overhead", fullgraph=True),
                       lambda: torch.compile(fn, dynamic=dynamic, backend="cudagraphs", fullgraph=True),
                       getattr(fn, "__name__", "step"))
    return torch.compile(fn, dynamic=dynamic, options=options)


def backend_failed(e: BaseException) -> bool:
    """Whether ``e`` is a compiler back end's failure (inductor's code generation, Triton's compiler), not an error of
    the traced code itself: what :func:`graphed` falls back from."""
    from torch._dynamo.exc import BackendCompilerFailed
    names = {f"{type(x).__module__}.{type(x).__name__}" for x in (e, e.__cause__) if x is not None}
    return isinstance(e, BackendCompilerFailed) or any(n.startswith(("torch._inductor.", "triton.")) for n in names)


def graphed(step, fallback=None, name: str = "step"):
    """``step`` (compiled ``mode="reduce-overhead"``) called as one step of a loop: a new CUDA-graph step begins at
    every call (no output of an earlier call is read again by the graph), and the outputs are the caller's own
    tensors (a clone of each; a loop keeps tokens and state across calls, which the next replay would overwrite).

    ``fallback``: makes a step to use instead where the back end fails to build ``step`` (:func:`backend_failed`; a
    failed build runs nothing, so the call is simply made again): dynamo's ``cudagraphs`` back end, which records
    the traced graph's own kernels as a CUDA graph (no generated code; the launches saved, not the fusions). Said
    once per step, as a warning."""
    from torch.utils._pytree import tree_map_only
    current = [step]

    @functools.wraps(step)
    def run(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        try:
            out = current[0](*args, **kwargs)
        except Exception as e:
            if fallback is None or current[0] is not step or not backend_failed(e):
                raise
            first = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
            warnings.warn(f"{name}: inductor could not build this step for CUDA ({first}); it runs as a CUDA graph of "
                          "its own kernels instead (torch.compile backend='cudagraphs')", stacklevel=2)
            current[0] = fallback()
            torch.compiler.cudagraph_mark_step_begin()
            out = current[0](*args, **kwargs)
        return tree_map_only(torch.Tensor, torch.clone, out)
    return run
