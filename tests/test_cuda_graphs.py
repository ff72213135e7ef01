"""The decode path on CUDA (issue 47): compiled steps run as CUDA graphs (``mode="reduce-overhead"``, fullgraph)
over a KV cache of static addresses, outside any CPU tuning. The ``cuda`` tests need a GPU (they skip elsewhere);
the others check on the CPU that a CUDA step is compiled that way and that the CPU's own path is unchanged."""
import pytest
import torch
from guards import needs_zoo

import vgen
import vgen.kernels.decode as decode
from vgen.kernels.kv_cache import KVCache
from vgen.kernels.linear import linear
from vgen.samplers import sample


def test_the_cpu_wrapper_is_chosen_by_the_environment(monkeypatch):
    """`$VGEN_CPP_WRAPPER=0` compiles a CPU step with inductor's Python wrapper (a many-layer model's C++ wrapper takes
    g++ tens of minutes); unset or 1, the C++ one; any other value is a one-line error before anything compiles."""
    from vgen.errors import VGenError
    asked = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: asked.append(kw) or fn)
    monkeypatch.setattr(decode, "use_cache_dir", lambda: None)
    for value, cpp in ((None, True), ("1", True), ("0", False)):
        if value is None:
            monkeypatch.delenv("VGEN_CPP_WRAPPER", raising=False)
        else:
            monkeypatch.setenv("VGEN_CPP_WRAPPER", value)
        decode.compiled.cache_clear()
        decode.compiled(lambda x: x + 1)
        assert asked[-1]["options"]["cpp_wrapper"] is cpp
    monkeypatch.setenv("VGEN_CPP_WRAPPER", "yes")
    decode.compiled.cache_clear()
    with pytest.raises(VGenError, match="VGEN_CPP_WRAPPER must be 1 .* or 0 .*, got 'yes'"):
        decode.compiled(lambda x: x + 1)
    decode.compiled.cache_clear()
    assert len(asked) == 3


def test_a_cuda_step_is_compiled_reduce_overhead_fullgraph(monkeypatch):
    """`compiled(fn, device="cuda")` asks torch.compile for CUDA graphs over one graph; the CPU keeps inductor's
    default mode with the C++ wrapper. The CUDA step's outputs are the caller's own tensors (copies), and a new
    CUDA-graph step is marked at every call."""
    asked, marks = [], []

    def fake_compile(fn, **kw):
        asked.append(kw)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    monkeypatch.setattr(decode, "use_cache_dir", lambda: None)
    held = torch.arange(4)

    def step(x):
        return held, (x + 1, 7)

    decode.compiled.cache_clear()
    try:
        cpu = decode.compiled(step)
        cuda = decode.compiled(step, device="cuda")
    finally:
        decode.compiled.cache_clear()
    assert asked[0] == {"dynamic": False, "options": decode.COMPILE_OPTIONS}
    assert asked[1] == {"dynamic": False, "mode": "reduce-overhead", "fullgraph": True}
    assert cpu(torch.zeros(2))[0] is held
    out, (y, k) = cuda(torch.zeros(2))
    assert out is not held and torch.equal(out, held) and torch.equal(y, torch.ones(2)) and k == 7
    assert marks == [1]


def test_a_step_the_back_end_cannot_build_falls_back_once(monkeypatch):
    """Where inductor or Triton fails to build a CUDA step, the step runs through the fallback (dynamo's cudagraphs
    back end) from then on, with one warning; an error of the step itself is raised as it is."""
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: None)
    triton_error = type("CompilationError", (Exception,), {"__module__": "triton.compiler.errors"})
    calls = []

    def broken(x):
        calls.append("inductor")
        raise triton_error("Scalar 2654435761 is out of range for type int32")

    def fallback_step(x):
        calls.append("fallback")
        return x + 1

    step = decode.graphed(broken, lambda: fallback_step, "ar_decode_step")
    with pytest.warns(UserWarning, match="ar_decode_step: inductor could not build.*out of range"):
        assert torch.equal(step(torch.zeros(1)), torch.ones(1))
    assert torch.equal(step(torch.ones(1)), 2 * torch.ones(1))
    assert calls == ["inductor", "fallback", "fallback"]

    def wrong(x):
        raise ValueError("a bug in the step")

    with pytest.raises(ValueError, match="a bug"):
        decode.graphed(wrong, lambda: fallback_step)(torch.zeros(1))


