"""Weight-only int8 / int4 models (quantize=, vgen.kernels.quant): the layers' arithmetic, exactness of speculative
samplers with respect to the quantized model (enumerated joint, with power), pipelines, stats and refusals."""
import copy
import json

import pytest
import torch
import torch.nn as nn
from exact import chi2_p, counts_of, exact_joint, toward

from vgen.errors import VGenError
from vgen.kernels import native
from vgen.kernels.linear import Linear
from vgen.kernels.quant import Int4Linear, Int8Linear, check_mode, quantize_linears, weight_bytes
from vgen.samplers import sample

OPTS = dict(cfg_scale=2.0, top_k=3, temperature=0.9)
N = 10_000


def test_int8_layer_is_its_dequantized_weight_within_half_a_step():
    """Per output channel: every weight within half its scale of the stored value; the kernel's product equals the
    product with the dequantized weight (the CPU kernel and the portable float64 path agree)."""
    torch.manual_seed(0)
    lin = nn.Linear(96, 48)
    q = Int8Linear(lin)
    w, deq = lin.weight.detach(), q.dequantized()
    assert q.qweight.dtype == torch.int8 and q.qweight.abs().max() <= 127
    assert ((w - deq).abs() <= q.scale[:, None] / 2 + 1e-7).all()
    x = torch.randn(2, 5, 96)
    y = q(x)
    assert y.shape == (2, 5, 48)
    torch.testing.assert_close(y, x @ deq.t() + lin.bias, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q(x.double()).float(), y, rtol=1e-5, atol=1e-5)  # the portable path
    assert (y - lin(x)).abs().max() > 0  # it is another model


@pytest.mark.slow  # quick loop: a compile of int8_gemv (14 s on the AVX2 host), a path AVX2 hosts with the native kernel never take
def test_the_fused_int8_product_reads_each_row_alone_and_falls_back_to_aten(monkeypatch):
    """The CPU product's fused path (compiled int8_gemv, up to fused_rows() rows): PyTorch's int8 kernel's result
    within rounding, the same bytes for a row whatever the rows beside it (batch invariance), and aten's kernel where
    compiling fails (said once)."""
    import vgen.kernels.quant as quant
    torch.manual_seed(2)
    q = Int8Linear(nn.Linear(256, 96, bias=False))
    x = torch.randn(7, 256)
    monkeypatch.setattr(quant, "_FUSED", {"rows": 7})
    with torch.inference_mode():
        y = quant.int8_product(x, q.qweight, q.scale)
        torch.testing.assert_close(y, torch._weight_int8pack_mm(x, q.qweight, q.scale), rtol=1e-5, atol=1e-5)
        assert torch.equal(quant.int8_product(x[2:3], q.qweight, q.scale), y[2:3])
        monkeypatch.setattr(quant, "_FUSED", {"rows": 7,
                                              "fn": lambda *a: (_ for _ in ()).throw(RuntimeError("no compiler"))})
        with pytest.warns(UserWarning, match="did not compile"):
            z = quant.int8_product(x, q.qweight, q.scale)
        assert "no compiler" in quant._FUSED["failed"] and "fn" not in quant._FUSED
        assert torch.equal(z, torch._weight_int8pack_mm(x, q.qweight, q.scale))


