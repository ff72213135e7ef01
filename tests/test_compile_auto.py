"""compile=true|false|auto: parsing, auto's decision, samplers seeing a bool, inductor's cache folder (docs/compile.md).
The quick tests compile nothing; the slow one compiles a tiny step in two processes."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from vgen.errors import VGenError
from vgen.samplers import get_sampler, sample
from vgen.samplers.base import AUTO_SAVED_S_PER_PASS, AUTO_WARMUP_S, SamplingOptions, auto_compile, sampling_job


@pytest.mark.parametrize("given, want", [(True, True), (False, False), ("auto", "auto"), ("AUTO", "auto"),
                                         (" Auto ", "auto"), ("true", True), ("TRUE", True), ("False", False)])
def test_compile_values(given, want):
    o = SamplingOptions(compile=given)
    o.validate()
    assert o.compile is want if isinstance(want, bool) else o.compile == want


def test_compile_defaults_to_auto():
    assert SamplingOptions().compile == "auto" and get_sampler("ar").options.compile == "auto"


@pytest.mark.parametrize("bad", ["maybe", "yes", "", 1, 0, None, 1.0])
def test_bad_compile_value_one_line(bad):
    with pytest.raises(VGenError) as e:
        SamplingOptions(compile=bad).validate()
    msg = str(e.value)
    assert msg.startswith("compile must be true, false or auto") and len(msg.splitlines()) == 1


def test_auto_decision_at_break_even():
    """At batch 1, 256 tokens a sample: eager below the break-even number of samples, compiled from it on."""
    n = math.ceil(AUTO_WARMUP_S / AUTO_SAVED_S_PER_PASS / 256)
    assert not auto_compile(256, 1, 1) and not auto_compile(256, n - 1, 1)
    assert auto_compile(256, n, 1) and auto_compile(256, 100 * n, 1)


def test_auto_decision_on_cuda_uses_the_gpu_costs():
    """On CUDA the break-even comes from the GPU's measured saving and warm-up (a CUDA graph step), not the CPU's."""
    from vgen.samplers.base import CUDA_SAVED_S_PER_PASS, CUDA_WARMUP_S
    n = math.ceil(CUDA_WARMUP_S / CUDA_SAVED_S_PER_PASS / 256)
    assert not auto_compile(256, n - 1, 1, "cuda") and auto_compile(256, n, 1, "cuda")
    assert n != math.ceil(AUTO_WARMUP_S / AUTO_SAVED_S_PER_PASS / 256)  # the devices really differ


def test_auto_counts_passes_and_batch_shapes():
    n = math.ceil(AUTO_WARMUP_S / AUTO_SAVED_S_PER_PASS / 256)
    assert not auto_compile(256, 8 * n - 8, 8)   # the same forward passes as n - 1 samples at batch 1
    assert auto_compile(256, 8 * n, 8)
    assert not auto_compile(256, 8 * n + 1, 8)   # one more pass, but a last batch of 1 is a second graph to compile
    assert auto_compile(256, 16 * n, 8)


@pytest.fixture
def seen(monkeypatch):
    """The option ``compile`` every sampler's ``_run`` gets (no compiling: ``compiled`` is the identity)."""
    import vgen.samplers.ar as ar
    import vgen.samplers.speculative.sampler as spec
    import vgen.samplers.speculative.scheduler as sched
    from vgen.samplers import sampler_class
    got = []
    monkeypatch.setattr(ar, "compiled", lambda fn, dynamic=False, device="cpu": fn)
    monkeypatch.setattr(spec, "compiled", lambda fn, dynamic=False, device="cpu": fn)
    monkeypatch.setattr(sched, "compiled", lambda fn, dynamic=False, device="cpu": fn)
    for name in ("ar", "sjd"):
        cls = sampler_class(name)
        run = cls._run

        def spy(self, *a, _run=run, **k):
            got.append(self.options.compile)
            return _run(self, *a, **k)
        monkeypatch.setattr(cls, "_run", spy)
    return got


@pytest.mark.parametrize("name, kw", [("ar", {}), ("sjd", {"window": 4})])
def test_samplers_get_a_bool(tiny_gpt, seen, name, kw):
    s = get_sampler(name, compile="auto", **kw)
    s(tiny_gpt, torch.tensor([0, 1]), [0, 1])
    with sampling_job(10 ** 7, 1):  # a long job drawn call by call, as `vgen sample` does
        s(tiny_gpt, torch.tensor([0]), [0])
    get_sampler(name, compile="TRUE", **kw)(tiny_gpt, torch.tensor([0]), [0])
    assert seen == [False, True, True] and all(type(c) is bool for c in seen)
    assert s.options.compile == "auto"  # the decision belongs to the run, not to the sampler


def test_compile_false_and_true_unchanged(tiny_gpt, seen):
    """compile=false is eager whatever the job; compile=true compiles even a one-sample job."""
    with sampling_job(10 ** 7, 1):
        sample(tiny_gpt, [0], "ar", compile=False)
    sample(tiny_gpt, [0], "ar", compile=True)
    assert seen == [False, True]


def test_pipeline_stats_record_the_decision(tiny_pipeline, seen):
    from vgen.pipeline import Pipeline
    gen = Pipeline.from_pretrained(str(tiny_pipeline)).generate([0, 1], sampler="ar")
    assert gen.stats["options"]["compile"] is False and seen == [False]