def test_the_cpu_linear_trick_stays_on_the_cpu():
    """`W @ x^T` on the CPU (its measured win there); any other device gets F.linear (checked on the meta device,
    which every machine has)."""
    w, x = torch.randn(6, 5), torch.randn(3, 5)
    assert torch.allclose(linear(x, w), x @ w.t(), atol=1e-6)
    seen = []
    orig = torch.nn.functional.linear
    try:
        torch.nn.functional.linear = lambda *a: seen.append(a[0].device.type) or orig(*a)
        linear(x, w)
        assert seen == []  # small rows on the CPU: the transposed product
        linear(x.to("meta"), w.to("meta"))
        assert seen == ["meta"]
    finally:
        torch.nn.functional.linear = orig


def test_a_cpu_cache_is_not_static_and_buckets():
    c = KVCache(2, 1, 2, 300, 4)
    assert not c.static and c.bucket(10) < 300


def test_static_caches_reuse_their_addresses_one_holder_at_a_time(monkeypatch):
    """The pool behind CUDA caches (run here on the CPU, its device made 'static'): a cache of a shape seen before
    gets the finished cache's tensors (the addresses its CUDA graphs were recorded with), slots reset; a second live
    cache of that shape gets its own; at most POOL_SHAPES shapes are kept."""
    import gc

    from vgen.kernels import kv_cache
    monkeypatch.setattr(kv_cache, "STATIC_DEVICES", ("cpu",))
    monkeypatch.setattr(kv_cache, "static", lambda t: t)
    monkeypatch.setattr(kv_cache, "_POOL", {})
    a = KVCache(2, 1, 2, 30, 4)
    ptrs = [t.data_ptr() for t in a.k + a.v]
    a.hide(3)
    a.mask_keys(torch.tensor([[False, True]]))
    live = KVCache(2, 1, 2, 30, 4)  # a is alive: not shared
    assert live.k[0].data_ptr() not in ptrs
    del a
    gc.collect()
    b = KVCache(2, 1, 2, 30, 4)
    assert [t.data_ptr() for t in b.k + b.v] == ptrs
    assert torch.equal(b.slots, torch.arange(30)) and b.key_mask is None
    for n in range(kv_cache.POOL_SHAPES + 2):
        KVCache(1, 1, 1, 10 + n, 2)
    assert len(kv_cache._POOL) == kv_cache.POOL_SHAPES


@pytest.mark.cuda
def test_a_cuda_cache_has_static_addresses_and_one_length():
    c = KVCache(2, 1, 2, 300, 4, device="cuda")
    assert c.static and c.bucket(10) == 300
    for t in (*c.k, *c.v, c.slots, c.rows):
        assert getattr(t, "_dynamo_static_input_type", None) is not None


def _graphs():
    """CUDA graphs recorded so far by this process's cudagraph trees on device 0."""
    from torch._inductor.cudagraph_trees import get_manager
    mgr = get_manager(0, False)
    return 0 if mgr is None else int(repr(mgr.graph_counter).strip("count()"))


def _skips():
    from torch._dynamo.utils import counters
    return counters["inductor"]["cudagraph_skips"]


@pytest.mark.cuda
@pytest.mark.parametrize("name,opts", [("ar", {}), ("ar", dict(draw="gumbel")), ("zipar", dict(window=2)),
                                       ("sjd", dict(window=4, init="vertical")), ("scd", dict(window=4))])
def test_compiled_samplers_run_as_cuda_graphs(tiny_gpt, name, opts):
    """Compiled on CUDA, every step runs as a CUDA graph (no skip: no mutated non-static input, no CPU tensor), the
    tokens equal the eager run's with greedy draws (top_k=1: no rounding can flip a draw between ties), twice in a
    row (a new cache: its graph re-recorded, not recompiled) and in another batch size."""
    m = tiny_gpt.cuda()
    kw = dict(seed=3, cfg_scale=2.0, top_k=1, **opts)
    eager, _ = sample(m, [0, 1, 2], name, compile=False, **kw)
    before = _skips()
    a, _ = sample(m, [0, 1, 2], name, compile=True, **kw)
    recorded = _graphs()
    b, _ = sample(m, [0, 1, 2], name, compile=True, **kw)
    assert _graphs() == recorded  # the second run's cache reused the first's addresses: its graphs replayed
    c, _ = sample(m, [0, 1, 2], name, compile=True, batch_size=2, **kw)
    assert _skips() == before
    assert torch.equal(a, eager) and torch.equal(b, eager) and torch.equal(c, eager)


