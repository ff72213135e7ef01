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


RENDERERS = {"small-jobs": small_jobs}


def render(name: str, files: list[str]) -> str:
    reps = [json.loads((REPO / f).read_text()) for f in files]
    return RENDERERS[name](reps).rstrip("\n") + "\n"


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
