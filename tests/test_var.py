"""VAR (next-scale) sampling, the multi-scale VQVAE, the staged KV cache and ScaleKV compression."""
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from exact import chi2_p, counts_of, tv

from vgen.errors import VGenError
from vgen.kernels.kv_compression import (
    WindowCompression,
    calibrate,
    layer_weights,
    load_calibration,
    two_means,
    window_positions,
)
from vgen.kernels.sampling import filter_probs
from vgen.samplers import sample


# ---- the tokenizer -----------------------------------------------------------------------------------------
def test_msvq_codes_round_trip_and_shapes(tiny_msvq):
    x = torch.rand(3, 3, 8, 8) * 2 - 1
    with torch.no_grad():
        codes = tiny_msvq.encode_to_codes(x)
        assert codes.shape == (3, 1 + 4 + 9 + 16)
        img = tiny_msvq.decode_codes(codes)
        one = tiny_msvq.decode_codes(codes[1:2])  # batched convolutions agree up to float rounding
    assert img.shape == (3, 3, 8, 8) and img.abs().max() <= 1
    torch.testing.assert_close(img[1:2], one, atol=1e-5, rtol=0)
    with pytest.raises(VGenError, match="expects 30"):
        tiny_msvq.decode_codes(codes[:, :-1])
    with pytest.raises(VGenError, match="last scale"):
        tiny_msvq.encode_to_codes(torch.zeros(1, 3, 16, 16))


def test_msvq_teacher_input_matches_inference_accumulation(tiny_msvq):
    """The teacher-forcing input built at once equals what inference builds scale by scale."""
    q = tiny_msvq.quantize
    codes = torch.randint(0, 32, (2, 30))
    idx = q.split(codes)
    with torch.no_grad():
        ref = q.teacher_input(idx)
        f_hat, parts = torch.zeros(2, 8, 4, 4), []
        for si in range(4):
            f_hat, nxt = q.next_input(si, f_hat, idx[si])
            if nxt is not None:
                parts.append(nxt)
        torch.testing.assert_close(torch.cat(parts, 1), ref)
        torch.testing.assert_close(f_hat, q.codes_to_fhat(idx), atol=1e-6, rtol=0)


# ---- the sampler -------------------------------------------------------------------------------------------
def test_var_sampler_one_pass_per_scale_and_stats(tiny_var):
    tokens, st = sample(tiny_var, [0, 1, 2], "var", seed=3, cfg=1.5, top_k=8)
    assert tokens.shape == (3, 30) and tokens.max() < 32
    assert st["forward_passes"] == 4 and st["accepted_per_step"] == 30 / 4
    assert st["step_map"][0].tolist() == [0] + [1] * 4 + [2] * 9 + [3] * 16
    # the full cache peaks at every token of every scale: k and v, 2 layers, 3 x 2 CFG rows, 30 tokens, fp32
    assert st["kv_cache_bytes"] == st["kv_full_bytes"] == 2 * 2 * 6 * 30 * 64 * 4
    assert len(st["kv_kept_bytes_per_scale"]) == 4 and st["kv_kept_bytes_per_scale"][-1] == 0
    assert st["kv_kept_fraction"] == 1.0


def test_var_sampler_seeds_are_per_sample(tiny_var):
    """Sample i depends only on (label i, seed i): same tokens alone, in a batch, and in chunks."""
    labels = [0, 1, 2, 3, 1]
    full, _ = sample(tiny_var, labels, "var", seed=10, cfg=2.0, top_k=16)
    chunked, _ = sample(tiny_var, labels, "var", seed=10, cfg=2.0, top_k=16, batch_size=2)
    assert torch.equal(full, chunked)
    alone, _ = sample(tiny_var, [labels[3]], "var", seed=13, cfg=2.0, top_k=16)
    assert torch.equal(alone[0], full[3])
    other, _ = sample(tiny_var, labels, "var", seed=11, cfg=2.0, top_k=16)
    assert not torch.equal(other, full)


