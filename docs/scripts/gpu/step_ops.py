"""Operators per compiled step, per sampler: a CPU proxy for the kernels a GPU step launches inside its CUDA graph.

On a GPU a small model's compiled step costs about a few microseconds per kernel in its graph, whatever the
kernel does, so a sampler whose pass has many more operators than AR's step pays for them even when each is
tiny. This counts the aten operators of every graph vgen compiles (after AOT autograd's decompositions, before
inductor fuses them: fusion on a GPU differs from the CPU's), per sampler, on photos-gpt at batch 1.

    python docs/scripts/gpu/step_ops.py            # ar, sjd, scd, eagle, zipar at window 4
"""
from __future__ import annotations

import collections
import sys

import torch
from torch._dynamo.backends.common import aot_autograd

import vgen

SETTINGS = {"ar": {}, "sjd": dict(window=4), "scd": dict(window=4), "eagle": dict(window=4),
            "zipar": dict(window=4)}
SKIP = {"getitem", "_assert_tensor_metadata"}


def main(names: list[str]) -> None:
    counts: dict[str, list[int]] = collections.defaultdict(list)
    current = [""]

    def fw(gm, example_inputs):
        ops = [n for n in gm.graph.nodes if n.op == "call_function" and getattr(n.target, "__name__", "")
               .split(".")[0] not in SKIP]
        counts[current[0]].append(len(ops))
        return gm.forward

    backend = aot_autograd(fw_compiler=fw)
    real = torch.compile

    def counting_compile(fn, dynamic=None, fullgraph=False, **_):  # vgen's mode / options / backend: replaced
        return real(fn, dynamic=dynamic, fullgraph=fullgraph, backend=backend)

    torch.compile = counting_compile  # vgen.kernels.decode.compiled calls torch.compile at each step's first use
    try:
        pipe = vgen.load_pipeline("photos-gpt")
        torch._dynamo.reset()
        for name in names:
            current[0] = name
            pipe.generate([0], sampler=name, seed=0, compile=True, **SETTINGS[name])
    finally:
        torch.compile = real
    print("| sampler | aten ops per compiled graph (each graph it compiled) |\n|---|---|")
    for name in names:
        print(f"| `{name}` {SETTINGS[name]} | {', '.join(map(str, counts[name]))} |")


if __name__ == "__main__":
    main(sys.argv[1:] or list(SETTINGS))
