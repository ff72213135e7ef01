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
    moved["machine"]["cpu_capability"] = "AVX2"  # and its vector ISA where the JSON records it
    assert "AMD EPYC (AVX2), 2 cores" in rt.small_jobs([moved]) and "(AVX" not in rt.small_jobs([rep])


def _rep(ar_c, ar_e, sjd_c, sjd_e, rounds=3):
    """A bench JSON of ar and sjd, compiled and eager, at batch 1: seconds per round (the cells' medians)."""
    def row(sampler, sec, tpp=1.0):
        return {"model": "photos-gpt", "sampler": sampler, "batch_size": 1, "seconds": sec, "all_seconds": [sec] * rounds,
                "ms_per_token": sec, "accepted_per_step": tpp, "speedup_vs_ar": 1.0}
    return {"command": "vgen bench +experiment=readme", "date": "2026-11-28", "dtype": {"photos-gpt": "float32"},
            "config": {"num_samples": 8, "repeats": rounds, "compile": True},
            "machine": {"cpu": "AMD EPYC", "cores": 2, "torch": "2.14.1", "vgen_commit": "abc1234"},
            "rows": [row("ar", ar_c), row("ar:compile=false", ar_e), row("sjd", sjd_c, 1.5),
                     row("sjd:compile=false", sjd_e, 1.7)]}


def test_the_readme_table_holds_every_cell_to_the_fastest_ar():
    rt = renderer()
    text = rt.readme([_rep(ar_c=2.0, ar_e=4.0, sjd_c=2.5, sjd_e=3.2)], ["docs/bench/x.json"])
    sjd = next(line for line in text.splitlines() if line.startswith("| `sjd`"))
    assert "| 0.80 / 0.62 |" in sjd  # 2.0 / 2.5 compiled, 2.0 / 3.2 eager: both against compiled ar, the faster
    assert "| 1.50 / 1.70 |" in sjd  # tokens per pass, compiled / eager
    assert "compiled `ar`, 2.00 ms per token" in text and "AMD EPYC" in text and "float32" in text
    # where eager ar is the faster, eager ar is the baseline
    text = rt.readme([_rep(ar_c=5.0, ar_e=4.0, sjd_c=2.5, sjd_e=3.2)], ["docs/bench/x.json"])
    assert "eager `ar`, 4.00 ms per token" in text
    assert "| 1.60 / 1.25 |" in next(line for line in text.splitlines() if line.startswith("| `sjd`"))


def test_the_readme_table_holds_a_cell_to_its_own_runs_ar():
    rt = renderer()
    eager = _rep(ar_c=2.0, ar_e=4.0, sjd_c=2.5, sjd_e=3.2)
    eager["rows"] = [r for r in eager["rows"] if r["sampler"] != "sjd"]  # run 1: no compiled sjd
    compiled = _rep(ar_c=1.0, ar_e=4.0, sjd_c=1.25, sjd_e=3.2)  # run 2: a faster spell of the machine
    compiled["rows"] = [r for r in compiled["rows"] if r["sampler"] in ("ar", "sjd")]
    text = rt.readme([eager, compiled], ["docs/bench/a.json", "docs/bench/b.json"])
    sjd = next(line for line in text.splitlines() if line.startswith("| `sjd`"))
    # compiled sjd against run 2's compiled ar (1.0 / 1.25), eager sjd against run 1's (2.0 / 3.2)
    assert "| 0.80 / 0.62 |" in sjd, sjd
    assert "Run 1:" in text and "Run 2:" in text and "docs/bench/b.json" in text
    ar = next(line for line in text.splitlines() if line.startswith("| `ar`"))
    assert "| 1.00 / 0.50 |" in ar  # the ar row is the first run's