def test_var_sampler_refuses_bad_options_and_wrong_models(tiny_var, tiny_gpt):
    with pytest.raises(VGenError, match=r"top_p must be in \(0, 1\]"):
        sample(tiny_var, [0], "var", top_p=1.5)
    with pytest.raises(VGenError, match="kv_compression must be one of"):
        sample(tiny_var, [0], "var", kv_compression="h2o")
    with pytest.raises(VGenError, match="kv_calibration"):
        sample(tiny_var, [0], "var", kv_compression="scalekv")
    with pytest.raises(VGenError, match="next-scale model: use one of var"):
        sample(tiny_var, [0], "ar")
    with pytest.raises(VGenError, match="next-token model: use one of"):
        sample(tiny_gpt, [0], "var")
    with pytest.raises(VGenError, match="unknown option.*cfg_interval"):  # VAR has no per-token guidance window
        sample(tiny_var, [0], "var", cfg_interval=3)
    with pytest.raises(VGenError, match="give cfg_scale or its alias cfg, not both"):
        sample(tiny_var, [0], "var", cfg=1.5, cfg_scale=2.5)
    with pytest.raises(VGenError, match="cfg_scale must be a finite number"):
        sample(tiny_var, [0], "var", cfg_scale=float("inf"))


def test_var_cfg_alias_means_cfg_scale_minus_one(tiny_var):
    """VAR's official cfg=c is vgen's cfg_scale=1+c: same tokens, and guidance really changes them."""
    a, _ = sample(tiny_var, [0, 1], "var", seed=2, cfg=1.5, top_k=8)
    b, _ = sample(tiny_var, [0, 1], "var", seed=2, cfg_scale=2.5, top_k=8)
    off, _ = sample(tiny_var, [0, 1], "var", seed=2, cfg_scale=1.0, top_k=8)
    assert torch.equal(a, b) and not torch.equal(a, off)


@pytest.fixture(scope="module")
def micro_var():
    """V=3, scales 1 and 2x2: 243 possible token pyramids, exact distribution enumerable."""
    from vgen.models import build
    torch.manual_seed(5)
    vae = build("msvq", vocab_size=3, z_channels=4, ch=32, ch_mult=[1], num_res_blocks=1, v_patch_nums=[1, 2]).eval()
    m = build("var", vocab_size=3, Cvae=4, depth=2, embed_dim=32, num_heads=2, num_classes=2,
              patch_nums=[1, 2]).init_weights()
    torch.nn.init.normal_(m.head.weight, std=0.5)
    torch.nn.init.normal_(m.class_emb.weight, std=1.0)
    for blk in m.blocks:  # make the blocks (and so scale 0 -> scale 1 dependence) matter
        torch.nn.init.normal_(blk.ada_lin[-1].weight, std=0.1)
        torch.nn.init.normal_(blk.attn.mat_qkv.weight, std=0.3)
    return m.eval().attach_tokenizer(vae)


def _exact_var_joint(model, label, cfg, **opts):
    """P(pyramid) = p(scale 0 | c) * prod over scale-1 tokens of p(token | scale 0, c), VAR's guidance schedule."""
    V, pn = model.vocab_size, model.patch_nums
    seqs = torch.tensor(list(itertools.product(range(V), repeat=model.seq_len)))
    q = model._quantizer()
    with torch.no_grad():
        x = q.teacher_input(q.split(seqs))
        cond = torch.full((len(seqs),), label)
        lc, lu = model(cond, x), model(model.null_cond(cond), x)
        t = torch.cat([torch.full((p * p,), cfg * si / (len(pn) - 1)) for si, p in enumerate(pn)])[None, :, None]
        p = filter_probs((1 + t) * lc - t * lu, **opts)
        return seqs, p.gather(-1, seqs[..., None]).squeeze(-1).prod(-1)