@pytest.mark.parametrize("value, want", [("TRUE", True), ("false", False)])
def test_cli_compile_values(tiny_pipeline, tmp_path, seen, value, want):
    from vgen.cli import main
    main(["sample", f"model.path={tiny_pipeline}", "sampler=ar", f"sampler.compile={value}", "num_samples=3",
          "batch_size=2", f"outdir={tmp_path}", "progress=false"])
    assert seen == [want, want] and json.loads((tmp_path / "run.json").read_text())["options"]["compile"] is want


def test_cli_decides_for_the_whole_job(tiny_pipeline, tmp_path, monkeypatch, seen):
    """`vgen sample` draws batch by batch; auto (the default, kept as "auto" in run.json) decides from the whole
    job (3 samples, 2 per batch) in every call."""
    import vgen.samplers.base as base
    from vgen.cli import main
    calls = []
    monkeypatch.setattr(base, "auto_compile", lambda *a: calls.append(a) or False)
    main(["sample", f"model.path={tiny_pipeline}", "sampler=ar", "num_samples=3", "batch_size=2", f"outdir={tmp_path}",
          "progress=false"])
    assert calls == [(16, 3, 2, "cpu"), (16, 3, 2, "cpu")] and seen == [False, False]
    assert json.loads((tmp_path / "run.json").read_text())["options"]["compile"] == "auto"


def test_cli_bad_compile_value(tiny_pipeline, tmp_path, capsys):
    from vgen.cli import main
    with pytest.raises(SystemExit) as e:
        main(["sample", f"model.path={tiny_pipeline}", "sampler.compile=maybe", f"outdir={tmp_path / 'x'}",
              "progress=false"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "compile must be true, false or auto, got 'maybe'" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "x" / "stats.json").exists()


def test_cache_dir_set_only_by_the_compile_path(tiny_gpt, monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from vgen.kernels.decode import cache_dir, compiled
    monkeypatch.setenv("VGEN_CACHE_DIR", str(tmp_path / "vgen"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what importing torch._dynamo sets
    sample(tiny_gpt, [0], "ar", compile=False)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir()
    assert cache_dir() == tmp_path / "vgen"
    compiled(lambda x: x + 1)  # wraps only: nothing compiles before the first call
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "vgen")


def test_cache_dir_respects_the_users(monkeypatch, tmp_path):
    from vgen.kernels.decode import cache_dir, compiled
    monkeypatch.setenv("VGEN_CACHE_DIR", str(tmp_path / "vgen"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    compiled(lambda x: x + 2)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine") and cache_dir() == tmp_path / "mine"


def test_cache_dir_default(monkeypatch, tmp_path):
    from vgen.kernels.decode import cache_dir
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("VGEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("VGEN_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path / "inductor"
    monkeypatch.delenv("VGEN_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "vgen" / "inductor"


COMPILE_ONCE = """
import json, torch
from torch._dynamo.utils import counters
from vgen.models import build
from vgen.samplers import sample
torch.manual_seed(0)
m = build("gpt", dim=32, n_layer=1, n_head=2, vocab_size=16, num_classes=2, block_size=4).eval()
tokens, _ = sample(m, [0, 1], "ar", seed=0, cfg_scale=2.0, compile=True)
print(json.dumps({"tokens": tokens.tolist(), **{k: dict(v) for k, v in counters.items()}}))
"""


@pytest.mark.slow
def test_second_process_reuses_compiled_step(tmp_path):
    """A second process compiling the same step loads it from the vgen cache folder (FX graph and AOTAutograd
    caches hit) and draws the same tokens."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(VGEN_CACHE_DIR=str(tmp_path / "inductor"), OMP_NUM_THREADS="1")
    runs = [json.loads(subprocess.run([sys.executable, "-c", COMPILE_ONCE], env=env, capture_output=True, text=True,
                                      check=True, timeout=600).stdout.splitlines()[-1]) for _ in range(2)]
    assert runs[0]["inductor"].get("fxgraph_cache_miss", 0) > 0 and (tmp_path / "inductor").is_dir()
    assert runs[1]["inductor"].get("fxgraph_cache_hit", 0) > 0 and "fxgraph_cache_miss" not in runs[1]["inductor"]
    assert runs[1]["aot_autograd"].get("autograd_cache_hit", 0) > 0
    assert runs[0]["tokens"] == runs[1]["tokens"]


@pytest.mark.slow  # 200 compilations (eager backend): 17 s on a 2-core machine
def test_a_step_keeps_compiling_past_two_hundred_shapes():
    """One step function compiled for many shapes in one process (a bench of every speculative sampler: batch sizes x
    widths x KV buckets x settings, about 200 graphs of jacobi_step) keeps getting graphs: past dynamo's limit it would
    silently run eager (what made compiled scd 0.42x compiled ar in one readme run)."""
    import torch
    from torch._dynamo.utils import counters

    from vgen.kernels.decode import raise_recompile_limits

    def step(x, W: int):
        return torch.arange(W) + x[:W]
    f = torch.compile(step, backend="eager", dynamic=False)  # W specialised, as the decode steps' widths are
    raise_recompile_limits()
    x = torch.zeros(256)
    before = counters["stats"]["unique_graphs"]
    for W in range(1, 201):
        f(x, W)
    assert counters["stats"]["unique_graphs"] - before == 200