@pytest.mark.cuda
@pytest.mark.parametrize("name,opts", [("ar", {}), ("sjd", dict(window=4))])
def test_compiled_cuda_samples_follow_the_same_law(tiny_gpt, name, opts):
    """Full sampling (top-k 8) through CUDA graphs: the tokens agree with eager's almost everywhere (compiled kernels
    may round a few draws differently) and are valid tokens."""
    m = tiny_gpt.cuda()
    kw = dict(seed=0, cfg_scale=2.0, top_k=8, **opts)
    eager, _ = sample(m, list(range(4)) * 4, name, compile=False, **kw)
    graphed, st = sample(m, list(range(4)) * 4, name, compile=True, **kw)
    assert graphed.device.type == "cuda" and int(graphed.max()) < m.vocab_size
    assert (graphed == eager).float().mean() > 0.9


@pytest.mark.cuda
@needs_zoo("photos-gpt")
def test_eagle_and_bfloat16_on_cuda():
    """The shipped draft head compiled as CUDA graphs, and a bfloat16 pipeline on CUDA (KV bytes halved)."""
    pipe = vgen.load_pipeline("photos-gpt", device="cuda")
    before = _skips()
    e = pipe.generate([0, 3], sampler="eagle", seed=1, window=8, compile=True)
    assert _skips() == before and e.stats["accepted_per_step"] > 1.5
    half = vgen.load_pipeline("photos-gpt", device="cuda", dtype=torch.bfloat16)
    a = pipe.generate([0, 3], sampler="ar", seed=1, compile=False)
    h = half.generate([0, 3], sampler="ar", seed=1, compile=False)
    assert h.stats["kv_cache_bytes"] * 2 == a.stats["kv_cache_bytes"]
    assert abs(h.stats["nll"] - a.stats["nll"]) < 0.3


@pytest.mark.parametrize("name,opts", [("sjd", dict(window=4)), ("scd", dict(window=4)),
                                       ("sjd", dict(window=4, init="vertical", coupling="maximal")),
                                       ("lantern", dict(window=4, delta=0.2)), ("eagle", dict(window=4)),
                                       ("eagle", dict(window=6, tree="2,2,1"))])
def test_reading_the_counts_one_pass_late_gives_the_same_bytes(tiny_gpt, monkeypatch, name, opts):
    """The GPU's lagged read (the host waits for pass k's counts only once pass k + 1 is queued), run here on the
    CPU: the same tokens, log-probabilities (NLL) and step maps as the synchronous loop, with refills (7 samples in
    slots of 3) and a given prefix; a run ends one pass later."""
    import torch.nn.functional as F

    from vgen.models.drafter import Drafter
    from vgen.samplers.speculative import scheduler
    if name == "lantern":
        opts = dict(opts, codebook=F.normalize(torch.randn(tiny_gpt.vocab_size, 8,
                                                           generator=torch.Generator().manual_seed(0)), dim=-1))
    if name == "eagle":
        torch.manual_seed(0)
        opts = dict(opts, draft=Drafter(tiny_gpt.config, "block").eval())
    kw = dict(seed=2, cfg_scale=2.0, top_k=8, batch_size=3, prefix_attention=False, **opts)
    labels = [0, 1, 2, 3, 0, 1, 2]
    prefix = torch.randint(0, tiny_gpt.vocab_size, (7, 3), generator=torch.Generator().manual_seed(1))
    for given in (None, prefix):
        sync, st_s = sample(tiny_gpt, labels, name, prefix=given, **kw)
        monkeypatch.setattr(scheduler, "LAG_DEVICES", ("cpu",))
        lagged, st_l = sample(tiny_gpt, labels, name, prefix=given, **kw)
        monkeypatch.setattr(scheduler, "LAG_DEVICES", ())
        assert torch.equal(sync, lagged)
        assert st_s["nll"] == st_l["nll"] and torch.equal(st_s["step_map"], st_l["step_map"])
        assert st_s["accepted_per_step"] == st_l["accepted_per_step"]
        assert st_s["forward_passes"] < st_l["forward_passes"] <= st_s["forward_passes"] + 7