@pytest.mark.parametrize("cfg,opts", [pytest.param(0.0, {}, marks=pytest.mark.slow),
                                      (2.0, {"top_k": 2, "temperature": 0.8})])
def test_var_sampler_draws_from_the_models_own_factorisation(micro_var, cfg, opts):
    seqs, joint = _exact_var_joint(micro_var, 1, cfg, **opts)
    assert abs(float(joint.sum()) - 1) < 1e-4
    n = 20000
    tokens, _ = sample(micro_var, [1] * n, "var", seed=0, cfg=cfg, **opts)
    counts = counts_of(tokens, 3)
    p = joint.double().numpy()
    assert chi2_p(counts, p) > 1e-3
    assert tv(counts, p) < 0.03
    # and it is not some other distribution: the other class's joint is rejected
    _, other = _exact_var_joint(micro_var, 0, cfg, **opts)
    assert chi2_p(counts, other.double().numpy()) < 1e-6


# ---- staged cache and compression ----------------------------------------------------------------------------
def test_window_positions_form_a_uniform_grid():
    assert window_positions(2, 2).tolist() == [0, 1, 2, 3]
    w = window_positions(16, 16)
    assert w.numel() == 16 and len(set(w.tolist())) == 16
    ys, xs = (w // 16).unique(), (w % 16).unique()
    assert ys.tolist() == xs.tolist() == [2, 6, 10, 14]


def test_budget_one_keeps_everything_and_changes_nothing(tiny_var, tmp_path):
    """At budget 1.0 every compression kind (vgen.kernels.kv_compression.make_policy: none, uniform, scalekv)
    keeps the whole cache: the tokens and the bytes of no compression."""
    from vgen.pipeline import Pipeline
    from vgen.samplers.var import calibrate_scalekv
    pipe = Pipeline(tiny_var, tiny_var._tokenizer[0], {"sampling": {"cfg": 1.5}})
    cal = tmp_path / "cal.json"  # made for another budget: a calibration serves any budget
    cal.write_text(json.dumps(calibrate_scalekv(pipe, budget=0.2, num_samples=2, batch_size=2, progress=False)))
    ref, st_ref = sample(tiny_var, [0, 1], "var", seed=4, cfg=1.5)
    for kind, extra in (("none", {}), ("uniform", {}), ("scalekv", {"kv_calibration": str(cal)})):
        toks, st = sample(tiny_var, [0, 1], "var", seed=4, cfg=1.5, kv_compression=kind, kv_budget=1.0, **extra)
        assert torch.equal(toks, ref), kind
        assert st["kv_cache_bytes"] == st["kv_full_bytes"] == st_ref["kv_cache_bytes"], kind
        assert st["kv_kept_fraction"] == 1.0, kind


def _measure_staged_cache(monkeypatch) -> list[dict]:
    """Spy on the staged KV cache, independently of its own byte counting: per sampling run, for each stage the
    bytes and token count of the keys and values its attention really reads (summed over layers), and of the
    tensors the cache really holds after the stage."""
    import torch.nn.functional as F

    from vgen.kernels.staged_cache import StagedKVCache
    runs: list[dict] = []
    nb = lambda t: t.numel() * t.element_size()  # noqa: E731
    sdpa, init, begin, end = (F.scaled_dot_product_attention, StagedKVCache.__init__, StagedKVCache.begin_stage,
                              StagedKVCache.end_stage)

    def spy_init(self, *a, **kw):
        runs.append({"read": [], "read_tokens": [], "kept": [], "kept_tokens": []})
        init(self, *a, **kw)

    def spy_begin(self, *a, **kw):
        runs[-1]["read"].append(0)
        runs[-1]["read_tokens"].append(set())
        begin(self, *a, **kw)

    def spy_sdpa(q, k, v, *a, **kw):
        runs[-1]["read"][-1] += nb(k) + nb(v)
        runs[-1]["read_tokens"][-1].add(k.shape[2])
        return sdpa(q, k, v, *a, **kw)

    def spy_end(self):
        held = [t for t in self.k + self.v if t is not None]
        runs[-1]["kept"].append(sum(nb(t) for t in held))
        runs[-1]["kept_tokens"].append({t.shape[2] for t in held})
        end(self)

    monkeypatch.setattr(StagedKVCache, "__init__", spy_init)
    monkeypatch.setattr(StagedKVCache, "begin_stage", spy_begin)
    monkeypatch.setattr(StagedKVCache, "end_stage", spy_end)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy_sdpa)
    return runs


