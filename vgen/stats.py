"""The one stats schema every sampler, pipeline, sampling job and benchmark shares, and how parts merge.

A sampler's stats (per run of N samples):

* counts and times that add up over parts: ``forward_passes``, ``tokens``, ``seconds``; a pipeline adds
  ``num_samples``, ``sample_seconds`` and ``decode_seconds``; continuous samplers split their time
  (``transformer_seconds``, ``head_seconds``; CSpD: ``target_transformer_seconds``, ``target_head_seconds``,
  ``draft_seconds``, ``verify_seconds``) and count ``draft_passes``;
* sizes whose whole is the largest part: ``kv_cache_bytes``, ``kv_full_bytes``;
* per-sample means, weighted by the part's samples: ``nll``, ``accepted_per_step``, ``acceptance_rate``,
  ``kv_fraction``, ``kv_kept_fraction``;
* per-stage lists (the largest part's value per stage): ``kv_kept_bytes_per_scale``;
* counts per entry, added up entry by entry: ``pass_histogram`` (a speculative sampler's passes that decided 1, 2,
  ... tokens);
* tensors, concatenated: ``step_map``.

Anything else (strings, option dicts) is carried from the first part. Labels kept in every record
(:func:`numeric`): ``window_rule``, how a speculative sampler's ``window`` was chosen (fixed, timed, cached,
prior, fallback, job, per-pass), and ``tree``, the tree pac ran (``'3x2'``: tree_width x tree_depth).
"""
from __future__ import annotations

import torch

SUMMED = ("forward_passes", "tokens", "seconds", "num_samples", "sample_seconds", "decode_seconds", "draft_passes",
          "transformer_seconds", "head_seconds", "target_transformer_seconds", "target_head_seconds", "draft_seconds",
          "verify_seconds")
LARGEST = ("kv_cache_bytes", "kv_full_bytes")
SUMMED_LISTS = ("pass_histogram",)


def merge_stats(parts: list[tuple[dict, int]]) -> dict:
    """Stats of consecutive parts, each with its number of samples -> stats of the whole."""
    out = {}
    keys = list(dict.fromkeys(k for st, _ in parts for k in st))
    for k in keys:
        vals = [(st[k], w) for st, w in parts if k in st]
        first = vals[0][0]
        if isinstance(first, torch.Tensor):
            out[k] = torch.cat([v for v, _ in vals])
        elif k in SUMMED:
            out[k] = sum(v for v, _ in vals)
        elif k in LARGEST:
            out[k] = max(v for v, _ in vals)
        elif k in SUMMED_LISTS:
            out[k] = [sum(x) for x in zip(*[v for v, _ in vals])]
        elif isinstance(first, list):
            out[k] = [max(x) for x in zip(*[v for v, _ in vals])]
        elif isinstance(first, (int, float)) and not isinstance(first, bool):
            if len(vals) == len(parts):  # a mean only where every part measured it
                out[k] = sum(v * w for v, w in vals) / sum(w for _, w in vals)
        else:
            out[k] = first
    return out


LABELS = ("window_rule", "tree")


def numeric(stats: dict) -> dict:
    """The JSON-able numbers of a stats dict (no tensors, no nested options), its :data:`LABELS` and its
    :data:`SUMMED_LISTS`."""
    return {k: v for k, v in stats.items() if (isinstance(v, (int, float)) and not isinstance(v, bool))
            or (k in LABELS and isinstance(v, str)) or (k in SUMMED_LISTS and isinstance(v, list))}
