"""Tables on the user pages rendered from the bench JSON files in docs/bench, so a figure cannot drift from its file.

A page marks a rendered table with two comments; everything between them is this script's output:

    <!-- render: small-jobs docs/bench/small-jobs-8.json docs/bench/small-jobs-64.json -->
    | ... |
    <!-- /render -->

``python docs/scripts/render_tables.py`` rewrites every marked block of README.md and docs/*.md; ``--check`` only
reports the blocks whose text differs from a fresh render (tests/test_docs_tables.py runs it).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"(<!-- render: (?P<name>[\w-]+)(?P<files>(?: [^ >]+)*) -->\n)(?P<body>.*?)(<!-- /render -->)",
                   re.S)


def machine(rep: dict) -> str:
    m = rep.get("machine", {})
    what = m.get("gpu") or m.get("cpu") or m.get("processor") or "?"
    if not m.get("gpu") and m.get("cpu_capability"):  # the vector ISA PyTorch runs (recorded since 2026-11-29)
        what += f" ({m['cpu_capability']})"
    cores = f", {m['cores']} cores" if m.get("cores") else ""
    return f"{what}{cores}, torch {m.get('torch', '?')}, vgen {m.get('vgen_commit') or '?'}"


def small_jobs(reps: list[dict]) -> str:
    """window=auto in small jobs against AR in the same mode (``vgen bench +experiment=small-jobs``)."""
    lines = []
    for rep in reps:
        n = rep["config"]["num_samples"]
        lines += [f"{n}-image jobs ({machine(rep)}, {rep['config']['repeats']} paired rounds):", "",
                  "| sampler | mode | batch | width chosen | how | tokens / pass | x AR (paired, 95% interval) | "
                  "first choice (s) |", "|---|---|---|---|---|---|---|---|"]
        rows = sorted(rep["rows"], key=lambda r: (r["batch_size"], ":compile=false" not in r["sampler"]))
        for r in rows:
            name, _, opts = r["sampler"].partition(":")
            if name == "ar":
                continue
            mode = "eager" if "compile=false" in opts else "compiled"
            width = "AR's loop" if r.get("window") == 1 else str(r.get("window"))
            paired = r.get("speedup_vs_ar_paired")
            ratio = (f"{paired:.2f} ({r['speedup_vs_ar_ci95'][0]:.2f}-{r['speedup_vs_ar_ci95'][1]:.2f})"
                     if paired else f"{r['speedup_vs_ar']:.2f}")
            lines.append(f"| `{name}` | {mode} | {r['batch_size']} | {width} | {r.get('window_rule', '')} | "
                         f"{r['accepted_per_step']:.2f} | {ratio} | {r.get('window_seconds_first', 0.0):.1f} |")
        lines.append("")
    return "\n".join(lines)


def _ratio(r: dict) -> str:
    paired = r.get("speedup_vs_ar_paired")
    if paired:
        return f"{paired:.2f} ({r['speedup_vs_ar_ci95'][0]:.2f}-{r['speedup_vs_ar_ci95'][1]:.2f})"
    return f"{r['speedup_vs_ar']:.2f}" if r.get("speedup_vs_ar") is not None else ""


def speculative(reps: list[dict]) -> str:
    """Every cell of a sampler comparison: tokens per pass, the share of passes that decided one token, the width
    window=auto chose, ms per token, ms per pass (what one pass of that width costs, against AR's one-token pass) and
    the paired speed-up against AR in the same mode."""
    lines = []
    for rep in reps:
        c = rep["config"]
        lines += [f"{', '.join(map(str, c['models']))}, {c['num_samples']} images per cell, {c['repeats']} paired rounds "
                  f"({machine(rep)}):", "",
                  "| model | sampler | mode | batch | width | tokens / pass | one-token passes | ms / token | ms / pass | "
                  "x AR (paired, 95% interval) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(rep["rows"], key=lambda r: (r["model"], ":compile=false" not in r["sampler"],
                                                    r["batch_size"])):
            name, _, opts = r["sampler"].partition(":")
            mode = "eager" if "compile=false" in opts or not c.get("compile", True) else "compiled"
            width = "" if name == "ar" else "AR's loop" if r.get("window") == 1 else str(r.get("window", ""))
            if r.get("tree") and r.get("window") != 1:  # the tree pac's window=auto ran (tree_width x tree_depth)
                width += f", tree {r['tree']}"
            share = f"{r['single_token_share']:.0%}" if r.get("single_token_share") is not None else ""
            extra = [o for o in opts.split(",") if o and not o.startswith(("window=", "compile="))]
            name = " ".join([name, *extra])  # the options that tell two cells apart (a draft, a tree)
            lines.append(f"| {r['model']} | `{name}` | {mode} | {r['batch_size']} | {width} | "
                         f"{r['accepted_per_step']:.2f} | {share} | {r['ms_per_token']:.2f} | {r['ms_per_pass']:.2f} | "
                         f"{_ratio(r)} |")
        lines.append("")
    return "\n".join(lines)


def quantized(reps: list[dict]) -> str:
    """Weight formats side by side: the zoo rows (model@format) and the released-shape cells (hf_quantize)."""
    lines = []
    for rep in reps:
        c = rep["config"]
        group = c.get("quantize_group", 32)  # int4's inputs per scale and offset: named where it is not the default

        def fmt_name(fmt: str, group: int = group) -> str:
            return f"{fmt} (group {group})" if fmt == "int4" and group != 32 else fmt
        lines += [f"The zoo ({c['num_samples']} images per cell, {c['repeats']} rounds; {machine(rep)}):", "",
                  "| model | weights | sampler | batch | ms / token | x float32 | tokens / pass |",
                  "|---|---|---|---|---|---|---|"]
        rows = rep["rows"]
        base = {(r["model"], r["sampler"], r["batch_size"]): r["ms_per_token"] for r in rows if "@" not in r["model"]}
        for r in sorted(rows, key=lambda r: (r["sampler"], r["batch_size"], r["model"])):
            model, _, fmt = r["model"].partition("@")
            f = base.get((model, r["sampler"], r["batch_size"]))
            compiled = " compiled" if "compile=true" in r["sampler"] else ""
            lines.append(f"| {model} | {fmt_name(fmt) or 'float32'} | `{r['sampler'].partition(':')[0]}`{compiled} | "
                         f"{r['batch_size']} | "
                         f"{r['ms_per_token']:.2f} | {f / r['ms_per_token'] if f else 0:.2f} | "
                         f"{r['accepted_per_step']:.2f} |")
        for shape, by_fmt in ((rep.get("shapes") or {}).get("shapes") or {}).items():
            fl = next(e for k, e in by_fmt.items() if "@" not in k)
            widths = [w for w in ("2", "4", "8", "16") if w in fl["pass_cost"]]
            # a compiled run (compile=true) times vgen's `ar` compiled and eager: both, each against float32's
            both = any("vgen_eager" in a for e in by_fmt.values() for a in e["ar"].values())
            runs = ["vgen", "vgen_eager"] if both else ["vgen"]
            heads = ["compiled ms / token", "x float32", "eager ms / token", "x float32"] if both else \
                ["vgen ms / token", "x float32"]
            lines += ["", f"LlamaGen-{shape}'s released shape (random weights, {fl['params_m']:.0f}M parameters, CFG 4, "
                          f"256 tokens; vgen's `ar` {'compiled and eager' if both else 'eager'} and the official "
                          "loop's per-step work on the same weights):", "",
                      "| weights | weight MB | batch | " + " | ".join(heads) + " | official loop ms / token | "
                      + " | ".join(f"{w}-token pass" for w in widths) + " |",
                      "|---|---|---|" + "---|" * (len(heads) + 1 + len(widths))]
            for k, e in by_fmt.items():
                for b, a in e["ar"].items():
                    cells = []
                    for run in runs:
                        f0 = fl["ar"][b][run]["ms_per_token"]
                        cells += [f"{a[run]['ms_per_token']:.1f}", f"{f0 / a[run]['ms_per_token']:.2f}"]
                    lines.append(f"| {fmt_name(k.partition('@')[2]) or k} | {e['weight_mb']:.0f} | {b} | " + " | ".join(cells)
                                 + " | " + (f"{a['official']['ms_per_token']:.1f}" if "official" in a else "") + " | "
                                 + " | ".join(f"{e['pass_cost'][w]:.2f}x" for w in widths) + " |")
        for name, e in (rep.get("transformers") or {}).get("models", {}).items():
            q = e.get("quantized") or {}
            if not q:
                continue
            lines += ["", f"{name}'s released shape (random weights, {e['params_m']:.0f}M parameters, float32 "
                          f"activations, guidance 5, {e['grid'][0]} x {e['grid'][1]} tokens; vgen's ar):", "",
                      "| weights | weight MB | batch | seconds per image | x float32 | peak RSS MB |",
                      "|---|---|---|---|---|---|"]
            for b, t in e["batch"].items():
                lines.append(f"| float32 | {e['float_weight_mb']:.0f} | {b} | {t['vgen']['seconds_per_image']:.2f} | "
                             f"1.00 | {t['vgen']['peak_rss_mb']:.0f} |")
            for mode, row in q.items():
                for b, t in row["batch"].items():
                    lines.append(f"| {fmt_name(mode)} | {row['weight_bytes'] / 2 ** 20:.0f} | {b} | "
                                 f"{t['seconds_per_image']:.2f} "
                                 f"| {t['speedup_vs_float']:.2f} | {t['peak_rss_mb']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def quant_kernels(reps: list[dict]) -> str:
    """One linear layer per weight format (docs/scripts/quant_kernels.py): ms per call and x float32's F.linear."""
    lines = []
    for rep in reps:
        m = rep["machine"]
        isa = f" ({m['cpu_capability']})" if m.get("cpu_capability") else ""  # recorded since 2026-12-03
        commit = f", vgen {m['vgen_commit']}" if m.get("vgen_commit") else ""
        lines += [f"{m.get('cpu') or m.get('processor')}{isa}, {rep['threads']} threads, torch {rep['torch']}, torchao "
                  f"{rep.get('torchao') or 'absent'}{commit}; ms per call (x float32 `F.linear`):", ""]
        fmts = list(dict.fromkeys(f for r in rep["rows"] for f in r["ms"]))  # a kernel past its rows: "-"
        lines += ["| layer | rows | " + " | ".join(fmts) + " |", "|---|---|" + "---|" * len(fmts)]
        for r in rep["rows"]:
            lines.append(f"| {r['layer']} | {r['rows']} | " + " | ".join(
                f"{r['ms'][f]:.{2 if r['ms'][f] < 1 else 1}f} ({r['x_float32'][f]:.2f}x)" if f in r["ms"] else "-"
                for f in fmts) + " |")
        lines.append("")
    return "\n".join(lines)


def quant_quality(reps: list[dict]) -> str:
    """What int8 / int4 weights change in a zoo model's distribution (docs/scripts/quant_quality.py)."""
    lines = []
    for rep in reps:
        lines += [f"{rep['images']} images sampled by float32 `ar` at the card's settings, teacher-forced under each "
                  f"format ({machine(rep)}):", "",
                  "| model | weights | weight MiB | NLL / token | NLL change | top-1 token changed | guided TV |",
                  "|---|---|---|---|---|---|---|"]
        for r in rep["rows"]:
            lines.append(f"| {r['model']} | {r['weights']} | {r['weight_bytes'] / 2 ** 20:.1f} | {r['nll']:.4f} | "
                         f"{r['nll_change']:+.2%} | {r['top1_changed']:.1%} | {r['tv_guided']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def pass_costs(reps: list[dict]) -> str:
    """One forward pass of W tokens at a released shape (docs/scripts/released_pass_costs.py): ms and x a 1-token
    pass, per weight format."""
    lines = []
    for rep in reps:
        widths = list(rep["rows"][0]["seconds"])
        lines += [f"{rep['model']}'s released shape, random weights, batch 1 with guidance (2 rows), a cache half full "
                  f"({machine(rep)}); ms per pass (x a 1-token pass):", "",
                  "| weights | " + " | ".join(f"{w} token{'s' if w != '1' else ''}" for w in widths) + " |",
                  "|---|" + "---|" * len(widths)]
        for r in rep["rows"]:
            lines.append(f"| {r['weights']} | " + " | ".join(
                f"{1e3 * r['seconds'][w]:.0f} ({r['x_one_token'][w]:.2f}x)" for w in widths) + " |")
        lines.append("")
    return "\n".join(lines)


def quantized_load(reps: list[dict]) -> str:
    """``vgen bench +experiment=quantized-load``: the peak memory of loading released-shape checkpoints, float32, then
    quantized, and quantized while loading (the table is vgen.eval.load_memory's)."""
    from vgen.eval.load_memory import HF_SHAPES, markdown
    lines = []
    for rep in reps:
        what = ("Janus-Pro's language model at its released shape in transformers' Janus class, random weights saved "
                "in bfloat16 as released, loaded by `vgen.load_pipeline` in bfloat16"
                if set(rep["loads"]["shapes"]) <= set(HF_SHAPES) else
                "LlamaGen's class-conditional GPTs at their released shapes, random weights")
        lines += [f"{what}, each load in a fresh process ({machine(rep)}):", "", markdown(rep["loads"]), ""]
    return "\n".join(lines)


def gpu_name(rep: dict, file: str) -> str:
    """The GPU a run used: its JSON's record, else its file's name (the early GPU runs recorded none), said so."""
    named = rep.get("machine", {}).get("gpu") or rep.get("gpu") or (rep.get("shapes") or {}).get("gpu")
    if named:
        return named
    word = next((w for w in Path(file).stem.split("-") if w.startswith(("h100", "h200", "a100"))), "?")
    return f"NVIDIA {word.upper()} (the file's name: the JSON names no GPU)"


def gpu_zoo(reps: list[dict], files: list[str]) -> str:
    """The zoo's samplers compiled as CUDA graphs on a GPU, fixed windows: tokens per pass and the speed-up over
    compiled AR in the same run."""
    lines = []
    for rep, f in zip(reps, files):
        c = rep["config"]
        dt = ", ".join(sorted({d for d in (rep.get("dtype") or {}).values() if d})) or (
            c.get("dtype") or "the cards' dtype (float32; the JSON records none)")
        tf32 = rep["machine"].get("cuda_tf32", c.get("tf32"))
        tf32 = "TF32 not recorded" if tf32 is None else f"TF32 {'on' if tf32 else 'off'}"
        lines += [f"{gpu_name(rep, f)}, torch {rep['machine'].get('torch', '?')}, {dt}, {tf32}, "
                  f"{', '.join(c['models'])}, "
                  f"{c['num_samples']} images per cell, median of {c['repeats']} runs, every cell compiled "
                  f"(CUDA graphs), fixed windows (`{f}`):", "",
                  "| sampler | window | batch | ms / token | tokens / pass | x compiled AR |", "|---|---|---|---|---|---|"]
        for r in sorted(rep["rows"], key=lambda r: r["batch_size"]):
            name, _, opts = r["sampler"].partition(":")
            window = dict(o.split("=", 1) for o in opts.split(",") if "=" in o).get("window", "")
            lines.append(f"| `{name}` | {window} | {r['batch_size']} | {r['ms_per_token']:.2f} | "
                         f"{r['accepted_per_step']:.2f} | {r['speedup_vs_ar']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def gpu_shapes(reps: list[dict], files: list[str]) -> str:
    """AR at LlamaGen's released shapes on a GPU (random weights): the official eager loop, vgen's eager loop and
    vgen's CUDA graphs, and what a wide pass costs as CUDA graphs."""
    lines = ["| GPU | shape | params | dtype | batch | official loop ms / token | vgen eager | vgen CUDA graphs | "
             "x official | 16-token pass (x a 1-token pass; batch 1, CUDA graphs) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for rep, f in zip(reps, files):
        sh = rep.get("shapes", rep)
        shapes = sh.get("shapes", sh)
        for name, by_dtype in shapes.items():
            if not isinstance(by_dtype, dict):
                continue
            for dt, s in by_dtype.items():
                if not isinstance(s, dict) or "ar" not in s:
                    continue
                cost = s.get("pass_cost_graphed", {}).get("16")
                for k, (b, a) in enumerate(sorted(s["ar"].items(), key=lambda kv: int(kv[0]))):
                    lines.append(f"| {gpu_name(rep, f)} | {name} | {s['params_m']:.0f}M | {dt} | {b} | "
                                 f"{a['official']['ms_per_token']:.2f} | {a['vgen_eager']['ms_per_token']:.2f} | "
                                 f"{a['vgen']['ms_per_token']:.3f} | {a['speedup']:.1f} | "
                                 + (f"{cost:.2f}" if cost and k == 0 else "") + " |")
    return "\n".join(lines) + "\n"


def _mode(rep: dict, setting: str, row: dict | None = None) -> str:
    """compiled, eager or auto: what the row records it ran with, else the setting's own ``compile``, else the run's
    (``var`` takes none: eager; a block's ``mode=`` word overrides a JSON that recorded neither right)."""
    if rep.get("mode"):
        return rep["mode"]
    if row is not None and "compile" in row:
        c = row["compile"]
        return "auto" if c == "auto" else "compiled" if c else "eager"
    name, _, opts = setting.partition(":")
    own = dict(o.split("=", 1) for o in opts.split(",") if "=" in o).get("compile")
    run = rep["config"].get("compile", True)
    compiled = own != "false" if own is not None else run not in (False, "auto")
    return "compiled" if compiled and name != "var" else "eager"


def _label(setting: str) -> str:
    """A setting as a user types it, without ``compile=...`` (the mode column says it)."""
    name, _, opts = setting.partition(":")
    rest = [o for o in opts.split(",") if o and not o.startswith("compile=")]
    return "`" + " ".join([name, *rest]) + "`"


def _run_line(rep: dict, file: str) -> str:
    """Which run a table comes from: the machine (or that the JSON names none), dtype, date, size, the command."""
    c, m = rep["config"], rep.get("machine") or {}
    what = machine(rep) if (m.get("cpu") or m.get("gpu")) else "machine not recorded in the JSON"
    dt = sorted({d for d in (rep.get("dtype") or {}).values() if d})
    extra = "".join(f", {x}" for x in (", ".join(dt), rep.get("date")) if x)
    rounds = f"{c['repeats']} paired rounds" if c["repeats"] >= 3 else f"median of {c['repeats']} rounds"
    n = c.get("num_samples") or next((r["num_samples"] for r in rep["rows"] if "num_samples" in r), None)
    return (f"{what}{extra}; {n or 'a number not recorded of'} images per cell, {rounds}; `{rep['command']}` "
            f"(`{file}`)")


def _fastest_ar(rows: list[dict], row: dict) -> dict | None:
    """The fastest AR cell (compiled or eager) at a row's batch size, of the row's model or of the model its ratios
    were taken against (photos-nar's against photos-gpt's: the AR whose time its speedup_vs_ar implies)."""
    ars = [r for r in rows if r["batch_size"] == row["batch_size"] and r["sampler"] in ("ar", "ar:compile=false")]
    own = [r for r in ars if r["model"] == row["model"]]
    if not own and row.get("speedup_vs_ar"):
        implied = row["speedup_vs_ar"] * row["seconds"]
        model = next((r["model"] for r in ars if abs(r["seconds"] - implied) < 1e-6 * implied), None)
        own = [r for r in ars if r["model"] == model]
    return min(own, key=lambda r: r["seconds"]) if own else None


def _vs_fastest(rows: list[dict], row: dict, interval: bool = True) -> str:
    """x the fastest AR, paired over the rounds where there are 3 or more (with its 95% interval)."""
    from vgen.eval.bench.reporting import paired_speedup
    base = _fastest_ar(rows, row)
    if base is None:
        return ""
    paired = paired_speedup(base["all_seconds"], row["all_seconds"]) if base is not row else {}
    if paired and interval:
        lo, hi = paired["speedup_vs_ar_ci95"]
        return f"{paired['speedup_vs_ar_paired']:.2f} ({lo:.2f}-{hi:.2f})"
    return f"{paired.get('speedup_vs_ar_paired', base['seconds'] / row['seconds']):.2f}"


EXTRA = [("nll - AR's (drift)", "nll_excess", "{:+.3f}"), ("FID-photo", "fid_photo", "{:.2f}"),
         ("FVD-photo", "fvd_photo", "{:.1f}"),
         ("peak KV vs ref", "kv_vs_ref", "{:.1%}"), ("PSNR vs ref (dB)", "psnr_vs_ref", "{:.2f}"),
         ("FID-photo vs ref", "fid_vs_ref", "{:.2f}"), ("x ref", "speedup_vs_ref", "{:.2f}"),
         ("x official loop", "speedup_vs_llamagen-loop", "{:.2f}")]


def bench(reps: list[dict], files: list[str], models: str = "", samplers: str = "", batch: str = "",
          mode: str = "") -> str:
    """The rows of ``vgen bench`` JSON files (those of ``models`` / ``samplers`` (names) / ``batch`` where given):
    mode, ms per token, tokens per pass, x AR in the same mode and x the fastest AR at that batch size (paired with
    a 95% interval where the run has 3 or more rounds), and the quality columns the run measured."""
    keep_m, keep_s = set(filter(None, models.split(","))), set(filter(None, samplers.split(",")))
    keep_b = {int(b) for b in batch.split(",") if b}
    lines = []
    for rep, f in zip(reps, files):
        rep = {**rep, "mode": mode} if mode else rep
        rows = rep["rows"]
        shown = [r for r in rows if (not keep_m or r["model"] in keep_m) and (not keep_b or r["batch_size"] in keep_b)
                 and (not keep_s or r["sampler"].partition(":")[0] in keep_s) and r["sampler"] != "llamagen-loop"]
        several = len({r["model"] for r in shown}) > 1
        extra = [c for c in EXTRA if any(r.get(c[1]) not in (None, float("inf")) for r in shown)]
        # "x fastest AR" where the run timed AR both ways at a batch size (else it repeats "x AR, same mode")
        both = any({"ar", "ar:compile=false"} <= {r["sampler"] for r in rows if r["batch_size"] == b}
                   for b in {r["batch_size"] for r in rows})
        head = ["model"] * several + ["sampler", "mode", "batch", "ms / token", "tokens / pass", "x AR, same mode"] \
            + ["x fastest AR"] * both + [c[0] for c in extra]
        lines += [_run_line(rep, f) + ":", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in sorted(shown, key=lambda r: (r["model"], r["batch_size"], _mode(rep, r["sampler"], r) != "compiled")):
            cells = [r["model"]] * several + [
                _label(r["sampler"]), _mode(rep, r["sampler"], r), str(r["batch_size"]), f"{r['ms_per_token']:.2f}",
                f"{r['accepted_per_step']:.2f}", _ratio(r) if r.get("speedup_vs_ar") else ""] \
                + [_vs_fastest(rows, r)] * both
            cells += ["" if r.get(k) in (None, float("inf")) else fmt.format(r[k]) for _, k, fmt in extra]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def transformers(reps: list[dict], files: list[str]) -> str:
    """``vgen bench +experiment=transformers``: transformers' ``generate`` against vgen's ``ar`` on random weights
    (seconds per image), and the zoo's transformers models' samplers (seconds per run, tokens per pass, x ar)."""
    from vgen.eval import hf_speed
    lines = []
    for rep, f in zip(reps, files):
        c, t = rep["config"], rep.get("transformers") or {}
        what = machine(rep) if rep.get("machine", {}).get("cpu") else "machine not recorded in the JSON"
        head = (f"{what}, {t.get('dtype', '?')}, {rep.get('date', 'date not recorded')}; median of "
                f"{c.get('hf_repeats', 1)} timed rounds per cell; `{rep['command']}` (`{f}`)")
        if t.get("models"):
            lines += [head + "; transformers / vgen `ar`, seconds per image:", "", hf_speed.markdown(t), ""]
            head = "The same run"
        if rep.get("transformers_zoo"):
            lines += [head + f"; {c.get('hf_zoo_samples', 8)} images per cell:", "",
                      hf_speed.markdown_zoo(rep["transformers_zoo"]), ""]
    return "\n".join(lines)


def lumina(reps: list[dict], files: list[str]) -> str:
    """docs/scripts/lumina_official_speed.py: Lumina-mGPT's own loop against vgen on a scaled Chameleon."""
    lines = []
    for rep, f in zip(reps, files):
        sh = rep["shape"]
        lines += [f"{machine(rep)}, {rep['dtype']}, {rep['date']}; a Chameleon of hidden {sh['hidden']}, "
                  f"{sh['layers']} layers ({sh['params_m']:.0f}M parameters, random weights), {sh['grid']} x "
                  f"{sh['grid']} grid, best of 2 timed runs; `{rep['command']}` (`{f}`):", "",
                  "| loop | batch | s per image | x the official loop | tokens / pass |", "|---|---|---|---|---|"]
        for r in rep["rows"]:
            name = r["sampler"] if r["sampler"] == "official loop" else f"vgen `{r['sampler']}`"
            tpp = f"{r['tokens_per_pass']:.2f}" if r.get("tokens_per_pass") else ""
            lines.append(f"| {name} | {r['batch_size']} | {r['seconds_per_image']:.2f} | {r['x_official']:.2f} | "
                         f"{tpp} |")
        lines.append("")
    return "\n".join(lines)


def tokens_per_pass(reps: list[dict], files: list[str]) -> str:
    """docs/scripts/t2i_tokens_per_pass.py: tokens per pass at fixed windows, photos-t2i beside photos-gpt."""
    lines = []
    for rep, f in zip(reps, files):
        models = list(next(iter(rep["rows"].values())))
        lines += [f"{machine(rep)}, {rep['date']}; {rep['images']} images at batch 1, eager, one thread "
                  f"(`{f}`):", "", "| sampler | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
        for key, by_model in rep["rows"].items():
            lines.append(f"| `{key}` | " + " | ".join(f"{by_model[m]['tokens_per_pass']:.2f}" for m in models) + " |")
        lines.append("")
    return "\n".join(lines)


def _pac_label(r: dict) -> str:
    o = r["options"]
    if r["sampler"] != "pac":
        return f"`{r['sampler']}`" + "".join(f" {k}={v}" for k, v in o.items())
    leaves = o.get("chains") == "leaves"
    return f"`pac` {o['tree_width']}x{o['tree_depth']}" + (" leaves" if leaves else "") + (
        f" leaf_chain={o['leaf_chain']}" if leaves and o.get("leaf_chain") else "") + (
        f" spine={o['spine']}" + (f" spine_chain={o['spine_chain']}" if o.get("spine_chain") else "")
        if o.get("spine", 1) > 1 else "") + (
        f" restart={o['restart']}" if o.get("restart", "rank0") != "rank0" else "")


def pac_windows(reps: list[dict], files: list[str]) -> str:
    """docs/scripts/pac_windows.py: tokens per pass (one-token share) per model and window, and the best pac tree's
    ratio to sjd's and scd's."""
    lines = []
    for rep, f in zip(reps, files):
        labels = list(dict.fromkeys(_pac_label(r) for r in rep["rows"]))
        later = [c for c in dict.fromkeys(m for cmd in rep.get("commands", []) for m in re.findall(r"\(vgen ([\w+]+)\)$", cmd))
                 if c != rep["machine"].get("vgen_commit")]  # commands that added cells name their commit
        lines += [f"{machine(rep)}, {rep['date']}" + (f" (cells added at vgen {', '.join(later)})" if later else "")
                  + f"; {rep['samples']} samples in one batch per cell, eager (`{f}`); "
                  "tokens per pass (share of passes deciding one token):", "",
                  "| model | window | " + " | ".join(labels) + " | best `pac` / `sjd` | / `scd` |",
                  "|---|---|" + "---|" * (len(labels) + 2)]
        for model, window in dict.fromkeys((r["model"], r["window"]) for r in rep["rows"]):
            cell = {_pac_label(r): r for r in rep["rows"] if (r["model"], r["window"]) == (model, window)}
            best = max((r["tokens_per_pass"] for r in cell.values() if r["sampler"] == "pac"), default=float("nan"))
            ref = lambda k: cell[k]["tokens_per_pass"] if k in cell else float("nan")  # noqa: E731
            lines.append(f"| {model} | {window} | " + " | ".join(
                f"{cell[k]['tokens_per_pass']:.2f} ({cell[k]['one_token_share']:.2f})" if k in cell else ""
                for k in labels) + f" | {best / ref('`sjd`'):.2f}x | {best / ref('`scd`'):.2f}x |")
        lines.append("")
    return "\n".join(lines)


def quantized_fid(reps: list[dict], files: list[str]) -> str:
    """``vgen bench +experiment=quantized-fid`` runs (one per seed and set of models): FID-photo and KID per model
    (a row) and seed (a column), each run named below with its machine and command."""
    seeds = list(dict.fromkeys(rep["config"]["seed"] for rep in reps))
    cell = {(r["model"], rep["config"]["seed"]): r for rep in reps for r in rep["rows"]}
    models = list(dict.fromkeys(r["model"] for rep in reps for r in rep["rows"]))
    n = {r.get("fid_samples") for rep in reps for r in rep["rows"]}
    lines = [f"FID-photo (KID) of {', '.join(map(str, sorted(n)))} images of `ar` against photos-test, by seed:", "",
             "| model | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for m in models:
        lines.append(f"| {m} | " + " | ".join(
            f"{cell[m, s]['fid_photo']:.2f} ({cell[m, s]['kid_photo']:.4f})" if (m, s) in cell else "" for s in seeds)
            + " |")
    lines.append("")
    lines += [f"- `{f}`: {', '.join(dict.fromkeys(r['model'] for r in rep['rows']))}; {machine(rep)}, {rep['date']}; "
              f"`{rep['command']}`" for rep, f in zip(reps, files)]
    return "\n".join(lines) + "\n"


GUIDE = {  # a README row's words: the guarantee (tested: docs/samplers.md) and when to reach for it
    "ar": ("exact (the reference)", "the plain sampler; the baseline below"),
    "sjd": ("exact", "AR's distribution, no extra weights"),
    "scd": ("exact, coupled: the very tokens of `ar draw=gumbel`", "AR's distribution, reproducible token for token"),
    "pac": ("exact (recursive rejection over siblings)", "AR's distribution in the fewest passes, where a wide pass "
            "costs little more than a narrow one"),
    "gsd": ("drift (reported, no bound)", "a little speed, drift accepted"),
    "lantern": ("bounded drift: per-token TV <= `delta`", "relaxed acceptance with a bound, on Jacobi drafts"),
    "eagle": ("exact (block verification)", "a GPT with a trained draft head (photos-gpt ships one)"),
    "eagle:accept=lantern": ("bounded drift (`delta` 0.2)", "the most speed from a draft head"),
    "zipar": ("drift (reported, no bound)", "speed from any AR model, training-free"),
    "pjd": ("drift (reported, no bound; `lag` = the width: exact)", "zipar's rows with a Jacobi window each: fewer "
            "passes than zipar at the same `lag`"),
    "nar": ("exact for its model", "a next-neighbour model (NAR)"),
    "var": ("exact", "a next-scale model (VAR): one pass per scale"),
}


def readme(reps: list[dict], files: list[str]) -> str:
    """The README's table (``vgen bench +experiment=readme``): every sampler at its defaults against the fastest AR
    of that machine at batch 1 and 8 (compiled or eager, whichever ran faster), both modes, tokens per pass and
    FID-photo. Settings are the keys of GUIDE; each one's eager cell is the setting with ``compile=false``.

    Several files: runs of the same experiment on one machine that hold different cells (e.g. the eager cells and the
    compiled ones). A cell is taken from the first file that has it and is held to the fastest AR *of its own run*
    (paired rounds are only paired within a run); the header names every run."""
    rows, runs = {}, {}  # (setting, batch) -> row; -> the run (index) it came from
    for i, rep in enumerate(reps):
        for r in rep["rows"]:
            if rows.setdefault((r["sampler"], r["batch_size"]), r) is r:
                runs[(r["sampler"], r["batch_size"])] = i
    batches = sorted({b for _, b in rows})

    def eager(s):  # the setting's eager cell: its options plus compile=false, in whatever order the run wrote them
        return next((v for v, _ in rows if v != s and _label(v) == _label(s) and "compile=false" in v), None)

    def own(r):  # the rows of the run a cell came from
        return reps[runs[(r["sampler"], r["batch_size"])]]["rows"]

    def fastest(rep):
        ar = {b: _fastest_ar(rep["rows"], r) for b in batches
              for r in rep["rows"] if r["sampler"] in ("ar", "ar:compile=false") and r["batch_size"] == b}
        return "; ".join(f"batch {b}: {_mode(rep, ar[b]['sampler'], ar[b])} `ar`, "
                         f"{ar[b]['ms_per_token']:.2f} ms per token" for b in sorted(ar))
    official = rows.get(("ar", batches[0]), {}).get("speedup_vs_llamagen-loop")
    tail = ("compiled / eager (a dash: not in the run); a speculative sampler whose window=auto found no width faster "
            "than AR's loop runs that loop (1.00 tokens per pass).")
    if len(reps) == 1:
        head = (f"{_run_line(reps[0], files[0])}. Each speed cell is the setting's time against the fastest `ar` at "
                f"that batch size ({fastest(reps[0])}), " + tail)
    else:
        head = (f"{len(reps)} runs on one machine, each cell from the first that holds it and timed against the "
                "fastest `ar` of its own run at that batch size, " + tail + " " + " ".join(
                    f"Run {i + 1}: {_run_line(rep, f)}; fastest `ar` {fastest(rep)}." for i, (rep, f)
                    in enumerate(zip(reps, files))))
    lines = [head, "",
             "| sampler | guarantee | model | tokens / pass, batch 1 | " +
             " | ".join(f"x fastest AR, batch {b}" for b in batches) + " | FID-photo (x AR's) | use it when |",
             "|---|---|---|---|" + "---|" * len(batches) + "---|---|"]
    for s, (guarantee, when) in GUIDE.items():
        cells = [(rows.get((s, b)), rows.get((eager(s), b))) for b in batches]
        if not any(c or e for c, e in cells):
            continue
        first = next(r for r in cells[0] if r)
        single = _mode(reps[0], s) == "eager"  # a setting that takes no compile option (var): one figure

        def both(pair, fmt):  # compiled / eager, a dash for a cell the runs left out
            if single:
                return fmt(pair[0]) if pair[0] else "-"
            return " / ".join(fmt(r) if r else "-" for r in pair)
        tpp = both(cells[0], lambda r: f"{r['accepted_per_step']:.2f}")
        ratios = [both(pair, lambda r: _vs_fastest(own(r), r, interval=False) or "n/a") for pair in cells]
        fid = first.get("fid_photo")
        ar = next((r for r in own(first) if r["sampler"] in ("ar", "ar:compile=false")
                   and r["batch_size"] == batches[0] and r.get("fid_photo")), None)  # its own run's AR
        same = ar is not None and first["model"] == ar["model"]  # another model's FID is not AR's to compare
        fid_s = "" if fid is None else f"{fid:.2f}" + (f" ({fid / ar['fid_photo']:.2f}x)" if same and s != "ar" else "")
        lines.append(f"| {_label(s)} | {guarantee} | {first['model']} | {tpp} | " + " | ".join(ratios)
                     + f" | {fid_s} | {when} |")
    if official:
        lines += ["", f"Compiled `ar` runs {official:.2f}x the official LlamaGen loop's per-step work at batch "
                      f"{batches[0]} (`llamagen-loop`, timed in the same run)."]
    return "\n".join(lines) + "\n"


RENDERERS = {"small-jobs": small_jobs, "bench": bench, "readme": readme, "transformers": transformers,
             "lumina": lumina, "tokens-per-pass": tokens_per_pass, "speculative": speculative, "quantized": quantized,
             "quant-kernels": quant_kernels, "quant-quality": quant_quality, "pass-costs": pass_costs,
             "quantized-load": quantized_load, "gpu-zoo": gpu_zoo, "gpu-shapes": gpu_shapes,
             "pac-windows": pac_windows, "quantized-fid": quantized_fid}
WITH_FILES = ("gpu-zoo", "gpu-shapes", "bench", "readme", "transformers", "lumina", "tokens-per-pass",
              "pac-windows", "quantized-fid")  # renderers that read the files' names too


def render(name: str, args: list[str]) -> str:
    """A block's text: its files read, its ``key=value`` words passed as options (``bench``'s filters)."""
    files = [a for a in args if "=" not in a]
    opts = dict(a.split("=", 1) for a in args if "=" in a)
    reps = [json.loads((REPO / f).read_text()) for f in files]
    out = RENDERERS[name](reps, files, **opts) if name in WITH_FILES else RENDERERS[name](reps, **opts)
    return out.rstrip("\n") + "\n"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def process(check: bool) -> list[str]:
    """Rewrite (or with ``check`` only compare) every marked block; returns 'page: name' for each that differed."""
    stale = []
    for page in pages():
        text = page.read_text()

        def sub(m):
            body = render(m["name"], m["files"].split())
            if body != m["body"]:
                stale.append(f"{page.relative_to(REPO)}: {m['name']}")
            return m.group(1) + body + m.group(5)
        new = BLOCK.sub(sub, text)
        if new != text and not check:
            page.write_text(new)
    return stale


if __name__ == "__main__":
    stale = process(check="--check" in sys.argv)
    if stale:
        print(("stale (run python docs/scripts/render_tables.py): " if "--check" in sys.argv else "rewrote: ")
              + ", ".join(stale))
    sys.exit(1 if stale and "--check" in sys.argv else 0)
