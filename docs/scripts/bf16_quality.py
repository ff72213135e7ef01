"""Half precision against float32 on the zoo (docs/hardware.md, the lab log): the same 256 class-conditional
samples (seeds 0..255, classes in turn) from photos-gpt with AR in float32 and in bfloat16; each set's FID-photo
against photos-test, its mean NLL under its own model, and the NLL of the float32 samples under the bfloat16 model
(teacher forced, the same tokens: how far its logits moved). The two FIDs are compared with the spread of FID
between two disjoint float32 sets of the same size (seeds 256..511): the noise floor of this measure.

    python docs/scripts/bf16_quality.py > bf16.json
"""
import json
import time

import torch
import torch.nn.functional as F

import vgen
import vgen.eval

N = 256
out = {"samples": N}
labels = [i % 16 for i in range(N)]
pipes = {"float32": vgen.load_pipeline("photos-gpt"), "bfloat16": vgen.load_pipeline("photos-gpt", dtype="bfloat16")}
gens = {}
for name, pipe in pipes.items():
    t0 = time.time()
    g = pipe.generate(labels, seed=0, batch_size=32, sampler="ar", compile=False)
    gens[name] = g
    out[name] = {"fid_photo": vgen.eval.fid(g.images, "photos-test", isc=False)["fid"], "nll": g.stats["nll"],
                 "kv_cache_bytes": g.stats["kv_cache_bytes"], "seconds": time.time() - t0}
other = pipes["float32"].generate(labels, seed=N, batch_size=32, sampler="ar", compile=False)
out["float32_second_set_fid_photo"] = vgen.eval.fid(other.images, "photos-test", isc=False)["fid"]

tokens = gens["float32"].tokens.flatten(1)
cond = torch.tensor(labels)
with torch.no_grad():
    for name, pipe in pipes.items():
        logits = torch.cat([pipe.model(tokens[i:i + 64], cond[i:i + 64]).float() for i in range(0, N, 64)])
        out[f"teacher_forced_nll_of_float32_samples_{name}"] = F.cross_entropy(
            logits.flatten(0, 1), tokens.flatten()).item()
print(json.dumps(out, indent=2))
