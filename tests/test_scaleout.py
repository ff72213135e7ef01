"""Scale-out: torchrun sharding gives the bytes of one process, killed runs resume to the same bytes, Hydra
multirun sweeps and the submitit launcher."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from guards import needs_zoo

ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}
pytestmark = needs_zoo("photos-gpt")  # `vgen sample` without model= samples the zoo
ZOO_ARGS = ["num_samples=8", "seed=3", "progress=false"]  # 2 processes: 2 batches of 2 each, or 4 samples of 1


def vgen(args, cwd, timeout=600):
    return subprocess.run([sys.executable, "-m", "vgen", *args], cwd=cwd, capture_output=True, text=True, env=ENV,
                          timeout=timeout)


def torchrun_cmd(args, nproc=2):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    return [torchrun, f"--nproc_per_node={nproc}", "--standalone", "-m", "vgen", *args]


def pngs(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("[0-9]*.png"))}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The zoo model, one process, batch 4: the reference bytes. The command runs in this process (main(), what
    `python -m vgen` runs) on one thread, as each torchrun process does: a process start less per module."""
    from vgen.cli import main
    d = tmp_path_factory.mktemp("single")
    main(["sample", *ZOO_ARGS, "batch_size=4", "threads=1", f"outdir={d / 'out'}"])
    return d / "out"


def _ppid(stat: Path) -> int:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan nobody has reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.slow
def test_killed_torchrun_job_resumes_to_the_single_process_result(single, tmp_path):
    """Two processes (batch 2 each: other batches than the reference's 4) are killed midway; the same command
    resumes and the folder holds the bytes of one process (every sample, the grid), with each rank's part."""
    out = tmp_path / "out"
    args = ["sample", *ZOO_ARGS, "batch_size=2", f"outdir={out}"]
    p = subprocess.Popen(torchrun_cmd(args), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=ENV, start_new_session=True)
    t0 = time.time()
    try:
        while (len(pngs(out)) if out.exists() else 0) < 3:
            if p.poll() is not None or time.time() - t0 > 300:
                break
            time.sleep(0.05)
    finally:  # torchrun's workers run in sessions of their own: kill them as well, and wait until they are gone
        kids = [int(st.parent.name) for st in Path("/proc").glob("[0-9]*/stat") if _ppid(st) == p.pid]
        os.killpg(p.pid, signal.SIGKILL)
        for k in kids:
            try:
                os.kill(k, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()
        t0 = time.time()
        while any(_running(k) for k in kids) and time.time() - t0 < 60:
            time.sleep(0.05)
    done = len(pngs(out))
    assert 3 <= done < 8, f"the kill should land midway, found {done} images"
    assert not (out / "stats.json").exists()
    r = subprocess.run(torchrun_cmd(args), cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already on disk" in r.stdout and "on 2 processes" in r.stdout
    ref = pngs(single)
    assert len(ref) == 8 and pngs(out) == ref  # every sample, byte for byte
    assert (out / "grid.png").read_bytes() == (single / "grid.png").read_bytes()
    assert not list(out.glob(".*.tmp")) and not list(out.rglob(".*.tmp"))
    st = json.loads((out / "stats.json").read_text())
    assert st["skipped"] >= done and st["num_samples"] == 8 and st["processes"] == 2
    parts = sorted(p.name for p in (out / ".parts").glob("*.json"))
    assert any(p.endswith("-r0.json") for p in parts) and any(p.endswith("-r1.json") for p in parts)


@pytest.mark.slow
def test_resume_skips_finished_indices_and_refuses_another_run(tiny_pipeline, tmp_path, capsys):
    """In process (the main() the command runs; the killed torchrun job above is the real-process resume)."""
    from vgen.cli import main
    out = tmp_path / "o"
    base = ["sample", f"model.path={tiny_pipeline}", "seed=2", f"outdir={out}", "progress=false", "batch_size=3"]
    main(base + ["num_samples=4"])
    first = pngs(out)
    (out / "000001.png").unlink()
    (out / ".000009.png.abc.tmp").write_bytes(b"partial")  # what a killed writer leaves behind
    capsys.readouterr()
    main(base + ["num_samples=7"])
    assert "(3 already on disk)" in capsys.readouterr().out
    got = pngs(out)
    assert len(got) == 7 and all(got[k] == v for k, v in first.items())
    assert not (out / ".000009.png.abc.tmp").exists()
    fresh = tmp_path / "fresh"
    main(base[:-3] + [f"outdir={fresh}", "progress=false", "num_samples=7"])
    assert pngs(fresh) == got  # resumed == one clean run
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(base + ["num_samples=7", "sampler.top_k=3"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "another run" in err and "options" in err


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_hydra_multirun_sweeps_samplers(tiny_pipeline, tmp_path):
    out = tmp_path / "sweep"
    r = vgen(["sample", "-m", "sampler=ar,sjd", f"model.path={tiny_pipeline}", "num_samples=2",
              f"outdir={out}", "progress=false"], tmp_path)
    assert r.returncode == 0, r.stderr
    for job, name in ((0, "ar"), (1, "sjd")):
        st = json.loads((out / str(job) / "stats.json").read_text())
        assert st["sampler"] == name and st["num_samples"] == 2


@pytest.mark.slow
def test_submitit_local_launcher(tiny_pipeline, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    out = tmp_path / "sweep"
    r = vgen(["sample", "-m", "hydra/launcher=submitit_local", "sampler=ar,sjd", f"model.path={tiny_pipeline}",
              "num_samples=2", f"outdir={out}", "progress=false", "hydra.launcher.timeout_min=10"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    for job, name in ((0, "ar"), (1, "sjd")):
        st = json.loads((out / str(job) / "stats.json").read_text())
        assert st["sampler"] == name


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose, initialize_config_module

    from vgen.configs import register
    register()
    with initialize_config_module("vgen.configs", version_base="1.3"):
        cfg = compose("sample", overrides=["hydra/launcher=vgen_slurm"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert "SlurmLauncher" in launcher._target_ and launcher.gpus_per_node >= 1


@pytest.mark.slow
def test_torchrun_prompt_file_job_writes_the_bytes_of_one_process(tiny_t2i_pipeline, tmp_path):
    """A text model's prompt-file job sharded over two processes: the bytes and the recorded prompts of one (that
    one run in this process, on one thread as each torchrun process)."""
    from vgen.cli import main
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"caption": c}) + "\n" for c in ["a photo of the moon", "cat", "a dark cat"]))
    args = ["sample", f"model.path={tiny_t2i_pipeline}", f"prompt_file={f}", "num_samples=5", "progress=false"]
    main([*args, "batch_size=3", "threads=1", f"outdir={tmp_path / 'one'}"])
    r2 = subprocess.run(torchrun_cmd([*args, "batch_size=1", f"outdir={tmp_path / 'two'}"]), cwd=tmp_path,
                        capture_output=True, text=True, env=ENV, timeout=600)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert pngs(tmp_path / "two") == pngs(tmp_path / "one") and len(pngs(tmp_path / "one")) == 5
    st = json.loads((tmp_path / "two" / "stats.json").read_text())
    assert st["processes"] == 2 and st["prompts"] == ["a photo of the moon", "cat", "a dark cat", "a photo of the moon",
                                                     "cat"]
