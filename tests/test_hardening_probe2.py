"""The second hardening probe's cases: every one a one-line refusal (exit 2, no traceback, nothing written) or a
documented clamp; damaged records and caches never break a run; the Python API raises VGenError, not raw errors."""
import json

import pytest
import torch
from guards import cli_refusal as cli
from guards import interruptible

from vgen.errors import VGenError


@pytest.mark.parametrize("args,msg", [
    (["sample", "labels=[[0,1],[2]]"], "labels must be class ids"),
    (["sample", "labels=[[0,1]]"], "labels must be class ids"),
    (["sample", "outdir="], "outdir is empty"),
    (["sample", "num_samples=99999999999999999999"], "more than there are seeds"),
    (["sample", "outdir=my", "samples"], "quote a value with spaces"),
    (["bench", "samplers=[]"], "samplers is empty"),
    (["bench", "batch_sizes=[0]"], "batch_sizes must list whole numbers >= 1"),
    (["scalekv", "calibrate", "max_ratio=-3"], "max_ratio must be a finite number >= 1"),
    (["eval", "fid", "samples=photos-train", "batch_size=0"], "batch_size must be a whole number >= 1"),
    (["eval", "fid", "samples=photos-train", "kid_subset_size=-1"], "kid_subset_size must be a whole number >= 2"),
    (["train", "recipe=vq", "recipe.out=/proc/foo"], "recipe.out=/proc/foo cannot be written"),
    (["train", "recipe=vq", "recipe.lr=nan"], "recipe.lr must be a finite number > 0"),
    (["train", "recipe=vq", "recipe.steps=-1"], "recipe.steps must be a whole number >= 0"),
    (["train", "recipe=vq", "recipe.batch_size=0"], "recipe.batch_size must be a whole number >= 1"),
    (["train", "recipe=vq", "recipe.precision=fp8"], "recipe.precision must be fp32 or bf16"),
    (["train", "recipe=gpt", "recipe.tokenizer=/etc/passwd"], "is not a checkpoint"),
])
def test_probe_cases_are_one_line_refusals(args, msg, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if args[0] in ("sample", "bench") and not any(a.startswith("outdir") for a in args):
        args = [*args, f"outdir={tmp_path / 'out'}"]
    if args[0] == "scalekv":
        args = [*args, f"out={tmp_path / 'cal.json'}"]
    if args[0] == "train" and not any(a.startswith("recipe.out") for a in args):
        args = [*args, f"recipe.out={tmp_path / 'run'}"]
    code, err = cli([*args, "progress=false"] if args[0] not in ("train", "bench") else args, capsys)
    assert code == 2 and msg in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_calibration_that_is_not_json_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "cal.txt"
    bad.write_text("not json")
    code, err = cli(["sample", "model=photos-var", "sampler=var", "sampler.kv_compression=scalekv",
                     f"sampler.kv_calibration={bad}", f"outdir={tmp_path / 'out'}", "num_samples=1", "progress=false"],
                    capsys)
    assert code == 2 and "ScaleKV calibration" in err and "not readable JSON" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.txt"]


@pytest.mark.parametrize("call,msg", [
    (lambda v: v.load_pipeline(None), "zoo name"),
    (lambda v: v.load_pipeline(123), "zoo name"),
    (lambda v: v.load_pipeline("photos-gpt", dtype="float99"), "dtype must be one of"),
    (lambda v: v.sample(None, [0]), "must be a vgen model"),
    (lambda v: v.eval.fid(None), "say which images"),
])
def test_python_api_raises_vgen_errors(call, msg):
    import vgen
    import vgen.eval  # noqa: F401
    with pytest.raises(VGenError, match=msg):
        call(vgen)


def test_api_takes_dtype_names_and_refuses_strings_as_labels(tiny_pipeline):
    import vgen
    pipe = vgen.load_pipeline(str(tiny_pipeline), dtype="float16")
    assert next(pipe.model.parameters()).dtype == torch.float16
    with pytest.raises(VGenError, match="got the string 'x'"):
        vgen.sample(vgen.load_pipeline(str(tiny_pipeline)).model, "x")


def test_generation_save_to_an_unwritable_folder_is_a_vgen_error():
    from vgen.pipeline import Generation
    g = Generation(torch.zeros(1, 3, 8, 8, dtype=torch.uint8), torch.zeros(1, 4), torch.tensor([0]), [0])
    with pytest.raises(VGenError, match="cannot be written"):
        g.save("/proc/foo")


def test_a_damaged_width_cache_never_breaks_a_run(tiny_pipeline, tmp_path, monkeypatch):
    """$VGEN_CACHE's width tables: a list instead of an object, an entry of garbage: ignored and rewritten."""
    import vgen
    monkeypatch.setenv("VGEN_CACHE", str(tmp_path))
    for name in ("pass_tokens.json", "spec_speed.json", "pass_costs.json"):
        (tmp_path / name).write_text("[1, 2")
    pipe = vgen.load_pipeline(str(tiny_pipeline))
    gen = pipe.generate([0, 1], sampler="sjd", seed=0, window="auto")
    assert gen.tokens.shape == (2, 16)
    rewritten = []
    for f in tmp_path.glob("*.json"):
        try:
            rewritten.append(isinstance(json.loads(f.read_text()), dict))
        except ValueError:
            pass
    assert rewritten and all(rewritten)  # the tables it used were rewritten whole


def test_resume_with_damaged_records(tiny_pipeline, tmp_path, capsys):
    from vgen.cli import main
    out = tmp_path / "s"
    args = ["sample", f"model.path={tiny_pipeline}", "num_samples=3", "batch_size=1", f"outdir={out}", "progress=false"]
    main(args)
    part = sorted((out / ".parts").glob("*.json"))[0]
    part.write_text("{oops")
    whole = (out / "000002.png").read_bytes()
    (out / "000002.png").unlink()  # a missing sample: drawn again
    with pytest.warns(UserWarning, match="damaged"):
        main(args)  # the damaged part loses only its batch's stats; the missing sample is drawn again
    stats = json.loads((out / "stats.json").read_text())
    assert stats["samples_with_stats"] == 2 and (out / "000002.png").read_bytes() == whole
    (out / "run.json").write_text("{oops")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()}
    code, err = cli(args, capsys)
    assert code == 2 and "run record" in err and "run.json" in err and "not readable JSON" in err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()} == before  # nothing rewritten