def test_the_tiled_int8_product_is_the_product_for_wide_passes(monkeypatch):
    """int8_tiled (more rows than fused_rows(): every row on AVX2, more than 2 on AVX-512) is the dequantized
    matrix's product within rounding, over several tiles and a short last one, for float32 and bfloat16 inputs; an
    Int8Linear takes it for a wide pass."""
    import vgen.kernels.quant as quant
    torch.manual_seed(3)
    monkeypatch.setattr(quant, "TILE", 64 * 40)  # 40 rows a tile at K=64: 3 tiles over 100 outputs, the last short
    lin = nn.Linear(64, 100)
    q = Int8Linear(lin)
    x = torch.randn(9, 64)
    with torch.inference_mode():
        y = quant.int8_tiled(x, q.qweight, q.scale)
        torch.testing.assert_close(y, x @ q.dequantized().t(), rtol=1e-5, atol=1e-5)
        yb = quant.int8_tiled(x.bfloat16(), q.qweight, q.scale.bfloat16())
        torch.testing.assert_close(yb.float(), y, rtol=2e-2, atol=2e-2)
        monkeypatch.setattr(quant, "_FUSED", {"rows": 2})
        torch.testing.assert_close(q(x.reshape(3, 3, 64)), (y + lin.bias).reshape(3, 3, 100), rtol=1e-5, atol=1e-5)
    assert quant.fused_rows() == 2
    monkeypatch.setattr(quant, "_FUSED", {})
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    assert quant.fused_rows() == (2 if avx512 and quant.native.library() is None else 0)


needs_native = pytest.mark.skipif(native.supported() is not None, reason=f"no native kernel: {native.supported()}")


