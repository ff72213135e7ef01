"""The vgen command: files written, one-line errors with exit code 2, no tracebacks."""
import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def run(args, cwd):
    return subprocess.run([sys.executable, "-m", "vgen", *args], cwd=cwd, capture_output=True, text=True, env=ENV,
                          timeout=300)


def run_measured(argv, cwd, timeout=300):
    """Run ``argv`` like ``run`` does; also return its peak resident memory in MiB as the kernel counted it
    (wait4's ru_maxrss): a measurement independent of anything the command reports about itself."""
    import tempfile
    import threading
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, text=True, env=ENV)
        killer = threading.Timer(timeout, p.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            killer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(argv, p.returncode, out.read(), err.read()), usage.ru_maxrss / 1024


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_sample_writes_pngs_grid_and_stats(tiny_pipeline, tmp_path):
    out = tmp_path / "out"
    r = run(["sample", f"model.path={tiny_pipeline}", "labels=[0,3]", "num_samples=5", "batch_size=2", "seed=4",
             "sampler.top_k=5", f"outdir={out}", "progress=false"], tmp_path)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.iterdir() if p.suffix == ".png")
    assert names == [f"{i:06d}.png" for i in range(5)] + ["grid.png"]
    st = json.loads((out / "stats.json").read_text())
    assert st["labels"] == [0, 3, 0, 3, 0] and st["num_samples"] == 5
    assert st["options"]["top_k"] == 5 and st["options"]["cfg_scale"] == 2.0  # card default kept
    assert st["forward_passes"] == 3 * 16 and st["tokens"] == 5 * 16
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))


def test_sample_output_matches_python_api(tiny_pipeline, tmp_path):
    """The CLI (in process: the main() the command runs) with batch_size=2 writes the same bytes the API produces
    for the whole batch at once."""
    import numpy as np
    import torch
    from PIL import Image

    from vgen import load_pipeline
    from vgen.cli import main
    out = tmp_path / "o"
    main(["sample", f"model.path={tiny_pipeline}", "labels=[1,2,3]", "num_samples=3", "batch_size=2", "seed=11",
          f"outdir={out}", "progress=false"])
    gen = load_pipeline(str(tiny_pipeline)).generate([1, 2, 3], seed=11)
    for i in range(3):
        png = torch.from_numpy(np.array(Image.open(out / f"{i:06d}.png"))).permute(2, 0, 1)
        assert torch.equal(png, gen.images[i])


