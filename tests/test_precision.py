"""Half precision and CPU threads (issue 47): a bfloat16 target keeps the exact samplers exact given its logits,
the KV cache follows the model's dtype, `dtype=` / `threads=` reach every command and are checked first."""
import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from exact import chi2_p, counts_of, exact_joint, toward
from guards import cli_refusal

from vgen.samplers import sample

OPTS = dict(cfg_scale=2.0, top_k=3, temperature=0.9)
N = 10_000  # enough to reject a law a tenth of the way to the unguided one (exact.toward)


@pytest.fixture(scope="module")
def micro_bf16(micro_gpt):
    """The micro GPT in bfloat16 and the joint its own (bfloat16) logits define, enumerated."""
    m = copy.deepcopy(micro_gpt).to(torch.bfloat16)
    _, joint = exact_joint(m, 1, 2.0, top_k=3, temperature=0.9)
    _, unguided = exact_joint(m, 1, 1.0, top_k=3, temperature=0.9)
    return m, joint.double().numpy(), unguided.double().numpy()


def test_bfloat16_logits_reach_the_sampler_as_float32(micro_bf16):
    m, joint, _ = micro_bf16
    out = m(torch.zeros(2, 4, dtype=torch.long), torch.tensor([0, 1]))
    assert out.dtype == torch.float32  # every probability and acceptance is computed from float32 logits
    assert abs(joint.sum() - 1) < 1e-5


@pytest.mark.parametrize("name,extra", [  # long statistical tests: the full suite runs them (float32 ar: test_sampling)
    pytest.param("ar", {}, marks=pytest.mark.slow), pytest.param("sjd", dict(window=3, init="vertical"), marks=pytest.mark.slow),
    pytest.param("scd", dict(window=3), marks=pytest.mark.slow)])
def test_exact_samplers_stay_exact_with_a_bfloat16_target(micro_bf16, name, extra):
    """10k samples of a bfloat16 model follow the joint its bfloat16 logits define (chi-square), the same counts
    reject the unguided joint and one a tenth of the way to it (power), and no image of probability zero appears."""
    m, joint, unguided = micro_bf16
    tokens, st = sample(m, [1] * N, name, seed=0, **extra, **OPTS)
    counts = counts_of(tokens, 4)
    assert counts[joint == 0].sum() == 0
    assert chi2_p(counts, unguided) < 1e-6 and chi2_p(counts, toward(joint, unguided)) < 1e-6
    assert chi2_p(counts, joint) > 1e-3
    if name != "ar":
        assert st["accepted_per_step"] > 1.0


@pytest.mark.parametrize("name", ["ar", "sjd"])
def test_kv_cache_follows_the_model_dtype(tiny_gpt, name):
    """bfloat16 weights: the KV cache is bfloat16 too (half the bytes), and the bfloat16 model scores float32's
    samples within 2% of the float32 model's NLL (teacher forced, the same tokens)."""
    import torch.nn.functional as F
    extra = dict(window=4) if name == "sjd" else {}
    m16 = copy.deepcopy(tiny_gpt).to(torch.bfloat16)
    tokens, st32 = sample(tiny_gpt, [0, 1, 2, 3], name, seed=0, cfg_scale=2.0, **extra)
    _, st16 = sample(m16, [0, 1, 2, 3], name, seed=0, cfg_scale=2.0, **extra)
    assert st16["kv_cache_bytes"] * 2 == st32["kv_cache_bytes"]
    labels = torch.tensor([0, 1, 2, 3])
    with torch.no_grad():
        nll32, nll16 = (F.cross_entropy(m(tokens, labels).flatten(0, 1), tokens.flatten()).item()
                        for m in (tiny_gpt, m16))
    assert abs(nll16 - nll32) < 0.02 * nll32