def test_compression_keeps_the_budget_and_only_affects_later_scales(tiny_var, monkeypatch):
    runs = _measure_staged_cache(monkeypatch)
    full, st_full = sample(tiny_var, [0, 1, 2, 3], "var", seed=7, cfg=1.5)
    toks, st = sample(tiny_var, [0, 1, 2, 3], "var", seed=7, cfg=1.5, kv_compression="uniform", kv_budget=0.25)
    assert len(runs) == 2
    mf, mc = runs
    # scales 0 and 1 attend to the full cache; the first compression (after scale 0) keeps 1 of 1 token, and
    # after scale 1 (5 tokens) keeps round(0.25 * 5) = 1 token per head
    assert torch.equal(toks[:, :5], full[:, :5]) and not torch.equal(toks, full)
    # token counts by hand (scales of 1, 4, 9 and 16 tokens): the full cache reads 1, 5, 14 and 30 tokens; the
    # compressed one keeps 1, 1, round(0.25 * 14) = 4 tokens per head after scales 0-2 and nothing after the last
    assert mf["read_tokens"] == [{1}, {5}, {14}, {30}]
    assert mc["kept_tokens"] == [{1}, {1}, {4}, set()]
    assert mc["read_tokens"] == [{1}, {1 + 4}, {1 + 9}, {4 + 16}]
    # the reported bytes are those of the tensors the cache really held and read
    assert st_full["kv_cache_bytes"] == st_full["kv_full_bytes"] == max(mf["read"]) == mf["read"][-1]
    assert st["kv_kept_bytes_per_scale"] == mc["kept"]
    assert st["kv_cache_bytes"] == max(mc["read"]) == mc["read"][-1] < st_full["kv_cache_bytes"]
    assert st["kv_full_bytes"] == st_full["kv_cache_bytes"]
    # peak: the last scale (16 tokens) plus the 4 kept after scale 2, of the full cache's 30
    assert st["kv_cache_bytes"] * 30 == st_full["kv_cache_bytes"] * 20
    assert st["kv_fraction"] == pytest.approx(20 / 30)
    assert st["kv_kept_fraction"] == pytest.approx((1 + 1 + 4) / (1 + 5 + 14))


def test_window_compression_keeps_most_attended_tokens_per_head():
    """A key the window attends to strongly survives; the window's own positions are always kept."""
    torch.manual_seed(0)
    B, H, T, D = 1, 2, 20, 8
    q = torch.randn(B, H, 4, D)
    k = torch.randn(B, H, T, D) * 0.01
    v = torch.randn(B, H, T, D)
    k[0, 0, 3] = q[0, 0].sum(0) * 5  # head 0 loves key 3, head 1 loves key 9
    k[0, 1, 9] = q[0, 1].sum(0) * 5
    pol = WindowCompression(budget=0.3, kernel=1)  # 6 kept of 20
    kk, vv = pol.keep(0, 1, (2, 2), q, k, v, 1.0, T)
    assert kk.shape == (1, 2, 6, D)
    kept0 = [int(i) for i in range(T) if any(torch.equal(k[0, 0, i], x) for x in kk[0, 0])]
    kept1 = [int(i) for i in range(T) if any(torch.equal(k[0, 1, i], x) for x in kk[0, 1])]
    assert 3 in kept0 and 9 in kept1
    assert set(range(16, 20)) <= set(kept0) and set(range(16, 20)) <= set(kept1)  # the window (last map)
    assert torch.equal(vv[0, 0], v[0, 0, kept0])