@needs_native
def test_the_native_int8_kernel_is_the_product_row_by_row():
    """vgen.kernels.native.int8_gemv: the float64 product within float32 rounding for every width up to ROWS (1-4
    rows a sweep and the rest), input widths with a tail past 16 codes and outputs past one 64-output task; each row's
    bytes the same whatever the rows beside it; an Int8Linear takes it at 1..ROWS float32 rows and the tiled product
    past them, and a bfloat16 input never."""
    torch.manual_seed(4)
    for n, k in [(130, 2048), (7, 37), (64, 16)]:
        q = Int8Linear(nn.Linear(k, n, bias=False))
        x = torch.randn(native.ROWS, k)
        ref = (x.double() @ q.qweight.double().t()) * q.scale.double()
        y = native.int8_gemv(x, q.qweight, q.scale)
        assert y.dtype == torch.float32 and y.shape == (native.ROWS, n)
        assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5
        for m in (1, 2, 3, 4, 5, 9):
            assert torch.equal(native.int8_gemv(x[:m], q.qweight, q.scale), y[:m])
            assert torch.equal(native.int8_gemv(x[m - 1:m], q.qweight, q.scale), y[m - 1:m])
    assert native.takes(x) and not native.takes(torch.randn(native.ROWS + 1, 4)) and not native.takes(x.bfloat16())
    with torch.inference_mode():
        torch.testing.assert_close(q(x), y, rtol=0, atol=0)
        wide = torch.randn(native.ROWS + 3, 16)
        torch.testing.assert_close(q(wide), wide @ q.dequantized().t(), rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("group", [32, 128])
def test_the_native_int4_kernel_is_the_dequantized_product_row_by_row(group):
    """vgen.kernels.native.int4_gemv on the portable layout: the dequantized matrix's float64 product within float32
    rounding at every width up to ROWS, each row's bytes the same whatever the rows beside it."""
    torch.manual_seed(6)
    for n, k in [(130, 512), (16, 256)]:
        q = Int4Linear(nn.Linear(k, n, bias=False), group, cpu_kernel=False)
        x = torch.randn(native.ROWS, k)
        ref = x.double() @ q.dequantized().double().t()
        y = native.int4_gemv(x, q.qweight, q.scale_zero, group)
        assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5
        for m in (1, 2, 3, 4, 5, 9):
            assert torch.equal(native.int4_gemv(x[:m], q.qweight, q.scale_zero, group), y[:m])
        torch.testing.assert_close(q(x), y, rtol=0, atol=0)


@needs_native
def test_the_native_kernel_builds_once_atomically_and_is_refused_with_its_reason(tmp_path, monkeypatch):
    """build() writes one library per source and compiler into the folder (no temporary left), returns the same file
    the second time without compiling; a compiler that fails raises its message; where the kernel cannot load,
    library() says why once and int8 layers keep PyTorch's products."""
    import vgen.kernels.quant as quant
    path = native.build(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    monkeypatch.setenv("CC", "/bin/false")  # would fail were it called: the built file is found by source and flags
    with pytest.raises(RuntimeError, match="false failed"):
        native.build(tmp_path / "other")
    monkeypatch.setattr(native, "_LIB", {})
    monkeypatch.setattr(native, "build", lambda folder=None: (_ for _ in ()).throw(RuntimeError("cc failed: no")))
    with pytest.warns(UserWarning, match="native int8 kernel is off: the build failed"):
        assert native.library() is None
    assert native.library() is None and not native.takes(torch.randn(1, 4))
    monkeypatch.setattr(quant, "_FUSED", {})
    torch.manual_seed(5)
    q = Int8Linear(nn.Linear(64, 40))
    x = torch.randn(2, 64)
    torch.testing.assert_close(q(x), x @ q.dequantized().t() + q.bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [32, 64])
def test_int4_layer_both_layouts_give_the_same_codes_and_products(group):
    """Per group of inputs: codes 0..15, each weight within half a step of (q - 8) * s + z; PyTorch's packed layout
    and the portable two-codes-a-byte layout (vgen's native kernel, else the tiled product, on the CPU) hold the same
    codes and give the same product, for a narrow and a wide pass. A CPU layer takes the portable layout where the
    native kernel built."""
    import vgen.kernels.quant as quant
    torch.manual_seed(1)
    lin = nn.Linear(128, 32, bias=False)
    a, b = Int4Linear(lin, group, cpu_kernel=True), Int4Linear(lin, group, cpu_kernel=False)
    assert a.cpu_kernel and not b.cpu_kernel and b.qweight.shape == (32, 64)
    assert Int4Linear(lin, group).cpu_kernel == (native.library() is None)
    wide = torch.randn(native.ROWS + 5, 128)
    torch.testing.assert_close(a(wide), b(wide), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(quant.int4_tiled(wide[:3], b.qweight, b.scale_zero, group), b(wide[:3]), rtol=1e-5,
                               atol=1e-5)
    assert torch.equal(a.codes(), b.codes()) and int(a.codes().min()) >= 0 and int(a.codes().max()) <= 15
    w = lin.weight.detach()
    step = a.scale_zero[..., 0].t().repeat_interleave(group, 1)  # (N, K): each weight's group scale
    assert ((w - a.dequantized()).abs() <= step / 2 + 1e-6).all()
    x = torch.randn(3, 128)
    torch.testing.assert_close(a(x), b(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a(x), x @ a.dequantized().t(), rtol=1e-4, atol=1e-4)


def test_quantize_linears_replaces_what_it_can_and_says_what_it_kept():
    m = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), Linear(32, 48), nn.Linear(48, 8), nn.Sequential(nn.Linear(64, 64)))
    before = weight_bytes(m)
    info = quantize_linears(m, "int4", 32, skip=("4",))
    # 64 -> 32 and vgen's Linear 32 -> 48 are packed; 48 inputs are not whole groups of 32; "4" is skipped
    assert info["quantized"] == 2 and info["kept"] == 1 and type(m[3]) is nn.Linear and type(m[4][0]) is nn.Linear
    assert isinstance(m[0], Int4Linear) and isinstance(m[2], Int4Linear) and info["weight_bytes"] < before
    m8 = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 8))
    assert quantize_linears(m8, "int8") == {"quantized": 2, "kept": 0, "weight_bytes": weight_bytes(m8)}


def test_bad_modes_are_one_line_errors():
    assert check_mode(None) is None and check_mode("int8") == "int8"
    with pytest.raises(VGenError, match="quantize='int3' is not a weight format; use one of int8, int4"):
        check_mode("int3")
    with pytest.raises(VGenError, match="quantize_group=48 is not a group size the int4 kernel takes"):
        check_mode("int4", 48)


@pytest.mark.parametrize("mode,sampler,extra", [
    pytest.param("int8", "sjd", dict(window=3), marks=pytest.mark.slow),
    pytest.param("int4", "pac", dict(window=3, tree_width=2, tree_depth=1), marks=pytest.mark.slow)])