@pytest.mark.parametrize("args,msg", [
    (["model=nope"], "unknown model 'nope'; available: photos-car, photos-car-draft, photos-emu3, photos-gpt"),
    (["sampler=nope"], "unknown sampler 'nope'; available: ar"),
    (["labels=[99]"], "class id 99 out of range"),
    (["sampler.temperature=-1"], "temperature must be >= 0"),
    (["sampler.top_k=-2"], "top_k must be >= 0"),
    (["sampler.top_k=100000"], "above the vocabulary size"),
    (["sampler.top_p=0"], "top_p must be in (0, 1]"),
    (["sampler.cfg_scale=-1"], "cfg_scale must be >= 0"),
    (["num_samples=0"], "num_samples must be a whole number >= 1"),
    (["sampler.temperature=nan"], "temperature must be a finite number"),
    (["seed=-1"], "seed must be a whole number in 0.."),
    (["device=cuda:7"], "device='cuda:7'"),
])
def test_bad_input_one_line_error(tiny_pipeline, tmp_path, args, msg, capsys):
    """In process (the same main() the command runs; a subprocess per case would cost 2 s of imports each):
    exit code 2, the message, one line, nothing written. test_bad_input_in_a_real_process covers the process."""
    from vgen.cli import main
    extra = [] if args[0].startswith("model=") else [f"model.path={tiny_pipeline}"]
    with pytest.raises(SystemExit) as e:
        main(["sample", *extra, *args, f"outdir={tmp_path / 'x'}", "progress=false"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert msg in err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x" / "stats.json").exists()


# the zoo's pipelines (vgen/zoo/*/pipeline.json): every one a `model=` choice, with no YAML in vgen/configs/model
ZOO_PIPELINES = ["photos-car", "photos-car-draft", "photos-gpt", "photos-mar", "photos-nar", "photos-var",
                 "photos-video-gpt", "photos-video-nar"]


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_the_model_group_is_the_zoo():
    """The ``model`` config group is generated from the zoo: its choices are exactly the zoo's pipelines (and its
    transformers models, which `vgen sample` takes), and every command that takes a model composes with each
    (name set, path null)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from vgen import list_models
    from vgen.configs import register
    assert set(ZOO_PIPELINES) <= set(list_models())
    register()
    with initialize_config_module("vgen.configs", version_base="1.3"):
        from vgen.cards import list_transformers_models
        assert GlobalHydra.instance().config_loader().get_group_options("model") == sorted(
            list_models() + list_transformers_models())
        for name in list_models():
            for command in ("sample", "demo", "scalekv"):
                cfg = compose(command, overrides=[f"model={name}"])
                assert (cfg.model.name, cfg.model.path) == (name, None), (command, name)
        cfg = compose("sample", overrides=["model.path=vgen/zoo/photos-mar"])
        assert (cfg.model.name, cfg.model.path) == ("photos-gpt", "vgen/zoo/photos-mar")


def test_unknown_model_lists_the_whole_zoo(capsys):
    from vgen import list_models
    from vgen.cards import list_transformers_models
    zoo = sorted(list_models() + list_transformers_models())
    for command in ("sample", "demo", "bench", "scalekv"):
        err = main_error([command, "model=nope", "--cfg", "job"], capsys)
        assert err == (f"vgen {command}: error: unknown model 'nope'; available: {', '.join(zoo)} "
                       "(or model.path=<folder with pipeline.json>)")


def test_model_choice_of_bench_and_train(capsys):
    """`vgen bench model=<name>` (or model.path=) benchmarks that one model; `vgen train recipe=drafter
    model=<name>` sets the recipe's target pipeline."""
    from vgen.cli import main
    main(["bench", "model=photos-video-nar", "--cfg", "job"])
    assert "models:\n- photos-video-nar\n" in capsys.readouterr().out
    main(["bench", "model.path=vgen/zoo/photos-mar", "--cfg", "job"])
    assert "models:\n- vgen/zoo/photos-mar\n" in capsys.readouterr().out
    err = main_error(["bench", "model=photos-var", "models=[photos-gpt]", "--cfg", "job"], capsys)
    assert "model=photos-var and models=[photos-gpt] name the models more than once" in err
    main(["train", "recipe=drafter", "model=photos-car", "--cfg", "job"])
    assert "model: photos-car\n" in capsys.readouterr().out


@pytest.mark.slow
def test_sample_a_zoo_model_the_yaml_group_lacked(tmp_path, capsys):
    """photos-video-nar was reachable only through model.path= before the group came from the zoo."""
    from vgen.cli import main
    out = tmp_path / "out"
    main(["sample", "model=photos-video-nar", "num_samples=1", f"outdir={out}", "progress=false"])
    st = json.loads((out / "stats.json").read_text())
    assert st["model"] == "photos-video-nar" and st["num_samples"] == 1
    assert (out / "000000.mp4").stat().st_size > 0 and (out / "000000.gif").exists()


def main_error(args, capsys) -> str:
    """Run the command's main() in process; it must exit with code 2 and one line on stderr, which is returned."""
    from vgen.cli import main
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_missing_pipeline_folder(tmp_path, capsys):
    assert "unknown model" in main_error(["sample", f"model.path={tmp_path / 'nowhere'}"], capsys)


def test_checkpoint_for_another_architecture(tiny_pipeline, tmp_path, capsys):
    """A pipeline whose model file is a VQ checkpoint: refused with the kind that would load it."""
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(tiny_pipeline, bad)
    shutil.copy(bad / "vq.safetensors", bad / "gpt.safetensors")
    err = main_error(["sample", f"model.path={bad}", f"outdir={tmp_path / 'y'}"], capsys)
    assert "load_official('vq'" in err


@pytest.mark.slow
def test_help_and_unknown_command(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-m", "vgen", *a], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=ENV) for a in (["--help"], ["frobnicate"])]
    (out, _), (_, err) = (p.communicate(timeout=300) for p in procs)  # side by side: each is mostly imports
    assert procs[0].returncode == 0 and "sample" in out and "ar" in out
    assert procs[1].returncode == 2 and "unknown command" in err


@pytest.mark.slow
def test_bench_writes_table_json_and_plot(tiny_pipeline, tmp_path):
    out = tmp_path / "bench"
    r, child_peak_mb = run_measured([sys.executable, "-m", "vgen", "bench", f"models=[{tiny_pipeline}]",
                                     "batch_sizes=[1,2]", "repeats=1", "compile=false", "num_samples=4",
                                     'samplers=[ar,"sjd:window=4,init=vertical",lantern]', f"outdir={out}",
                                     "fid_samples=6"], tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "bench.json").read_text())
    cells = {(row["sampler"], row["batch_size"]) for row in rep["rows"]}
    assert cells == {(s, b) for s in ("llamagen-loop", "ar", "sjd:window=4,init=vertical", "lantern") for b in (1, 2)}
    ar = next(row for row in rep["rows"] if row["sampler"] == "ar" and row["batch_size"] == 2)
    assert ar["forward_passes"] == 2 * 16 and ar["speedup_vs_llamagen-loop"] > 0  # 4 images in batches of 2
    sjd = next(row for row in rep["rows"] if row["sampler"].startswith("sjd") and row["batch_size"] == 1)
    assert sjd["pass_reduction"] == 4 * 16 / sjd["forward_passes"] > 1
    assert 0 < sjd["acceptance_rate"] <= 1 and "nll_excess" in sjd and sjd["speedup_vs_ar"] > 0
    h = sjd["pass_histogram"]  # passes deciding 1..4 tokens (the prefill and each sample's cut last pass left out)
    assert len(h) == 4 and 0 < sum(h) < sjd["forward_passes"] and sjd["single_token_share"] == h[0] / sum(h)
    assert sum(c * n for c, n in enumerate(h, 1)) < 4 * 16
    assert "| ms/token |" in r.stdout and "fewer passes" in r.stdout and "FID-photo" in r.stdout
    assert "1-token passes" in r.stdout
    assert (out / "bench.png").stat().st_size > 1000
    assert sjd["fid_samples"] == 6 and sjd["fid_photo"] > 0 and sjd["fid_photo_vs_ar"] > 0
    # lantern's window=auto draws per batch size (its cost table is the job's): scored at each
    assert all(row["fid_photo"] > 0 for row in rep["rows"] if row["sampler"] == "lantern")
    # peak RSS per cell: what the process held while the cell ran, checked against the kernel's counts (16 MiB
    # slack for lazily synced RSS counters). Above: no cell over the process-wide peak reported after the cells
    # ran, and that one no higher than the whole command's peak at exit. Below: every cell at least what a bare
    # interpreter holds once torch is imported (its resident set after the import, not the import's transient
    # peak; bench has torch and a model loaded), less 20%.
    peaks = {(row["sampler"], row["batch_size"]): row["peak_rss_mb"] for row in rep["rows"]}
    assert child_peak_mb < os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    assert max(peaks.values()) <= rep["peak_rss_mb"] + 16 and rep["peak_rss_mb"] <= child_peak_mb + 16
    bare = subprocess.run([sys.executable, "-c", "import os, torch; print(int(open('/proc/self/statm').read().split()[1])"
                           " * os.sysconf('SC_PAGE_SIZE') / 2 ** 20)"], capture_output=True, text=True)
    assert bare.returncode == 0, bare.stderr
    torch_mb = float(bare.stdout)
    assert torch_mb > 100, torch_mb
    assert min(peaks.values()) > 0.8 * torch_mb, (peaks, torch_mb)
    base = next(row for row in rep["rows"] if row["sampler"] == "llamagen-loop")
    assert "fid_photo" not in base  # the official loop's own RNG: no paired samples to score
    # what a table rendered from this JSON names: the machine, the date, each model's dtype, each cell's compile mode
    import torch
    assert rep["machine"]["cores"] >= 1 and rep["machine"]["torch"] == torch.__version__ and rep["date"][:2] == "20"
    assert rep["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # AVX2 / AVX512: one model name
    assert rep["dtype"] == {str(tiny_pipeline): "float32"} and ar["compile"] is False


def test_paired_speedup_is_the_geometric_mean_of_round_ratios_with_a_t_interval():
    """vgen bench's paired column: round i of a cell against round i of AR's; a steady 2x is 2x with no spread, a
    noisy one gets the textbook interval, and fewer than 3 rounds (or unpaired rounds) give nothing."""
    import math

    from scipy import stats

    from vgen.eval.bench import markdown_table, paired_speedup
    steady = paired_speedup([2.0, 4.0, 3.0], [1.0, 2.0, 1.5])
    assert steady["speedup_vs_ar_rounds"] == [2.0, 2.0, 2.0] and steady["speedup_vs_ar_paired"] == pytest.approx(2.0)
    assert steady["speedup_vs_ar_ci95"] == pytest.approx([2.0, 2.0])
    base, cell = [5.0, 7.0, 4.9, 6.0], [4.5, 7.5, 4.0, 5.0]
    got = paired_speedup(base, cell)
    logs = [math.log(b / c) for b, c in zip(base, cell)]
    lo, hi = stats.t.interval(0.95, len(logs) - 1, loc=sum(logs) / 4, scale=stats.sem(logs))
    assert got["speedup_vs_ar_ci95"] == pytest.approx([math.exp(lo), math.exp(hi)])
    assert got["speedup_vs_ar_ci95"][0] < 1 < got["speedup_vs_ar_ci95"][1]  # this noise cannot tell it from AR
    assert paired_speedup([1.0, 2.0], [1.0, 1.0]) == {} and paired_speedup([1.0] * 3, [1.0] * 4) == {}
    row = {"model": "m", "sampler": "sjd", "batch_size": 1, **got}
    assert f"{got['speedup_vs_ar_paired']:.2f} ({math.exp(lo):.2f}-{math.exp(hi):.2f})" in markdown_table([row])


@pytest.mark.slow
def test_bench_rejects_bad_settings_before_loading(tiny_pipeline, tmp_path, capsys, monkeypatch):
    from vgen.cli import main  # in process: test_bad_input_in_a_real_process covers the process boundary
    monkeypatch.chdir(tmp_path)
    for args, msg in (('samplers=["sjd:window=1"]', "window must be auto or a whole number >= 2"),
                      ('samplers=["sjd:window"]', "name:key=value"),
                      ("fid_samples=1", "fid_samples must be 0 (off) or >= 2")):
        with pytest.raises(SystemExit) as e:
            main(["bench", f"models=[{tiny_pipeline}]", args, f"outdir={tmp_path}"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and msg in err, err


