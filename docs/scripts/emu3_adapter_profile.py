"""Where an Emu3 pass through vgen's transformers adapter spends its time: cProfile of vgen's ar on the bench's
emu3-cpu shape (random weights) over a 6 x 6 grid, CFG 3 with a negative prompt. Prints the share of torch's
linear layers and the top of the profile.   python docs/scripts/emu3_adapter_profile.py"""
import cProfile
import pstats

import torch

from vgen.eval import hf_speed
from vgen.samplers import sample

m, model, ids, cfg, kw = hf_speed.build("emu3-cpu", torch.float32, torch.device("cpu"), grid=6)
sample(model, ids, "ar", cfg_scale=cfg)  # warm-up
prof = cProfile.Profile()
prof.runcall(sample, model, ids, "ar", cfg_scale=cfg)
st = pstats.Stats(prof)
linear = sum(v[2] for k, v in st.stats.items() if k[2] == "<built-in method torch._C._nn.linear>")
print(f"linear: {linear:.3f} s of {st.total_tt:.3f} s ({100 * linear / st.total_tt:.0f}%)")
st.sort_stats("tottime").print_stats(8)