def test_ctrl_c_while_the_command_starts_is_one_line(tmp_path):
    """An interrupt during the imports (the first second or two) prints one line, exits 130, writes nothing."""
    import shutil
    import signal
    import subprocess
    import time
    exe = shutil.which("vgen")
    if exe is None:
        pytest.skip("the vgen console script is not on PATH")
    p = subprocess.Popen([exe, "sample", f"outdir={tmp_path / 'out'}"], cwd=tmp_path, stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True, preexec_fn=interruptible)
    time.sleep(1.0)  # inside the imports on this machine (torch alone takes seconds); a loaded one is later still
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    if "while starting" in err:
        assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_one_line_naming_what_is_on_disk(tiny_pipeline, tmp_path, capsys, monkeypatch):
    import errno

    from vgen import pipeline
    real = pipeline.Generation.save
    calls = []

    def save(self, folder, indices=None, fps=8):
        calls.append(indices)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, folder, indices, fps)
    monkeypatch.setattr(pipeline.Generation, "save", save)
    out = tmp_path / "s"
    code, err = cli(["sample", f"model.path={tiny_pipeline}", "num_samples=3", "batch_size=1", f"outdir={out}",
                     "progress=false"], capsys)
    assert code == 2 and f"no space left on the device of {out}: 1 of 3 samples are safely on disk" in err, err


def test_a_broken_model_file_is_refused_before_anything_is_written(tiny_pipeline, tmp_path, capsys):
    (tiny_pipeline / "gpt.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")  # truncated
    out = tmp_path / "s"
    code, err = cli(["sample", f"model.path={tiny_pipeline}", "num_samples=2", f"outdir={out}", "progress=false"],
                    capsys)
    assert code == 2 and "gpt.safetensors" in err, err
    assert not out.exists()


def test_a_window_wider_than_a_sample_is_that_sample(tiny_gpt):
    """`window=100000` (wider than the image) is clamped to the sample's tokens: the same bytes as window=L, no
    100000-wide buffers; max_window alike (window=auto with costs past L)."""
    from vgen.samplers import sample
    L = tiny_gpt.seq_len
    wide, st = sample(tiny_gpt, [0, 1], "sjd", seed=4, cfg_scale=2.0, window=100000)
    exact, _ = sample(tiny_gpt, [0, 1], "sjd", seed=4, cfg_scale=2.0, window=L)
    assert torch.equal(wide, exact) and st["mean_window"] <= L
    auto, _ = sample(tiny_gpt, [0, 1], "sjd", seed=4, cfg_scale=2.0, window="auto", max_window=100000,
                     costs="1:1,2:1.1,4:1.2,8:1.3,16:1.4,32:1.5")
    assert auto.shape == (2, L)