def test_the_cuda_cumsum_is_atens_and_compiles_in_one_graph():
    """The draws' cumulative sums in a step compiled for CUDA go through one opaque op (`vgen::cumsum_last`) that
    calls ATen's scan, so inductor never generates its own split scan over the vocabulary (it failed to build at
    LlamaGen's 16384 tokens and batch 8 on an H200). Here on the CPU: the op gives ATen's bytes, eager and compiled
    with fullgraph=True, for contiguous and strided inputs; the CPU's draws keep the plain op."""
    from vgen.kernels.sampling import cumsum
    x = torch.rand(8, 16384, generator=torch.Generator().manual_seed(0))
    for t in (x, x[:, ::2], x.T.contiguous().T):
        assert torch.equal(torch.ops.vgen.cumsum_last(t), t.cumsum(-1))
        f = torch.compile(lambda v: torch.ops.vgen.cumsum_last(v * 2) + 1, fullgraph=True, backend="aot_eager")
        assert torch.equal(f(t), (t * 2).cumsum(-1) + 1)
    assert torch.equal(cumsum(x), x.cumsum(-1))


@pytest.mark.cuda
def test_a_compiled_step_builds_at_llamagens_vocabulary_and_batch_8():
    """A GPT with LlamaGen's 16384-token vocabulary, compiled as CUDA graphs at batch 8 with CFG and full sampling
    (top-k 0): the step builds (inductor's split scan over the vocabulary did not), runs with no skipped graph, and
    its first draws equal eager's (later ones may follow a draw that rounding flipped)."""
    from vgen.models import build
    torch.manual_seed(0)
    m = build("gpt", dim=64, n_layer=2, n_head=4, vocab_size=16384, num_classes=10, block_size=64).cuda().eval()
    torch.nn.init.normal_(m.output.weight, std=0.5)
    labels = list(range(8))
    eager, _ = sample(m, labels, "ar", seed=0, cfg_scale=4.0, compile=False)
    before = _skips()
    graphed, _ = sample(m, labels, "ar", seed=0, cfg_scale=4.0, compile=True)
    assert _skips() == before and int(graphed.max()) < 16384
    assert torch.equal(graphed[:, 0], eager[:, 0])


def test_static_buffers_go_to_the_next_run_refilled(monkeypatch):
    """A decode loop's state on a static device (run here on the CPU, made static): a finished owner's buffer goes
    to the next owner of the same name, shape and dtype (its address: recorded graphs replay), refilled; a live
    owner's is never shared; elsewhere every call makes a new tensor."""
    import gc

    from vgen.kernels import kv_cache

    class Run:
        pass

    a = Run()
    plain = kv_cache.static_buffer(a, "x", (3,), torch.long, "cpu", fill=2)
    assert torch.equal(plain, torch.full((3,), 2)) and not hasattr(plain, "_dynamo_static_input_type")
    monkeypatch.setattr(kv_cache, "STATIC_DEVICES", ("cpu",))
    monkeypatch.setattr(kv_cache, "_BUFFERS", {})
    t = kv_cache.static_buffer(a, "x", (3,), torch.long, "cpu", fill=2)
    assert t._dynamo_static_input_type == "unguarded"
    t.fill_(9)
    b = Run()
    live = kv_cache.static_buffer(b, "x", (3,), torch.long, "cpu")
    assert live.data_ptr() != t.data_ptr()
    ptr = t.data_ptr()
    del a, t
    gc.collect()
    again = kv_cache.static_buffer(Run(), "x", (3,), torch.long, "cpu", fill=1)
    assert again.data_ptr() == ptr and torch.equal(again, torch.ones(3, dtype=torch.long))
    other = kv_cache.static_buffer(Run(), "x", (4,), torch.long, "cpu")
    assert other.data_ptr() != ptr
