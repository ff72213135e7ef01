"""``vgen bench``: samplers x batch sizes on pipelines, interleaved, medians of repeated runs.

Three steps: ``plan`` (validate every setting against every model card, before any weights load), ``run`` (every
cell warmed up once, untimed; then all cells ``repeats`` times round-robin so machine noise hits them alike; the
official LlamaGen loop is the hidden sampler ``llamagen-loop``, a cell like any other) and ``report`` (medians,
ratios within the run, table, JSON, plot).
"""
from vgen.eval.bench.measuring import RssPeak, generate_images, peak_rss_mb, run
from vgen.eval.bench.planning import BASELINE, Plan, parse_variant, plan
from vgen.eval.bench.reporting import machine, markdown_table, paired_speedup, report, same_mode_ar

__all__ = ["BASELINE", "Plan", "RssPeak", "generate_images", "machine", "markdown_table", "paired_speedup",
           "parse_variant", "peak_rss_mb", "plan", "report", "run", "same_mode_ar"]