def test_speculative_samplers_are_exact_for_the_quantized_model(micro_gpt, mode, sampler, extra):
    """The law is the quantized model's: 10k batched samples of a speculative sampler on the int8 / int4 micro model
    follow its enumerated joint, and reject both its unguided joint and one a tenth of the way there (power)."""
    m = copy.deepcopy(micro_gpt)
    info = quantize_linears(m, mode, 32)
    assert info["quantized"] >= 8  # every block's layers (int4 keeps the 4-way head: outputs not a multiple of 16)
    _, joint = exact_joint(m, 1, 2.0, top_k=3, temperature=0.9)
    _, unguided = exact_joint(m, 1, 1.0, top_k=3, temperature=0.9)
    _, float_joint = exact_joint(micro_gpt, 1, 2.0, top_k=3, temperature=0.9)
    joint, unguided = joint.numpy(), unguided.numpy()
    assert 0 < 0.5 * abs(joint - float_joint.numpy()).sum()  # another model, whose law is sampled
    tokens, st = sample(m, [1] * N, sampler, seed=0, **extra, **OPTS)
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, joint) > 1e-3
    assert chi2_p(counts, unguided) < 1e-6 and chi2_p(counts, toward(joint, unguided)) < 1e-6
    assert counts[joint == 0].sum() == 0 and st["accepted_per_step"] > 1.0


def test_a_quantized_model_samples_the_same_bytes_in_any_batching(tiny_gpt):
    """Per-sample seeds hold with int8 / int4 weights: batch 4 and batch 1 give the same tokens."""
    for mode in ("int8", "int4"):
        m = copy.deepcopy(tiny_gpt)
        quantize_linears(m, mode, 32)
        a, _ = sample(m, [0, 1, 2, 3], "sjd", seed=3, window=3, batch_size=4, cfg_scale=2.0, top_k=8)
        b, _ = sample(m, [0, 1, 2, 3], "sjd", seed=3, window=3, batch_size=1, cfg_scale=2.0, top_k=8)
        assert torch.equal(a, b), mode