def test_two_means_and_layer_weights():
    assert two_means([0.1, 0.12, 0.9, 1.0, 0.11]) == [False, False, True, True, False]
    w, drafters, ratio = layer_weights([0.01, 0.01, 0.08, 0.01], budget=0.1)
    assert drafters == [2] and ratio == pytest.approx(8.0)
    assert np.mean(w) == pytest.approx(1.0) and w[2] == pytest.approx(8 * w[0])
    w, _, ratio = layer_weights([0.01, 0.5, 0.01, 0.01], budget=0.25)  # ratio capped at 1/budget
    assert ratio == 4.0 and np.mean(w) == pytest.approx(1.0)
    assert layer_weights([0.2, 0.2], 0.1)[0] == [1.0, 1.0]


def test_calibration_round_trip_and_scalekv_sampling(tiny_var, tmp_path):
    from vgen.pipeline import Pipeline
    from vgen.samplers.var import calibrate_scalekv
    pipe = Pipeline(tiny_var, tiny_var._tokenizer[0], {"sampling": {"cfg": 1.5}})
    cal = calibrate_scalekv(pipe, budget=0.2, num_samples=4, batch_size=2, progress=False)
    assert cal["patch_nums"] == [1, 2, 3, 4] and len(cal["weights"]) == 3
    for e in cal["scales"]:
        assert np.mean(e["weights"]) == pytest.approx(1.0)
        assert all(0 <= m <= 1 for m in e["prefix_mass"]) and all(0 < s <= 1 for s in e["spread"])
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal))
    assert load_calibration(path, [1, 2, 3, 4], 2)["budget"] == 0.2
    with pytest.raises(VGenError, match="calibrated for scales"):
        load_calibration(path, [1, 2, 4], 2)
    toks, st = sample(tiny_var, [0, 1], "var", seed=1, cfg=1.5, kv_compression="scalekv", kv_budget=0.2,
                      kv_calibration=str(path))
    assert toks.shape == (2, 30) and st["kv_cache_bytes"] < st["kv_full_bytes"]


def test_calibrate_handles_flat_and_split_demand():
    depth = 4
    mass = [[0.0] * depth, [0.5, 0.5, 0.5, 0.5], [0.9, 0.1, 0.1, 0.1]]
    spread = [[0.0] * depth, [0.5] * 4, [0.8, 0.1, 0.1, 0.1]]
    cal = calibrate(mass, spread, 0.1, [1, 2, 3], depth)
    assert cal["weights"][0] == [1.0] * 4  # flat demand: uniform
    assert cal["scales"][1]["drafters"] == [0] and cal["weights"][1][0] > cal["weights"][1][1]


# ---- pipeline and CLI ----------------------------------------------------------------------------------------
def test_var_pipeline_generates_images(tiny_var_pipeline):
    from vgen.pipeline import Pipeline
    pipe = Pipeline.from_pretrained(str(tiny_var_pipeline))
    assert pipe.card.order == "next-scale"
    gen = pipe.generate([0, 3], sampler="var", seed=2)
    assert gen.images.shape == (2, 3, 8, 8) and gen.images.dtype == torch.uint8
    assert gen.stats["options"]["cfg_scale"] == 2.5 and gen.stats["options"]["top_k"] == 8  # the card's settings
    with pytest.raises(VGenError, match="use one of var"):
        pipe.generate([0], sampler="sjd")


