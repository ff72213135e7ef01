"""The golden cases of tests/test_golden.py (CORE): sha256 of each case's tokens and step map, as JSON, on any device.

    python docs/scripts/golden_cases.py out.json                    # every case, on the CPU (DEVICE=cpu)
    DEVICE=cuda ONLY=photos-gpt,photos-video-gpt python docs/scripts/golden_cases.py out.json

tests/test_golden.py's CORE table was recorded with this on the CPU before the speculative core was split;
docs/scripts/gpu/core_check.sh runs it on a GPU with the trees before and after (docs/benchmarks-gpu.md). A case
that raises is recorded as ("error", message) and the others still run."""
import hashlib
import json
import os
import sys
import time

import torch

import vgen

DEVICE = os.environ.get("DEVICE", "cpu")
ONLY = os.environ.get("ONLY", "").split(",") if os.environ.get("ONLY") else None

LABELS = [0, 3, 7, 12]
W4 = (("window", 4),)
CASES = [
    # photos-gpt: every token sampler, its draft sources and rules, continuous batching, per-pass widths
    ("photos-gpt", "ar", (("draw", "gumbel"),), {}),
    ("photos-gpt", "sjd", W4 + (("init", "vertical"),), {"batch_size": 3}),
    ("photos-gpt", "sjd", W4 + (("init", "sample"), ("fresh_q", "onehot")), {}),
    ("photos-gpt", "sjd", W4 + (("coupling", "maximal"), ("init", "horizontal")), {"batch_size": 2}),
    ("photos-gpt", "sjd", (("window", "auto"), ("costs", "1:1,2:1.2,4:1.5,8:2.5")), {"batch_size": 3}),
    ("photos-gpt", "gsd", W4 + (("coupling", "maximal"),), {"batch_size": 3}),
    ("photos-gpt", "lantern", (("window", 8), ("lam", 2.0)), {}),
    ("photos-gpt", "scd", W4, {"batch_size": 3}),
    ("photos-gpt", "scd", W4 + (("init", "sample"),), {}),
    ("photos-gpt", "scd", (("window", 8), ("coupling", "maximal")), {}),
    ("photos-gpt", "eagle", (("window", 8),), {"batch_size": 3}),
    ("photos-gpt", "eagle", W4 + (("verify", "token"),), {}),
    ("photos-gpt", "eagle", (("window", 8), ("accept", "lantern")), {}),
    ("photos-gpt", "eagle", W4 + (("accept", "gsd"),), {}),
    ("photos-gpt", "eagle", (("tree", "lantern++"), ("window", 26)), {"batch_size": 3}),
    ("photos-gpt", "eagle", (("tree", "3,2,1"), ("children", "top"), ("window", 16)), {}),
    ("photos-gpt", "zipar", W4, {}),
    # video: the token samplers on (t, h, w), the temporal init, a prompt (prefix), video NAR
    ("photos-video-gpt", None, (), {}),
    ("photos-video-gpt", "sjd", (("window", 16), ("init", "temporal")), {"batch_size": 3}),
    ("photos-video-gpt", "scd", W4, {"prompt": 2}),
    ("photos-video-gpt", "sjd", W4 + (("init", "temporal"),), {"prompt": 2}),
    ("photos-video-nar", None, (), {}),
    ("photos-nar", "nar", (), {"batch_size": 3}),
    # continuous tokens
    ("photos-car", None, (), {}),
    ("photos-car", "cspd", (), {"n": 2}),
    ("photos-mar", None, (), {}),
]


def digest(t):
    t = t.contiguous()
    t = t.to(torch.int64) if not t.is_floating_point() else t.to(torch.float32)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def run(pipes, case):
    model, sampler, options, call = case
    if model not in pipes:
        pipes[model] = vgen.load_pipeline(model, device=DEVICE)
    call = dict(call)
    labels = LABELS[:call.pop("n", len(LABELS))]
    if "prompt" in call:
        call["prompt_frames"] = call.pop("prompt")
        call["prompt"] = vgen.data.clips("test", 1).videos[0]
    gen = pipes[model].generate(labels, sampler=sampler, seed=0, **call, **dict(options))
    return digest(gen.tokens.cpu()), digest(gen.step_map.cpu())


if __name__ == "__main__":
    pipes, out = {}, {}
    for case in [c for c in CASES if ONLY is None or c[0] in ONLY]:
        t0 = time.time()
        try:
            h = run(pipes, case)
        except Exception as e:  # recorded, not fatal: the other cases still run
            h = ("error", f"{type(e).__name__}: {e}"[:300])
        key = repr(case[:3] + (tuple(sorted(case[3].items())),))
        out[key] = h
        print(f"{time.time() - t0:6.1f}s {key} {h[0][:12]} {h[1][:12]}", flush=True, file=sys.stderr)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    print("vgen from", vgen.__file__, file=sys.stderr)
