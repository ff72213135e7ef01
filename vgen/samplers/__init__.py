"""Samplers: one file per method over shared kernels. ``sample(model, labels, sampler=..., seed=...)``."""
from vgen.samplers import ar, gsd, lantern, nar, sjd, var  # noqa: F401  (register every sampler)
from vgen.samplers.base import (Sampler, SamplingOptions, as_cond, get_sampler, list_samplers, register_sampler,
                                sample)

__all__ = ["Sampler", "SamplingOptions", "as_cond", "get_sampler", "list_samplers", "register_sampler", "sample"]
