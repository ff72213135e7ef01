"""Kernels: the static KV cache, the small-row linear, sampling ops and compiled decode steps."""
from vgen.kernels.kv_cache import KVCache
from vgen.kernels.sampling import filter_probs, guide, per_sample_uniforms, sample_from_probs

__all__ = ["KVCache", "filter_probs", "guide", "per_sample_uniforms", "sample_from_probs"]
