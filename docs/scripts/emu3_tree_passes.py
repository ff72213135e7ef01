"""Tokens per pass of eagle's chains and trees on photos-emu3 (its shipped draft head): the card's 8 example
prompts, batch 8, seed 0, the card's sampling, one thread (docs/lab/benchmarks-log.md, eagle trees on transformers
models). Counts, not timings: `vgen bench` times them.

    python docs/scripts/emu3_tree_passes.py
"""
import torch

import vgen

torch.set_num_threads(1)
pipe = vgen.load_pipeline("photos-emu3")
prompts = list(pipe.card.examples)[:8]
for label, kw in [("chain, window 4", dict(window=4)), ("chain, window 6", dict(window=6)),
                  ("tree 2,1", dict(tree="2,1", window=2)), ("tree 3,2,1", dict(tree="3,2,1", window=2)),
                  ("tree lantern++", dict(tree="lantern++", window=2)),
                  ("tree lantern++, children=top", dict(tree="lantern++", window=2, children="top"))]:
    g = pipe.generate(prompts=prompts, sampler="eagle", seed=0, batch_size=8, **kw)
    print(f"{label}: {g.stats['accepted_per_step']:.2f} tokens per pass")