def test_pipeline_and_cli_record_the_quantization(tiny_pipeline, tmp_path):
    """load_pipeline(quantize=) and `vgen sample quantize=`: the model's layers replaced, the weight bytes down, the
    stats say so; samples of another quantization are refused in the same folder; bad values stop before loading."""
    import vgen
    from vgen.cli import main
    pipe = vgen.load_pipeline(str(tiny_pipeline), quantize="int8")
    full = vgen.load_pipeline(str(tiny_pipeline))
    q = pipe.quantization
    assert q["mode"] == "int8" and q["quantized"] == 2 * 5 + 1 and q["kept"] == 0
    assert isinstance(pipe.model.output, Int8Linear) and q["weight_bytes"] < weight_bytes(full.model)
    out = tmp_path / "s"
    main(["sample", f"model.path={tiny_pipeline}", "quantize=int4", "num_samples=2", f"outdir={out}", "progress=false"])
    st = json.loads((out / "stats.json").read_text())
    assert st["quantize"] == "int4/32" and st["quantization"]["mode"] == "int4" and st["quantization"]["quantized"] > 0
    with pytest.raises(SystemExit) as e:  # other samples: the folder holds int4's
        main(["sample", f"model.path={tiny_pipeline}", "quantize=int8", "num_samples=2", f"outdir={out}",
              "progress=false"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["sample", f"model.path={tiny_pipeline}", "quantize=int3", f"outdir={tmp_path / 'bad'}"])
    assert e.value.code == 2 and not (tmp_path / "bad").exists()
    with pytest.raises(VGenError, match="takes no quantized model"):
        pipe.generate(labels=[0], sampler="llamagen-loop", seed=0)


@pytest.mark.slow
def test_quantized_models_compile(tiny_gpt):
    """compile=true composes with int8 / int4 weights: the compiled step gives the eager tokens."""
    for mode in ("int8", "int4"):
        m = copy.deepcopy(tiny_gpt)
        quantize_linears(m, mode, 32)
        eager, _ = sample(m, [0, 1], "ar", seed=5, cfg_scale=2.0, top_k=8, compile=False)
        compiled, st = sample(m, [0, 1], "ar", seed=5, cfg_scale=2.0, top_k=8, compile=True)
        assert torch.equal(eager, compiled), mode


@pytest.mark.slow
def test_bench_times_weight_formats_side_by_side(tmp_path, monkeypatch):
    """`vgen bench 'models=[photos-gpt,photos-gpt@int8,photos-gpt@int4]'`: one row per format in one run, each
    pipeline quantized as named; baseline=true with a quantized entry is refused before loading."""
    from vgen.cli import main
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "b"
    main(["bench", "models=[photos-gpt,photos-gpt@int8,photos-gpt@int4]", "samplers=[ar]", "batch_sizes=[1]",
          "num_samples=1", "repeats=1", "warmup=false", "compile=false", "baseline=false", f"outdir={out}"])
    rep = json.loads((out / "bench.json").read_text())
    assert {r["model"] for r in rep["rows"]} == {"photos-gpt", "photos-gpt@int8", "photos-gpt@int4"}
    assert all(r["forward_passes"] > 0 and r["ms_per_token"] > 0 for r in rep["rows"])
    with pytest.raises(SystemExit) as e:
        main(["bench", "models=[photos-gpt@int8]", "samplers=[ar]", "baseline=true", f"outdir={tmp_path / 'c'}"])
    assert e.value.code == 2 and not (tmp_path / "c").exists()


def test_transformers_models_store_their_decoder_and_text_table_in_fewer_bits(tmp_path, monkeypatch):
    """load_pipeline(<a Janus folder>, quantize="int8"): the decoder's linear layers and its text table in int8, the
    output layer tied to that table sharing its codes (one copy: the float table is gone), the weight bytes down;
    prompts embed within half a step of the float rows; a lossless sampler gives ar's tokens on the quantized model.
    Emu3 (its table untied) and int4 too."""
    pytest.importorskip("transformers")
    import vgen
    from vgen.kernels.quant import Int8Embedding
    from vgen.models import from_transformers
    from vgen.models.hf import shapes
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shapes.janus(codes=8, grid=(2, 2)).save_pretrained(tmp_path / "janus")
    full = vgen.load_pipeline(str(tmp_path / "janus"))
    pipe = vgen.load_pipeline(str(tmp_path / "janus"), quantize="int8")
    q, lm = pipe.quantization, pipe.hf.model.language_model
    assert q["mode"] == "int8" and q["quantized"] == 2 * 7 and q["embeddings"] == 2
    assert isinstance(lm.embed_tokens, Int8Embedding) and isinstance(pipe.hf.lm_head, Int8Linear)
    assert pipe.hf.lm_head.qweight is lm.embed_tokens.qweight
    assert not any(type(t) is nn.Embedding and t.num_embeddings == 64 for t in pipe.hf.modules())
    assert q["weight_bytes"] < weight_bytes(full.hf)
    ids = torch.tensor([[0, 9, 11, 3], [0, 17, 12, 3]])
    rows, exact = lm.embed_tokens(ids), full.hf.model.language_model.embed_tokens(ids)
    assert ((rows - exact).abs() <= lm.embed_tokens.scale[ids].unsqueeze(-1) / 2 + 1e-7).all()
    ar = pipe.generate(input_ids=ids, sampler="ar", seed=0, top_k=1).tokens
    assert torch.equal(pipe.generate(input_ids=ids, sampler="sjd", seed=0, top_k=1, window=3).tokens, ar)
    m = from_transformers(shapes.emu3(codes=8), height=2, width=2)
    info = m.quantize_weights("int4", 32)
    assert info["quantized"] > 0 and info["embeddings"] == 1 and isinstance(m.hf.model.text_model.embed_tokens,
                                                                             Int8Embedding)
    toks, _ = sample(m, torch.tensor([[0, 9, 11, 7, 9, 6]]), "ar", seed=1, cfg_scale=1.0)
    assert toks.shape == (1, 4)
