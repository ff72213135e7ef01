"""Which part of the AR decode step inductor fails to build on a CUDA device (the GPU-readiness run found one at
LlamaGen's vocabulary, 16384, with torch 2.11): each piece compiled alone (inductor, default mode), OK or the last
line of its error. Usage: python docs/scripts/gpu/inductor_probe.py [dtype]"""
import sys
import time

import torch

from vgen.kernels.decode import ar_decode_step, token_step
from vgen.kernels.sampling import filter_probs, sample_from_probs
from vgen.models import build

dev, dtype = "cuda", getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
V = 16384
torch.manual_seed(0)
logits = torch.randn(2, V, device=dev)
u = torch.rand(1, device=dev)
model = build("gpt", dim=1280, n_layer=2, n_head=20, vocab_size=V, num_classes=1000, block_size=256)
torch.nn.init.normal_(model.output.weight, std=0.02)
model = model.to(dev, dtype).eval()
cache = model.new_cache(2)
model.prefill(torch.tensor([1, 1000], device=dev), cache)
tok, pos = torch.zeros((1, 1), dtype=torch.long, device=dev), torch.tensor([5], device=dev)
kw = dict(cfg=True, apply_cfg=True, cfg_scale=4.0, temperature=1.0, top_k=0, top_p=1.0)
pieces = {
    "filter_probs": (lambda x: filter_probs(x, 1.0, 0, 1.0), (logits,)),
    "sample_from_probs": (sample_from_probs, (logits.softmax(-1)[:1], u)),
    "token_step": (lambda x, u: token_step(x, u, **kw), (logits, u)),
    "token_step top_k=100": (lambda x, u: token_step(x, u, **{**kw, "top_k": 100}), (logits, u)),
    "decode": (lambda t, p: model.decode(torch.cat([t, t]), p, cache), (tok, pos)),
    "ar_decode_step": (lambda t, p, u: ar_decode_step(model, cache, t, p, u, **kw), (tok, pos, u)),
}
for name, (fn, args) in pieces.items():
    torch._dynamo.reset()
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            torch.compile(fn, fullgraph=True)(*args)
        print(f"{name}: OK ({time.perf_counter() - t0:.1f} s)", flush=True)
    except Exception as e:  # noqa: BLE001 (a probe: report and go on)
        print(f"{name}: FAIL {type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}", flush=True)
