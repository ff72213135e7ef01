"""Tokens per forward pass of the token samplers at a fixed window on the zoo's photos-emu3 (two prompts, seed 0,
the card's settings: cfg 3, top-k 100, vertical drafts).   python docs/scripts/emu3_zoo_passes.py"""
import vgen

pipe = vgen.load_pipeline("photos-emu3")
prompts = ["a photo of the cat", "a dark photo of the moon"]
for name, opts in (("ar", {}), ("sjd", {"window": 4}), ("scd", {"window": 4}), ("gsd", {"window": 4}),
                   ("lantern", {"window": 4}), ("zipar", {})):
    g = pipe.generate(prompts=prompts, sampler=name, seed=0, **opts)
    print(f"{name:8s} {g.stats['accepted_per_step']:.2f} tokens per pass, {g.stats['forward_passes']} passes")