def test_pipeline_dtype_by_name(tiny_pipeline):
    import vgen
    pipe = vgen.load_pipeline(str(tiny_pipeline), dtype="bf16")
    assert next(pipe.model.parameters()).dtype == torch.bfloat16
    g = pipe.generate([0, 1], seed=0, sampler="sjd", window=4)
    assert g.images.dtype == torch.uint8 and g.stats["kv_cache_bytes"] > 0


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_sample_dtype_is_recorded_and_defines_the_samples(tiny_pipeline, tmp_path):
    """`vgen sample dtype=bfloat16` records the dtype in run.json (other samples than float32's), and a rerun in
    another dtype into the same folder is refused, not mixed."""
    out = tmp_path / "bf"
    cmd = [sys.executable, "-m", "vgen", "sample", f"model.path={tiny_pipeline}", "num_samples=2", f"outdir={out}",
           "progress=false", "threads=1"]
    r = subprocess.run(cmd + ["dtype=bfloat16"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "run.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((out / "stats.json").read_text())["threads"] == 1
    r = subprocess.run(cmd + ["dtype=float16"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("args,match", [
    (["sample", "dtype=int8"], "dtype must be one of"),
    (["sample", "threads=0"], "threads must be a whole number >= 1"),
    (["bench", "dtype=double8"], "dtype must be one of"),
    (["bench", "threads=-2"], "threads must be a whole number >= 1"),
    (["eval", "fid", "samples=x", "threads=0"], "threads must be a whole number >= 1"),
])
def test_bad_dtype_or_threads_is_one_line_before_anything_is_written(args, match, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = cli_refusal(args + [f"outdir={tmp_path / 'o'}"] if args[0] != "eval" else args, capsys)
    assert code == 2 and match in err
    assert not (tmp_path / "o").exists()


def test_default_threads_are_this_process_share_of_the_cores(monkeypatch):
    from vgen import threads
    cores = threads.usable_cores()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert threads.default_threads() == max(1, cores // 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert threads.default_threads() == cores
    before = torch.get_num_threads()
    try:
        assert threads.set_threads(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow  # quick loop: kept under 3 minutes (22 s in CI: real processes)
def test_each_test_worker_runs_on_its_own_share_of_the_cores():
    """Under pytest-xdist each worker is pinned to its share of the cores (tests/conftest.py), so an in-process vgen
    command sizes its threads to that share and never waits on a core the other worker holds."""
    from vgen import threads
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    machine = os.cpu_count() or 1
    if count < 2 or machine < count or not hasattr(os, "sched_getaffinity"):
        pytest.skip("runs under pytest-xdist with at least as many cores as workers")
    share = len(os.sched_getaffinity(0))
    assert share <= -(-machine // count) and threads.default_threads() == share


SPIN_CHILD = """
import json, os, sys
at_torch = []
sys.addaudithook(lambda event, args: event == "import" and args[0] == "torch" and not at_torch
                 and at_torch.append(os.environ.get("GOMP_SPINCOUNT")))
got = {}
import vgen
got["import"] = [os.environ.get("GOMP_SPINCOUNT"), "torch" in sys.modules, "vgen.hf_pipeline" in sys.modules]
from vgen import cli
for case, chosen in (("policy", {"OMP_WAIT_POLICY": "ACTIVE"}), ("count", {"GOMP_SPINCOUNT": "300000"})):
    os.environ.update(chosen)
    cli._starting()
    got[case] = os.environ.get("GOMP_SPINCOUNT")
    for k in chosen:
        os.environ.pop(k)
cli.main(["--help"])  # the command: the spin bound is set before its usage line loads torch
got["at_torch"] = at_torch
got["heavy"] = [m for m in ("torch._dynamo", "timm", "torchvision") if m in sys.modules]  # 4.9 s of 7.0 s
os.environ.pop("GOMP_SPINCOUNT")
cli.main(["--help"])
got["in_process"] = os.environ.get("GOMP_SPINCOUNT")  # torch already loaded: main changes nothing
got["version"] = vgen.__version__ == vgen.version.__version__
got["names"] = all(getattr(vgen, n) is not None for n in vgen.__all__) and len(vgen.__all__) == 12
from vgen.pipeline import load_card
got["emu3"] = [load_card("photos-emu3").model_kind, "vgen.hf_pipeline" in sys.modules]
print(json.dumps(got))
"""


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_importing_vgen_changes_nothing_and_the_command_bounds_openmp_spinning():
    """`import vgen` loads neither torch nor the transformers loader and sets no variable; the `vgen` command
    (vgen.cli.main, what the script and `python -m vgen` run, as torchrun starts it) bounds how long idle OpenMP
    threads spin before they sleep, set before torch starts (the value the environment holds when torch is first
    imported), unless the user chose a wait policy or a spin count; main run in a process that already holds torch
    (a test, a notebook) leaves the environment alone. The transformers loader is found through its entry point
    (`vgen.loaders`) on the first card read. The command's start (every sampler and model kind registered) loads
    neither dynamo nor timm nor torchvision: they wait for a compile, a MAR model or an eval. One fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    r = subprocess.run([sys.executable, "-c", SPIN_CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"import": [None, False, False], "policy": None, "count": "300000", "at_torch": ["1000"],
                   "in_process": None, "version": True, "names": True, "emu3": ["transformers", True], "heavy": []}, got


@pytest.mark.slow
def test_gpu_experiment_runs_small_on_a_cpu(tmp_path, monkeypatch):
    """`vgen bench +experiment=gpu` on a CPU: the small shapes in float32 and bfloat16, a pass-cost table per shape
    and dtype (1 token = 1.0) and AR against the official loop, in bench.json and bench.md. In process, on a 4 x 4
    grid (shapes.TOKENS = 16, as the t2i shapes test below): the cells' bookkeeping is checked, not how long 256
    tokens take (`vgen bench` in a real process: test_cli's bench test)."""
    from vgen.cli import main
    from vgen.eval import shapes as shape_bench
    monkeypatch.setattr(shape_bench, "TOKENS", 16)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "gpu"
    main(["bench", "+experiment=gpu", "cpu_shapes=[cpu-S]", "batch_sizes=[1]", "shape_batches=[1]", "repeats=1",
          "warmup=false", "compile=false", "samplers=[ar]", "num_samples=1", "pass_widths=[1,2,8]", "threads=1",
          f"outdir={out}"])
    rep = json.loads((out / "bench.json").read_text())
    assert rep["shapes"]["tokens"] == 16
    shapes = rep["shapes"]["shapes"]
    assert set(shapes) == {"cpu-S"} and set(shapes["cpu-S"]) == {"float32", "bfloat16"}
    for entry in shapes["cpu-S"].values():
        assert entry["pass_cost"]["1"] == 1.0 and set(entry["pass_cost"]) == {"1", "2", "8"}
        assert all(v > 0 for v in entry["pass_seconds"].values())
        ar = entry["ar"]["1"]
        assert ar["vgen"]["ms_per_token"] > 0 and ar["official"]["ms_per_token"] > 0
    assert "Released GPT shapes" in (out / "bench.md").read_text()
    assert rep["rows"] and rep["rows"][0]["sampler"] == "ar"  # the zoo's samplers in the same run


def test_the_shapes_bench_hands_over_each_cell_as_it_ends(monkeypatch):
    """A shapes run reports its result after the pass costs and after each batch size's AR cell (vgen bench writes
    bench.json then), so a run stopped at its time limit keeps what it measured: the first report holds the pass
    costs alone, the second batch 1."""
    from omegaconf import OmegaConf

    from vgen.eval import shapes
    monkeypatch.setattr(shapes, "ar_speed", lambda model, batch, compile, repeats, official=True: {"batch": batch})
    cfg = OmegaConf.create(dict(device="cpu", shapes=[], cpu_shapes=["cpu-S"], shape_dtypes=["float32"],
                                pass_widths=[1, 2], repeats=1, shape_batches=[1, 4], batch_sizes=[1],
                                compile=False))
    seen = []
    result = shapes.run(cfg, done=lambda so_far: seen.append(json.loads(json.dumps(so_far))))
    ar = [r["shapes"]["cpu-S"]["float32"]["ar"] for r in seen]
    assert ar == [{}, {"1": {"batch": 1}}, {"1": {"batch": 1}, "4": {"batch": 4}}]
    assert seen[-1] == json.loads(json.dumps(result)) and seen[0]["shapes"]["cpu-S"]["float32"]["pass_cost"]["1"] == 1


def test_the_shapes_bench_times_each_shape_again_with_quantized_weights(monkeypatch):
    """shape_quantize=[int8, int4]: each shape's float cell, then the same weights in int8 and int4 (fewer weight
    bytes, the same pass-cost widths), their AR cells without the official loop (it runs float weights)."""
    from omegaconf import OmegaConf

    from vgen.eval import shapes
    calls = []
    monkeypatch.setattr(shapes, "ar_speed", lambda model, batch, compile, repeats, official=True:
                        calls.append(official) or {"vgen": {"ms_per_token": 1.0}})
    cfg = OmegaConf.create(dict(device="cpu", shapes=[], cpu_shapes=["cpu-S"], shape_dtypes=["float32"],
                                shape_quantize=["int8", "int4"], pass_widths=[1, 2], repeats=1, shape_batches=[1],
                                batch_sizes=[1], compile=False))
    entries = shapes.run(cfg)["shapes"]["cpu-S"]
    assert list(entries) == ["float32", "float32@int8", "float32@int4"] and calls == [True, False, False]
    mb = {k: e["weight_mb"] for k, e in entries.items()}
    assert mb["float32"] > 1.5 * mb["float32@int8"] > 1.5 * mb["float32@int4"]  # the float embedding table stays
    assert all(e["pass_cost"]["1"] == 1.0 and e["pass_cost"]["2"] > 0 for e in entries.values())
    assert "/ -" in shapes.markdown({"shapes": {"cpu-S": entries}})  # the quantized rows: no official loop


def test_the_shapes_bench_refuses_an_unknown_weight_format():
    from omegaconf import OmegaConf

    from vgen.errors import VGenError
    from vgen.eval import shapes
    cfg = OmegaConf.create(dict(device="cpu", shapes=[], cpu_shapes=["cpu-S"], shape_dtypes=["float32"],
                                shape_quantize=["int3"], pass_widths=[1, 2]))
    with pytest.raises(VGenError, match="int3"):
        shapes.check(cfg)


def test_gpu_experiment_refuses_unknown_shapes(capsys, tmp_path):
    code, err = cli_refusal(["bench", "+experiment=gpu", "cpu_shapes=[huge]", f"outdir={tmp_path / 'o'}"], capsys)
    assert code == 2 and "unknown shapes" in err and not (tmp_path / "o").exists()


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_an_in_process_command_keeps_the_callers_threads(tiny_pipeline, tmp_path):
    """vgen.cli.main run in process (tests, notebooks) sets its threads for the command only."""
    from vgen.cli import main
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        main(["sample", f"model.path={tiny_pipeline}", "num_samples=1", f"outdir={tmp_path / 'o'}", "progress=false",
              "threads=2"])
        assert json.loads((tmp_path / "o" / "stats.json").read_text())["threads"] == 2
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_command_sets_tf32_for_its_own_length(tiny_pipeline, tmp_path):
    """vgen's commands multiply CUDA float32 matmuls in TF32 as LlamaGen's sampling scripts do (tf32=false: full
    float32), recorded in stats.json; run in process, the caller's setting comes back after the command."""
    from vgen.cli import main
    from vgen.kernels.precision import cuda_tf32
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        for caller, flag in ((False, None), (True, "tf32=false")):
            torch.backends.cuda.matmul.allow_tf32 = caller
            out = tmp_path / f"o{int(caller)}"
            main(["sample", f"model.path={tiny_pipeline}", "num_samples=1", f"outdir={out}", "progress=false",
                  *([flag] if flag else [])])
            assert json.loads((out / "stats.json").read_text())["tf32"] is (flag is None)
            assert torch.backends.cuda.matmul.allow_tf32 is caller
        with cuda_tf32(None):  # None leaves the setting alone
            assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_a_bfloat16_pipeline_drives_eagle_with_its_draft_head(tiny_pipeline, tiny_gpt):
    """The draft head a pipeline loads follows the target's dtype (its products read the target's bfloat16
    embeddings and output weight): eagle runs on a bfloat16 pipeline (it failed with a dtype mismatch before)."""
    from test_eagle import make_drafter

    import vgen
    from vgen.models.drafter import save_drafter
    path = str(tiny_pipeline / "drafter.safetensors")
    save_drafter(make_drafter(tiny_gpt, seed=1), path)
    for dtype in (torch.bfloat16, torch.float32):
        pipe = vgen.load_pipeline(str(tiny_pipeline), dtype=dtype)
        g = pipe.generate([0, 1, 2], seed=0, sampler="eagle", window=4, drafter=path)
        assert g.tokens.shape == (3, tiny_gpt.seq_len) and g.stats["accepted_per_step"] >= 1.0
        from vgen.samplers import get_sampler
        head = pipe.draft_for(get_sampler("eagle", model=pipe.model, drafter=path))
        assert next(head.parameters()).dtype == dtype


def test_the_shapes_bench_times_the_text_to_image_gpt_on_left_padded_captions(monkeypatch):
    """``XL-t2i`` / ``cpu-S-t2i``: LlamaGen-T2I's GPT (120 caption positions of 2048 features) timed on a random
    caption whose padding rows are zero, so the caption mask hides them as in the official loop; both loops run
    (on a 4 x 4 grid here, to keep the quick loop quick)."""
    from omegaconf import OmegaConf

    from vgen.eval import shapes
    monkeypatch.setattr(shapes, "TOKENS", 16)
    model = shapes.build_shape("cpu-S-t2i", torch.float32, torch.device("cpu"))
    assert model.conditioning == "text" and model.cond_len == shapes.CAPTION_LEN
    cond = shapes.conditions(model, 2)
    assert cond.shape == (2, shapes.CAPTION_LEN, shapes.CAPTION_DIM)
    assert model.cond_mask(cond).sum(1).tolist() == [shapes.CAPTION_TOKENS] * 2
    cfg = OmegaConf.create(dict(device="cpu", shapes=[], cpu_shapes=["cpu-S-t2i"], shape_dtypes=["float32"],
                                pass_widths=[1, 4], repeats=1, shape_batches=[1], batch_sizes=[1], compile=False))
    entry = shapes.run(cfg)["shapes"]["cpu-S-t2i"]["float32"]
    assert entry["pass_cost"]["1"] == 1.0 and entry["pass_seconds"]["4"] > 0
    assert entry["ar"]["1"]["vgen"]["ms_per_token"] > 0 and entry["ar"]["1"]["official"]["ms_per_token"] > 0
