"""The tables marked ``<!-- render: ... -->`` on the user pages are what docs/scripts/render_tables.py makes of their
bench JSON files: a figure cannot drift from its file."""
import copy
import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def renderer():
    spec = importlib.util.spec_from_file_location("render_tables", REPO / "docs" / "scripts" / "render_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rendered_tables_match_their_json():
    rt = renderer()
    blocks = [m for page in rt.pages() for m in rt.BLOCK.finditer(page.read_text())]
    assert blocks, "no rendered table on any page: the check would test nothing"
    assert rt.process(check=True) == []


def test_a_changed_figure_changes_the_render():
    rt = renderer()
    rep = json.loads((REPO / "docs/bench/small-jobs-8.json").read_text())
    moved = copy.deepcopy(rep)
    row = next(r for r in moved["rows"] if r["sampler"] != "ar" and "speedup_vs_ar_paired" in r)
    row["speedup_vs_ar_paired"] *= 1.1
    assert rt.small_jobs([rep]) != rt.small_jobs([moved])
    assert "AMD EPYC" in rt.small_jobs([rep])  # the machine is named