def _vgen(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "vgen", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.slow
def test_cli_calibrate_then_sample_with_scalekv(tiny_var_pipeline, tmp_path, capsys):
    """The calibration in a real process; the rest in process (the main() the command runs: a process each costs
    seconds of imports)."""
    from vgen.cli import main
    cal = tmp_path / "cal.json"
    r = _vgen("scalekv", "calibrate", f"model.path={tiny_var_pipeline}", "budget=0.25", "num_samples=2",
              f"out={cal}", "progress=false")
    assert r.returncode == 0, r.stderr
    assert json.loads(cal.read_text())["budget"] == 0.25 and "drafters" in r.stdout
    out = tmp_path / "s"
    main(["sample", f"model.path={tiny_var_pipeline}", "sampler=var", "sampler.kv_compression=scalekv",
          "sampler.kv_budget=0.25", f"sampler.kv_calibration={cal}", "num_samples=3", f"outdir={out}",
          "progress=false"])
    stats = json.loads((out / "stats.json").read_text())
    assert stats["options"]["kv_compression"] == "scalekv" and (out / "000002.png").exists()
    # without sampler=..., a next-scale model samples with its own sampler
    main(["sample", f"model.path={tiny_var_pipeline}", "num_samples=1", f"outdir={tmp_path / 'd'}",
          "progress=false"])
    assert json.loads((tmp_path / "d" / "stats.json").read_text())["sampler"] == "var"
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["scalekv", "calibrate", f"model.path={tiny_var_pipeline}", "budget=1.5"])
    assert e.value.code == 2 and "budget must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_kv_compression_table_with_fidelity(tiny_var_pipeline, tiny_pipeline, tmp_path, capsys):
    """Mixed models: next-token settings skip the next-scale model and vice versa; fidelity to the full cache."""
    out = tmp_path / "bench"
    r = _vgen("bench", f"models=[{tiny_var_pipeline},{tiny_pipeline}]", "batch_sizes=[2]", "repeats=1",
              "compile=false", "num_samples=4", 'samplers=[var,"var:kv_compression=uniform,kv_budget=0.25",ar]',
              "fidelity_reference=var", "fidelity_samples=6", f"outdir={out}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "bench.json").read_text())
    cells = {(row["model"].split("/")[-1], row["sampler"]) for row in rep["rows"]}
    assert cells == {("tinyvar", "var"), ("tinyvar", "var:kv_compression=uniform,kv_budget=0.25"),
                     ("tinypipe", "llamagen-loop"), ("tinypipe", "ar")}
    full = next(x for x in rep["rows"] if x["sampler"] == "var")
    comp = next(x for x in rep["rows"] if "uniform" in x["sampler"])
    assert full["kv_vs_ref"] == 1.0 and comp["kv_vs_ref"] < 1.0 and full["forward_passes"] == 2 * 4
    assert comp["kv_kept_fraction"] == pytest.approx(0.3) and full["kv_kept_fraction"] == 1.0
    assert comp["fidelity_samples"] == 6 and comp["psnr_vs_ref"] > 0 and comp["fid_vs_ref"] > -1e-3
    assert "PSNR vs ref dB" in r.stdout and "KV kept" in r.stdout
    assert (out / "bench.png").stat().st_size > 1000
    from vgen.cli import main
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # in process: the refusal needs no second process
        main(["bench", f"models=[{tiny_var_pipeline}]", "samplers=[sjd]", f"outdir={out}"])
    assert e.value.code == 2 and "fits none of the models" in capsys.readouterr().err


def test_water_fill_keeps_the_total_under_the_cap():
    from vgen.kernels.kv_compression import water_fill
    caps = water_fill([4.0, 1.0, 1.0, 2.0], mean=10.0, cap=25.0)  # 40 tokens in all, nobody above 25
    assert sum(caps) == pytest.approx(40.0) and max(caps) <= 25.0
    assert caps == pytest.approx([20.0, 5.0, 5.0, 10.0])
    caps = water_fill([8.0, 1.0, 1.0, 1.0], mean=10.0, cap=14.0)  # the drafter is clipped, the rest share
    assert caps[0] == 14.0 and sum(caps) == pytest.approx(40.0) and caps[1] == caps[2] == caps[3] == pytest.approx(26 / 3)
    assert water_fill([1.0, 1.0], mean=50.0, cap=20.0) == [20.0, 20.0]  # budget above everything: keep all