def test_the_bench_table_filters_and_pairs():
    rt = renderer()
    rep = _rep(ar_c=2.0, ar_e=4.0, sjd_c=2.5, sjd_e=3.2)
    rep["rows"][3]["all_seconds"] = [3.0, 3.2, 3.4]  # rounds that differ: a paired interval
    text = rt.bench([rep], ["docs/bench/x.json"], samplers="sjd")
    lines = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert len(lines) == 2 and all("`sjd`" in ln for ln in lines)  # only sjd's cells
    eager = next(ln for ln in lines if "| eager |" in ln)
    assert "0.63 (0.5" in eager  # x the fastest (compiled) ar, geometric mean of 2/3, 2/3.2, 2/3.4 with its interval


def test_the_pac_windows_table_takes_the_best_tree_over_sjd_and_scd():
    """docs/scripts/pac_windows.py's JSON: one row per model and window, a column per setting, the best pac tree's
    ratio to sjd's and to scd's (gumbel, the default) tokens per pass."""
    rt = renderer()
    def row(sampler, tpp, share, **o):
        return {"model": "photos-gpt", "window": 32, "sampler": sampler, "options": o, "tokens_per_pass": tpp,
                "one_token_share": share}
    rep = {"samples": 32, "date": "2026-11-29", "machine": {"cpu": "AMD EPYC", "cores": 2, "torch": "2.14.1"},
           "rows": [row("sjd", 2.0, 0.5), row("scd", 2.5, 0.6), row("scd", 3.0, 0.6, coupling="maximal"),
                    row("pac", 3.2, 0.4, tree_width=3, tree_depth=2, chains="main"),
                    row("pac", 3.6, 0.45, tree_width=3, tree_depth=2, chains="leaves")]}
    out = rt.pac_windows([rep], ["docs/bench/x.json"])
    assert "| `sjd` | `scd` | `scd` coupling=maximal | `pac` 3x2 | `pac` 3x2 leaves |" in out
    assert "| photos-gpt | 32 | 2.00 (0.50) | 2.50 (0.60) | 3.00 (0.60) | 3.20 (0.40) | 3.60 (0.45) | 1.80x | 1.44x |" in out
    assert "AMD EPYC, 2 cores" in out and "32 samples" in out and "cells added" not in out
    rep["commands"] = ["python docs/scripts/pac_windows.py photos-gpt --trees 4x2L --no-baselines (vgen b2)"]
    assert "(cells added at vgen b2)" in rt.pac_windows([rep], ["docs/bench/x.json"])


def test_the_quantized_fid_table_puts_each_seed_in_a_column():
    """``vgen bench +experiment=quantized-fid`` runs at two seeds, int4 in runs of its own: one row per model, a column
    per seed, FID (KID); every run named with its machine."""
    rt = renderer()
    def rep(seed, commit, *cells):
        return {"command": f"vgen bench +experiment=quantized-fid seed={seed}", "config": {"seed": seed},
                "date": "2026-11-29", "machine": {"cpu": "AMD EPYC", "cores": 2, "torch": "2.14.1", "vgen_commit": commit},
                "rows": [{"model": m, "fid_photo": f, "kid_photo": k, "fid_samples": 1024} for m, f, k in cells]}
    reps = [rep(0, "a1", ("photos-gpt", 57.03, 0.0838), ("photos-gpt@int8", 56.41, 0.0816)),
            rep(1000, "a1", ("photos-gpt", 55.69, 0.0809)), rep(0, "b2", ("photos-gpt@int4", 55.97, 0.0815))]
    out = rt.quantized_fid(reps, ["docs/bench/s0.json", "docs/bench/s1000.json", "docs/bench/int4.json"])
    assert "| model | seed 0 | seed 1000 |" in out and "1024 images" in out
    assert "| photos-gpt | 57.03 (0.0838) | 55.69 (0.0809) |" in out
    assert "| photos-gpt@int8 | 56.41 (0.0816) |  |" in out
    assert "| photos-gpt@int4 | 55.97 (0.0815) |  |" in out
    assert "- `docs/bench/int4.json`: photos-gpt@int4; AMD EPYC, 2 cores, torch 2.14.1, vgen b2" in out
