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
    window=auto chose, ms per token and the paired speed-up against AR in the same mode."""
    lines = []
    for rep in reps:
        c = rep["config"]
        lines += [f"{', '.join(map(str, c['models']))}, {c['num_samples']} images per cell, {c['repeats']} paired rounds "
                  f"({machine(rep)}):", "",
                  "| model | sampler | mode | batch | width | tokens / pass | one-token passes | ms / token | "
                  "x AR (paired, 95% interval) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(rep["rows"], key=lambda r: (r["model"], ":compile=false" not in r["sampler"],
                                                    r["batch_size"])):
            name, _, opts = r["sampler"].partition(":")
            mode = "eager" if "compile=false" in opts or not c.get("compile", True) else "compiled"
            width = "" if name == "ar" else "AR's loop" if r.get("window") == 1 else str(r.get("window", ""))
            share = f"{r['single_token_share']:.0%}" if r.get("single_token_share") is not None else ""
            extra = [o for o in opts.split(",") if o and not o.startswith(("window=", "compile="))]
            name = " ".join([name, *extra])  # the options that tell two cells apart (a draft, a tree)
            lines.append(f"| {r['model']} | `{name}` | {mode} | {r['batch_size']} | {width} | "
                         f"{r['accepted_per_step']:.2f} | {share} | {r['ms_per_token']:.2f} | {_ratio(r)} |")
        lines.append("")
    return "\n".join(lines)


def quantized(reps: list[dict]) -> str:
    """Weight formats side by side: the zoo rows (model@format) and the released-shape cells (hf_quantize)."""
    lines = []
    for rep in reps:
        c = rep["config"]
        lines += [f"The zoo ({c['num_samples']} images per cell, {c['repeats']} rounds; {machine(rep)}):", "",
                  "| model | weights | sampler | batch | ms / token | x float32 | tokens / pass |",
                  "|---|---|---|---|---|---|---|"]
        rows = rep["rows"]
        base = {(r["model"], r["sampler"], r["batch_size"]): r["ms_per_token"] for r in rows if "@" not in r["model"]}
        for r in sorted(rows, key=lambda r: (r["sampler"], r["batch_size"], r["model"])):
            model, _, fmt = r["model"].partition("@")
            f = base.get((model, r["sampler"], r["batch_size"]))
            lines.append(f"| {model} | {fmt or 'float32'} | `{r['sampler'].partition(':')[0]}` | {r['batch_size']} | "
                         f"{r['ms_per_token']:.2f} | {f / r['ms_per_token'] if f else 0:.2f} | "
                         f"{r['accepted_per_step']:.2f} |")
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
                    lines.append(f"| {mode} | {row['weight_bytes'] / 2 ** 20:.0f} | {b} | {t['seconds_per_image']:.2f} "
                                 f"| {t['speedup_vs_float']:.2f} | {t['peak_rss_mb']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def quant_kernels(reps: list[dict]) -> str:
    """One linear layer per weight format (docs/scripts/quant_kernels.py): ms per call and x float32's F.linear."""
    lines = []
    for rep in reps:
        m = rep["machine"]
        lines += [f"{m.get('cpu') or m.get('processor')}, {rep['threads']} threads, torch {rep['torch']}, torchao "
                  f"{rep.get('torchao') or 'absent'}; ms per call (x float32 `F.linear`):", ""]
        fmts = list(rep["rows"][0]["ms"])
        lines += ["| layer | rows | " + " | ".join(fmts) + " |", "|---|---|" + "---|" * len(fmts)]
        for r in rep["rows"]:
            lines.append(f"| {r['layer']} | {r['rows']} | " + " | ".join(
                f"{r['ms'][f]:.1f} ({r['x_float32'][f]:.2f}x)" for f in fmts) + " |")
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
        lines += [f"{gpu_name(rep, f)}, torch {rep['machine'].get('torch', '?')}, {', '.join(c['models'])}, "
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


RENDERERS = {"small-jobs": small_jobs, "speculative": speculative, "quantized": quantized,
             "quant-kernels": quant_kernels, "quant-quality": quant_quality, "pass-costs": pass_costs, "gpu-zoo": gpu_zoo, "gpu-shapes": gpu_shapes}
WITH_FILES = ("gpu-zoo", "gpu-shapes")  # renderers that read the files' names too


def render(name: str, files: list[str]) -> str:
    reps = [json.loads((REPO / f).read_text()) for f in files]
    out = RENDERERS[name](reps, files) if name in WITH_FILES else RENDERERS[name](reps)
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
