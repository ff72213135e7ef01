"""Bad input on the command line: Hydra's own errors as one line (exit 2), nothing touched by a refused run, one
job per output folder (a lock), Ctrl-C stops cleanly, output files checked before the work, the demo's port."""
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from guards import interruptible

from vgen.errors import VGenError


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` (hidden ones included) with its bytes' digest."""
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def cli(args, capsys) -> tuple[int, str]:
    """The `vgen` command in process: (exit code, stderr)."""
    from vgen.cli import main
    with pytest.raises(SystemExit) as e:
        main(args)
    return e.value.code, capsys.readouterr().err.strip()


def one_line(err: str) -> str:
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("arg,msg", [
    ("num_samples=abc", "num_samples=abc: num_samples takes a whole number"),
    ("seed=1.5", "seed=1.5: seed takes a whole number"),
    ("foo=1", "unknown key 'foo': `vgen sample --cfg job` lists every key"),
    ("sampler.foo=3", "unknown key 'sampler.foo'"),
    ("+foo=1", "+foo=1 adds a key vgen does not read"),
    ("+seed=3", "set it without '+' (seed=3 names it"),
    ("++foo=1", "unknown key 'foo'"),
    ("labels=abc", "labels:"),
    ("model.path", "cannot read the override (Error parsing override 'model.path'; missing EQUAL"),
    ("num_samples=[", "cannot read the override"),
])
def test_hydra_errors_are_one_line_with_exit_code_2(arg, msg, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = cli(["sample", arg, f"outdir={tmp_path / 'out'}", "progress=false"], capsys)
    assert code == 2
    assert one_line(err).startswith("vgen sample: error: ") and msg in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere: no outdir, no .hydra in the working folder
    assert os.environ.get("HYDRA_FULL_ERROR") is None  # the switch the CLI sets for itself is put back


def test_plus_overrides_that_hydra_or_vgen_reads_still_work(tmp_path, capsys, monkeypatch):
    """'++' on one of vgen's keys sets it; '+' still adds Hydra's own settings and config groups."""
    monkeypatch.chdir(tmp_path)
    from vgen.cli import main
    main(["sample", "++seed=3", "+hydra.job.env_set.VGEN_TEST_X=1", "--cfg", "job"])
    out = capsys.readouterr().out
    assert "seed: 3" in out and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make,msg", [
    (lambda t: (t / "f.txt").write_text("x") and t / "f.txt", "is a file, not a folder"),
    (lambda t: (t / "f.txt").write_text("x") and t / "f.txt" / "sub", "f.txt is a file"),
    (lambda t: Path("/proc/vgen-out"), "/proc is not writable"),
])
def test_outdir_that_cannot_hold_samples(make, msg, tiny_pipeline, tmp_path, capsys):
    out = make(tmp_path)
    before = snapshot(tmp_path)
    code, err = cli(["sample", f"model.path={tiny_pipeline}", f"outdir={out}", "progress=false"], capsys)
    assert code == 2 and msg in one_line(err) and "choose" in err
    assert snapshot(tmp_path) == before


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_refused_runs_leave_the_folder_byte_identical(tiny_pipeline, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    base = ["sample", f"model.path={tiny_pipeline}", "num_samples=2", "batch_size=2", f"outdir={out}",
            "progress=false"]
    from vgen.cli import main
    main(base + ["seed=3"])
    assert (out / ".hydra" / "config.yaml").exists() and "seed: 3" in (out / ".hydra" / "config.yaml").read_text()
    assert not (out / ".vgen.lock").exists()  # released at the end
    before = snapshot(tmp_path)
    # a resume with another seed: refused, and the recorded config still says seed 3
    code, err = cli(base + ["seed=4"], capsys)
    assert code == 2 and "holds samples of another run (differs in seed)" in one_line(err)
    assert snapshot(tmp_path) == before
    # refused before any work (a bad option; a Hydra type error): same
    for bad in (["sampler.temperature=nan"], ["num_samples=abc"], ["seed=-1"]):
        code, err = cli(base + bad, capsys)
        assert code == 2, err
        assert snapshot(tmp_path) == before
    # a new folder that a refused run names is never created
    code, _ = cli(["sample", f"model.path={tiny_pipeline}", "sampler.top_k=-2", f"outdir={tmp_path / 'new'}"],
                  capsys)
    assert code == 2 and not (tmp_path / "new").exists()
    # an accepted resume with the same settings keeps every file's bytes (nothing left to draw)
    main(base + ["seed=3"])
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k != "run/stats.json"} == \
           {k: v for k, v in before.items() if k != "run/stats.json"}


def other_job_lock(folder: Path, pid: int, host: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / ".vgen.lock"
    lock.write_text(json.dumps({"host": host or socket.gethostname(), "pid": pid, "job": f"other:{pid}",
                                "started": "2026-01-01 00:00:00"}))
    return lock


def test_a_folder_in_use_is_refused_and_left_alone(tiny_pipeline, tmp_path, capsys):
    out = tmp_path / "run"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other_job_lock(out, sleeper.pid)
        (out / ".000000.png.abc.tmp").write_bytes(b"the other run's file being written")
        before = snapshot(tmp_path)
        code, err = cli(["sample", f"model.path={tiny_pipeline}", "num_samples=1", f"outdir={out}",
                         "progress=false"], capsys)
        assert code == 2 and f"is in use by pid {sleeper.pid}" in one_line(err) and "choose another outdir" in err
        assert snapshot(tmp_path) == before  # its temp file survives, its lock too, nothing of ours is written
        # a lock on another machine cannot be checked from here: refused too, with how to clear it
        other_job_lock(out, 1, host="elsewhere")
        code, err = cli(["sample", f"model.path={tiny_pipeline}", "num_samples=1", f"outdir={out}",
                         "progress=false"], capsys)
        assert code == 2 and "on elsewhere" in one_line(err) and "delete" in err
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_stale_lock_is_taken_over(tiny_pipeline, tmp_path):
    out = tmp_path / "run"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    other_job_lock(out, dead.pid)
    from vgen.cli import main
    main(["sample", f"model.path={tiny_pipeline}", "num_samples=1", f"outdir={out}", "progress=false"])
    assert (out / "000000.png").exists() and not (out / ".vgen.lock").exists()


def test_processes_of_one_torchrun_job_share_the_lock(tmp_path, monkeypatch):
    from vgen.jobs import FolderLock
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with FolderLock(tmp_path) as a:
        b = FolderLock(tmp_path)
        b.pid += 1  # another rank's process
        with b:
            assert a.owner and not b.owner
        assert (tmp_path / ".vgen.lock").exists()  # only its creator removes it
        monkeypatch.setenv("MASTER_PORT", "29501")  # another torchrun job
        with pytest.raises(VGenError, match="is in use by pid"):
            FolderLock(tmp_path).__enter__()
    assert not (tmp_path / ".vgen.lock").exists()


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_refused_train_run_creates_nothing_and_an_accepted_one_records_its_config(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    code, err = cli(["train", "recipe=gpt", f"recipe.out={run}", f"recipe.tokenizer={tmp_path / 'none.safetensors'}"],
                    capsys)
    assert code == 2 and "VQ tokenizer" in one_line(err) and "vgen train recipe=vq" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no run folder, no .hydra, no outputs/ anywhere
    from vgen.cli import main
    main(["train", "recipe=vq", f"recipe.out={run}", "recipe.steps=1", "recipe.batch_size=2", "recipe.eval_n=4",
          "recipe.save_every=1", "recipe.model.codebook_size=16", "recipe.model.encoder_ch_mult=[1,2]",
          "recipe.model.decoder_ch_mult=[1,2]", "recipe.model.z_channels=8", "recipe.model.ch=16"])
    assert (run / "vq.safetensors").exists()
    assert (run / ".hydra" / "config.yaml").exists() and "recipe.steps=1" in (run / ".hydra" / "overrides.yaml").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tiny_pipeline, tmp_path, capsys, monkeypatch):
    from vgen.pipeline import Pipeline
    calls = []
    real = Pipeline.generate

    def generate(self, *a, **k):  # the second batch is interrupted, as by Ctrl-C
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)
    monkeypatch.setattr(Pipeline, "generate", generate)
    out = tmp_path / "run"
    code, err = cli(["sample", f"model.path={tiny_pipeline}", "num_samples=4", "batch_size=2", f"outdir={out}",
                     "progress=false"], capsys)
    assert code == 130 and "Traceback" not in err
    assert err == "vgen sample: interrupted (finished samples are kept: run the same command again to resume)"
    assert sorted(p.name for p in out.glob("0*.png")) == ["000000.png", "000001.png"]
    assert not (out / ".vgen.lock").exists()


@pytest.mark.parametrize("out,msg", [("/proc/m.json", "/proc is not writable"), ("{tmp}", "is a folder")])
def test_eval_checks_its_output_file_before_scoring(out, msg, tmp_path, capsys, monkeypatch):
    import vgen.eval.metrics as metrics
    monkeypatch.setattr(metrics, "fid", lambda *a, **k: pytest.fail("scored before the output was checked"))
    code, err = cli(["eval", "fid", f"samples={tmp_path}", "out=" + out.format(tmp=tmp_path)], capsys)
    assert code == 2 and msg in one_line(err)


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_demo_port_in_use(capsys):
    pytest.importorskip("gradio")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, err = cli(["demo", "server_name=127.0.0.1", f"server_port={port}"], capsys)
    assert code == 2 and f"cannot serve on 127.0.0.1:{port}" in one_line(err) and "server_port=" in err


@pytest.mark.slow
def test_real_processes_sigint_and_config_errors(tiny_pipeline, tmp_path, monkeypatch):
    """The same rules across a real process boundary: a Hydra type error, an unwritable outdir and a value vgen
    refuses (a negative seed) exit 2 with one line; while a run draws, a second one in the same folder is refused
    (exit 2, one line) and deletes nothing; SIGINT (Ctrl-C) mid-run exits 130 with one line, keeps finished samples,
    releases the folder, and the same command resumes."""
    import signal
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    base = [sys.executable, "-m", "vgen", "sample", f"model.path={tiny_pipeline}", "progress=false"]
    work = tmp_path / "work"
    work.mkdir()
    bads = ((["num_samples=abc"], "num_samples takes a whole number"), (["outdir=/proc/vgen-x"], "cannot be written"),
            (["seed=-1"], "vgen sample: error: seed must be a whole number"))
    procs = [subprocess.Popen(base + bad, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for bad, _ in bads]  # side by side: each is mostly imports
    errs = [p.communicate(timeout=120)[1] for p in procs]
    for p, err, (_, msg) in zip(procs, errs, bads):
        assert p.returncode == 2 and msg in one_line(err.strip()), err
    assert errs[2].strip().startswith(bads[2][1])  # vgen's own refusal opens with the command's name
    assert list(work.iterdir()) == []
    out = work / "run"
    cmd = base + ["num_samples=100000", "batch_size=1", "sampler.compile=false", f"outdir={out}"]
    p = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=interruptible)
    t0 = time.time()
    while not (out / "000001.png").exists() and time.time() - t0 < 120 and p.poll() is None:
        time.sleep(0.05)
    assert p.poll() is None, p.communicate()[1]
    try:
        assert json.loads((out / ".vgen.lock").read_text())["pid"] == p.pid
        second = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env, timeout=300)
        assert second.returncode == 2 and "is in use by pid" in one_line(second.stderr.strip()), second.stderr
        assert p.poll() is None, "the first run must still be running while the second is refused"
        drawn = len(list(out.glob("0*.png")))
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err  # it kept drawing after the refusal and stopped on Ctrl-C
    assert one_line(err.strip()).endswith("interrupted (finished samples are kept: run the same command again to resume)")
    kept = sorted(x.name for x in out.glob("0*.png"))
    assert kept == [f"{i:06d}.png" for i in range(len(kept))] and 2 <= drawn <= len(kept) < 100000
    assert not (out / ".vgen.lock").exists() and not list(out.glob(".*.tmp"))
    n = len(kept) + 2  # resume (a shorter job of the same run): only the missing samples are drawn; in process (the
    # main() the command runs: the on-disk state the interrupted process left is what matters; a real process resumes
    # in test_scaleout's killed torchrun job)
    from vgen.cli import main
    monkeypatch.chdir(work)
    main(base[3:] + [f"num_samples={n}", "batch_size=1", "sampler.compile=false", f"outdir={out}"])
    assert json.loads((out / "stats.json").read_text())["generated_now"] <= 3  # a sample cut off mid-write, at most
    assert all((out / f"{i:06d}.png").exists() for i in range(n))
