"""What int8 / int4 weights change in a zoo model's distribution, measured on tokens the float32 model sampled:

    python docs/scripts/quant_quality.py [--models photos-gpt photos-t2i] [--n 64] [--out docs/bench/quant-quality.json]

For each model: ``n`` images sampled by float32 ``ar`` at the card's settings (seeds 0..n-1, the card's classes or
example prompts in turn), then teacher-forced under the float32, int8 and int4 models (the conditional model, no
guidance, no filtering): the mean negative log-likelihood per token and its change against float32, the share of
positions whose most likely token changes, and the mean total-variation distance between the float and quantized
next-token distributions (with guidance at the card's scale: the distribution the samplers draw from, before
filtering). Records the machine and commit."""
from __future__ import annotations

import argparse
import copy
import json
import time

import torch

import vgen
from vgen.eval.bench.reporting import machine
from vgen.kernels.quant import quantize_linears, weight_bytes
from vgen.kernels.verify import guided_logits


def labels_for(pipe, n: int) -> dict:
    if pipe.card.conditioning == "class":
        return {"labels": [i % pipe.num_classes for i in range(n)]}
    examples = list(pipe.card.examples)
    return {"prompts": [examples[i % len(examples)] for i in range(n)]}


@torch.inference_mode()
def forced(model, tokens, cond, cfg_scale: float):
    """Teacher-forced logits (N, L, V): conditional, and guided at ``cfg_scale``."""
    lc = model(tokens, cond).float()
    lu = model(tokens, model.null_cond(cond)).float()
    index = torch.arange(tokens.shape[1])[None].expand(tokens.shape[0], -1)
    guided = guided_logits(torch.cat([lc, lu]), index, True, cfg_scale, -1)
    return lc, guided


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["photos-gpt", "photos-t2i"])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--out", default="docs/bench/quant-quality.json")
    a = ap.parse_args()
    rows = []
    for name in a.models:
        pipe = vgen.load_pipeline(name)
        t0 = time.perf_counter()
        gen = pipe.generate(sampler="ar", seed=0, batch_size=8, **labels_for(pipe, a.n))
        cond = pipe.encode(pipe.condition(gen.labels.tolist() if gen.labels is not None else None, gen.prompts))
        cfg = float(gen.stats["options"]["cfg_scale"])
        tokens = gen.tokens
        lc0, g0 = forced(pipe.model, tokens, cond, cfg)
        nll0 = float(torch.nn.functional.cross_entropy(lc0.flatten(0, 1), tokens.flatten()))
        p0, top0 = g0.softmax(-1), g0.argmax(-1)
        rows.append({"model": name, "weights": "float32", "weight_bytes": weight_bytes(pipe.model), "nll": nll0,
                     "nll_change": 0.0, "top1_changed": 0.0, "tv_guided": 0.0, "cfg_scale": cfg})
        for mode in ("int8", "int4"):
            m = copy.deepcopy(pipe.model)
            info = quantize_linears(m, mode, 32, skip=tuple(getattr(m, "quantize_skip", ())))
            lc, g = forced(m, tokens, cond, cfg)
            nll = float(torch.nn.functional.cross_entropy(lc.flatten(0, 1), tokens.flatten()))
            rows.append({"model": name, "weights": mode if mode == "int8" else "int4 (group 32)",
                         "weight_bytes": info["weight_bytes"], "nll": nll, "nll_change": nll / nll0 - 1,
                         "top1_changed": float((g.argmax(-1) != top0).float().mean()),
                         "tv_guided": float(0.5 * (g.softmax(-1) - p0).abs().sum(-1).mean()), "cfg_scale": cfg})
        print(name, f"{time.perf_counter() - t0:.0f}s", [(r["weights"], round(r["nll"], 4), round(r["nll_change"], 5),
                                                          round(r["top1_changed"], 4), round(r["tv_guided"], 4))
                                                         for r in rows if r["model"] == name])
    rep = {"what": "teacher-forced NLL / top-1 / guided TV of float32-sampled tokens under int8 and int4 weights",
           "images": a.n, "sampler": "ar (float32, the card's settings)", "machine": machine(), "rows": rows}
    with open(a.out, "w") as f:
        json.dump(rep, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
