"""Tokens per pass and the share of one-token passes of sjd, scd (gumbel and maximal coupling) and pac trees at fixed
windows, N samples in one batch, eager, seeds 0..N-1, the card's example conditions:
`python docs/scripts/pac_windows.py photos-gpt [--windows 16,32] [--trees 3x2,4x2] [--n 8] [--no-baselines]
[--out FILE.json]`. A tree ending in L (``3x2L``) hangs a chain from every leaf (``chains=leaves``); L and a number
(``32x1L6``) caps the chains off the main path at that many drafts (``leaf_chain``); S and a number adds that many
candidates at each position of the main chain (``spine``), C and a number their chains (``spine_chain``):
``32x1L10S2C3``; a final M draws the first position after a rejection from the mean of the distributions after every
candidate tried there (``restart=mix``): ``32x1L10S2C3M``. ``--out`` writes this run's cells into FILE.json (rendered
by render_tables.py's ``pac-windows``; a cell of the same model, window, sampler and options is replaced, the others kept), with the machine and commit;
``--no-baselines`` runs the trees only (sjd and scd's cells already in FILE.json stay)."""
import argparse
import datetime
import json
import os
import re
import sys

import torch

import vgen
from vgen.conditions import examples
from vgen.eval.bench.reporting import machine

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--windows", default="16,32")
ap.add_argument("--trees", default="3x2,4x2")
ap.add_argument("--n", type=int, default=8)
ap.add_argument("--out", default=None)
ap.add_argument("--no-baselines", action="store_true", help="the trees only (not sjd, scd and scd maximal)")
a = ap.parse_args()
if a.out and os.path.exists(a.out) and "samples" not in json.load(open(a.out)):
    sys.exit(f"{a.out} is not a pac_windows.py table (another bench JSON?): name a new file with --out")

pipe = vgen.load_pipeline(a.model)
runs = [] if a.no_baselines else [("sjd", {}), ("scd", {}), ("scd", {"coupling": "maximal"})]
for t in a.trees.split(","):
    m = re.fullmatch(r"(\d+)X(\d+)(L(\d*))?(S(\d+)(C(\d+))?)?(M)?", t.upper())
    if not m:
        sys.exit(f"--trees: {t!r} is not WxD[L[n]][Ss[Cc]][M] (e.g. 32x1L10S2C3M)")
    width, depth, leaves, cap, _, spine, _, spine_chain, mix = m.groups()
    o = {"tree_width": int(width), "tree_depth": int(depth), "chains": "leaves" if leaves else "main"}
    o |= {"leaf_chain": int(cap)} if cap else {}
    o |= {"spine": int(spine)} if spine else {}
    o |= {"spine_chain": int(spine_chain)} if spine_chain else {}
    o |= {"restart": "mix"} if mix else {}
    runs.append(("pac", o))
cond = pipe.encode(examples(pipe.card, a.n))
rows = []
for w in (int(x) for x in a.windows.split(",")):
    for name, o in runs:
        s = pipe.make_sampler(name, compile=False, window=w, **o)
        with torch.inference_mode():
            _, st = pipe.sample_tokens(s, cond, list(range(a.n)), batch_size=a.n)
        h = st["pass_histogram"]
        rows.append({"model": a.model, "window": w, "sampler": name, "options": o,
                     "tokens_per_pass": st["accepted_per_step"], "one_token_share": h[0] / max(sum(h), 1)})
        print(f"w{w} {name} {o} tok/pass {rows[-1]['tokens_per_pass']:.2f} one-token {rows[-1]['one_token_share']:.2f}",
              flush=True)
if a.out:
    rep = json.load(open(a.out)) if os.path.exists(a.out) else {
        "what": "tokens per pass and share of one-token passes at fixed windows; eager, one batch, seeds 0..n-1",
        "samples": a.n, "machine": machine(), "date": datetime.date.today().isoformat(), "rows": []}
    if rep["samples"] != a.n:
        sys.exit(f"{a.out} holds {rep['samples']} samples per cell, this run {a.n}: use --n {rep['samples']} or "
                 "another --out")
    key = lambda r: (r["model"], r["window"], r["sampler"], json.dumps(r["options"], sort_keys=True))  # noqa: E731
    new = {key(r) for r in rows}
    rep["rows"] = [r for r in rep["rows"] if key(r) not in new] + rows
    rep.setdefault("commands", []).append("python docs/scripts/pac_windows.py " + " ".join(sys.argv[1:])
                                          + f" (vgen {machine()['vgen_commit']})")
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rep, f, indent=1)
    os.replace(tmp, a.out)
    print("wrote", a.out)
