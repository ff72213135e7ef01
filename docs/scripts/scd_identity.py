"""Identity of SCD (Gumbel coupling) with AR's Gumbel draw on a zoo model (docs/lab/benchmarks-log.md, "Coupled drafts").

    python docs/scripts/scd_identity.py --model photos-gpt --samples 64 --batch 8

For eager and compiled decode steps: ``ar`` with ``draw=gumbel`` and ``scd`` (coupling gumbel, at each
``--windows`` value) on the same labels (i % classes) and seeds (i), the card's settings. Prints, per setting, how
many samples and tokens differ from AR's; for a sample that differs, it reruns that sample in float64 (model and
sampling), where rounding cannot flip a near-tie, and says whether the two then agree. Also prints SCD's tokens
per pass. Ends with a Markdown table.
"""
from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="photos-gpt")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--windows", default="16,auto")
    ap.add_argument("--modes", default="eager,compiled")
    a = ap.parse_args()
    from vgen.pipeline import Pipeline
    pipe = Pipeline.from_pretrained(a.model)
    labels = [i % pipe.num_classes for i in range(a.samples)]
    seeds = list(range(a.samples))
    rows = []
    for mode in a.modes.split(","):
        comp = mode == "compiled"
        ar = pipe.generate(labels, sampler="ar", seeds=seeds, batch_size=a.batch, compile=comp, draw="gumbel")
        for w in a.windows.split(","):
            window = w if w == "auto" else int(w)
            g = pipe.generate(labels, sampler="scd", seeds=seeds, batch_size=a.batch, compile=comp, window=window)
            diff = (g.tokens != ar.tokens).flatten(1)
            bad = [i for i in range(a.samples) if bool(diff[i].any())]
            agree64 = []
            if bad:  # rerun the differing samples in float64: no near-tie can flip there
                m64 = type(pipe.model)(pipe.model.config).double().eval()
                m64.load_state_dict(pipe.model.state_dict())
                from vgen.pipeline import resolve_sampler
                cond = torch.tensor([labels[i] for i in bad])
                s_ar = resolve_sampler(pipe.card, "ar", draw="gumbel", compile=False)
                s_sc = resolve_sampler(pipe.card, "scd", window=window, compile=False)
                ar64, _ = s_ar(m64, cond, [seeds[i] for i in bad])
                sc64, _ = s_sc(m64, cond, [seeds[i] for i in bad])
                agree64 = [bool(torch.equal(x, y)) for x, y in zip(ar64, sc64)]
            row = dict(mode=mode, window=w, samples=a.samples, differing_samples=len(bad),
                       differing_tokens=int(diff.sum()), float64_agree=f"{sum(agree64)}/{len(agree64)}",
                       tokens_per_pass=round(g.stats["accepted_per_step"], 2))
            print(row, flush=True)
            rows.append(row)
    print("\n| mode | window | samples | samples differing from ar draw=gumbel | tokens differing | "
          "differing samples equal in float64 | scd tokens per pass |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['window']} | {r['samples']} | {r['differing_samples']} | {r['differing_tokens']} | "
              f"{r['float64_agree']} | {r['tokens_per_pass']} |")


if __name__ == "__main__":
    main()
