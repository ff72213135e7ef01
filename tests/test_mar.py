"""MAR: the official behaviour stored in ../shared/conformance (mar.safetensors + mar_io.pt, see its README) and
the ``mar`` sampler on a tiny random model."""
import math

import pytest
import torch
from conftest import load_io
from safetensors.torch import load_file

import vgen.models.mar  # noqa: F401  (registers the "mar" kind)
import vgen.samplers.mar  # noqa: F401  (registers the "mar" sampler)
from vgen.errors import VGenError
from vgen.interfaces import MaskedModel, Order
from vgen.models import build, load_official
from vgen.models.diffusion_head import schedule
from vgen.samplers.base import get_sampler, sample
from vgen.samplers.continuous import token_noise
from vgen.samplers.mar import generation_orders


# ---- conformance -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mar_io(conf_dir):
    return load_io(conf_dir, "mar")


@pytest.fixture(scope="module")
def official(conf_dir, mar_io):
    return load_official("mar", conf_dir / "mar.safetensors", **mar_io["config"])


def test_conformance_mar_state_dict_loads_strictly(conf_dir, mar_io, official):
    sd = load_file(str(conf_dir / "mar.safetensors"))
    own = official.state_dict()
    assert set(own) == set(sd)
    assert all(torch.equal(own[k], sd[k]) for k in sd)
    assert isinstance(official, MaskedModel) and official.order == Order.MASKED
    cfg = mar_io["config"]
    assert official.num_classes == cfg["class_num"]
    assert official.token_channels == cfg["vae_embed_dim"] * cfg.get("patch_size", 1) ** 2
    assert official.seq_len == mar_io["tokens"].shape[1] == math.prod(official.token_shape)


def test_conformance_mar_config_inferred_from_shapes(conf_dir, mar_io):
    """Only what the shapes cannot show is needed: the head counts (and the class count: the official class
    table has 1000 rows whatever class_num is)."""
    cfg = mar_io["config"]
    need = {k: cfg[k] for k in ("encoder_num_heads", "decoder_num_heads", "class_num", "num_sampling_steps",
                                "vae_stride", "patch_size") if k in cfg}
    model = load_official("mar", conf_dir / "mar.safetensors", **need)
    for k, v in cfg.items():
        assert getattr(model.config, k) == (int(v) if k == "num_sampling_steps" else v), k
    with pytest.raises(VGenError, match="encoder_num_heads"):
        load_official("mar", conf_dir / "mar.safetensors", **{k: v for k, v in need.items()
                                                             if k != "encoder_num_heads"})


def test_conformance_mar_conditions(mar_io, official):
    """z = enc_dec(tokens, mask, class_emb(labels)); z_uncond with fake_latent (the null class)."""
    labels, tokens, mask = mar_io["labels"], mar_io["tokens"], mar_io["mask"]
    with torch.no_grad():
        z = official.conditions(tokens, mask, labels)
        z_uncond = official.conditions(tokens, mask, official.null_cond(labels))
    torch.testing.assert_close(z, mar_io["z"], atol=1e-4, rtol=0)
    torch.testing.assert_close(z_uncond, mar_io["z_uncond"], atol=1e-4, rtol=0)


def test_conformance_mar_head_net(mar_io, official):
    with torch.no_grad():
        out = official.diffloss.net(mar_io["diff_x_t"], mar_io["diff_t"], mar_io["diff_c"])
    torch.testing.assert_close(out, mar_io["net_out"], atol=1e-4, rtol=0)


def test_conformance_mar_p_mean_variance(mar_io, official):
    """Every respaced step k (0 = least noisy) is schedule step n-1-k; at the noisiest step pred_xstart is ~1e4
    (1 / sqrt(alpha-bar)), compared relatively."""
    n = int(mar_io["num_timesteps"])
    sch = schedule(n)
    assert len(sch) == n
    torch.testing.assert_close(sch.consts["max_log"].exp().flip(0), mar_io["betas"], atol=0, rtol=1e-6)
    x, c = mar_io["diff_x_t"], mar_io["diff_c"]
    for k, ref in mar_io["p_mean_variance"].items():
        i = n - 1 - int(k)
        t = torch.full((x.shape[0],), int(sch.timesteps[i]), dtype=torch.long)
        with torch.no_grad():
            st = sch.step(i, x, official.diffloss.net(x, t, c))
        tol = dict(atol=1e-4, rtol=1e-4 if i == 0 else 0)
        torch.testing.assert_close(st.mean, ref["mean"], **tol, msg=f"mean at step {k}")
        torch.testing.assert_close(st.log_var, ref["log_variance"], **tol, msg=f"log_variance at step {k}")
        torch.testing.assert_close(st.x0, ref["pred_xstart"], **tol, msg=f"pred_xstart at step {k}")


@pytest.mark.parametrize("key,temperature", [("x0_temp1", 1.0), ("x0_temp0.9", 0.9)])
def test_conformance_mar_reverse_process(mar_io, official, key, temperature):
    """``inter_noise[k]`` is used at respaced t = k, i.e. at schedule step n-1-k."""
    with torch.no_grad():
        out = official.sample_head(mar_io["diff_c"], mar_io["noise"], mar_io["inter_noise"].flip(0),
                                   temperature=temperature)
    torch.testing.assert_close(out.token, mar_io[key], atol=1e-3, rtol=1e-4)


def test_conformance_mar_reverse_process_cfg(mar_io, official):
    """Rows [cond; uncond]: the guided half is the conditional rows' result (the official uncond rows follow)."""
    b = mar_io["cfg_noise"].shape[0] // 2
    with torch.no_grad():
        out = official.sample_head(mar_io["cfg_c"], mar_io["cfg_noise"][:b],
                                   mar_io["cfg_inter_noise"].flip(0)[:, :b], cfg=2.0)
    torch.testing.assert_close(out.token, mar_io["x0_cfg2"][:b], atol=1e-3, rtol=1e-4)


# ---- a tiny random MAR ---------------------------------------------------------------------------------------------
TINY = dict(img_size=64, vae_stride=16, vae_embed_dim=4, encoder_embed_dim=32, decoder_embed_dim=32, encoder_depth=1,
            decoder_depth=1, encoder_num_heads=2, decoder_num_heads=2, buffer_size=4, diffloss_d=1, diffloss_w=32,
            num_sampling_steps=5, class_num=4)


@pytest.fixture(scope="module")
def tiny_mar():
    torch.manual_seed(0)
    m = build("mar", **TINY)
    with torch.no_grad():  # the official head init is adaLN-zero (eps = 0): make it informative
        for p in m.diffloss.net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m.eval()


def official_loop(model, labels, seeds, num_iter, cfg=1.0, cfg_schedule="linear", temperature=1.0):
    """MAR's ``sample_tokens`` loop written as the official code runs it (masks by order, xor of masks, rows
    [cond; uncond], ``nonzero`` indexing), with vgen's per-seed orders and noise."""
    B, L, C = len(seeds), model.seq_len, model.token_channels
    S = model.num_sampling_steps
    orders, noise = generation_orders(seeds, L), token_noise(seeds, L, S, C)
    mask, tokens = torch.ones(B, L), torch.zeros(B, L, C)
    emb = model.class_emb(labels)
    if cfg != 1.0:
        emb = torch.cat([emb, model.fake_latent.repeat(B, 1)])
    for step in range(num_iter):
        x, m = (torch.cat([tokens, tokens]), torch.cat([mask, mask])) if cfg != 1.0 else (tokens, mask)
        z = model.enc_dec(x, m, emb)
        mask_len = math.floor(L * math.cos(math.pi / 2 * (step + 1) / num_iter))
        mask_len = max(1, min(int(mask[0].sum()) - 1, mask_len))
        mask_next = torch.zeros(B, L).scatter(-1, orders[:, :mask_len], 1.0).bool()
        to_pred = mask.bool() if step >= num_iter - 1 else mask.bool() ^ mask_next
        idx = to_pred.nonzero(as_tuple=True)
        zc = torch.cat([z[:B][idx], z[B:][idx]]) if cfg != 1.0 else z[idx]
        cfg_iter = 1 + (cfg - 1) * (L - mask_len) / L if cfg_schedule == "linear" else cfg
        out = model.diffloss.sample(zc, noise.start[idx], noise.steps[idx].transpose(0, 1), temperature, cfg_iter)
        tokens[idx] = out.token
        mask = mask_next.float()
    return tokens


@pytest.mark.parametrize("cfg,sched", [(1.0, "constant"), (3.0, "linear"), (2.0, "constant")])
def test_mar_sampler_matches_official_loop(tiny_mar, cfg, sched):
    labels = torch.tensor([0, 3])
    tokens, _ = sample(tiny_mar, labels, "mar", seed=11, num_iter=5, cfg_scale=cfg, cfg_schedule=sched,
                       temperature=0.9)
    with torch.no_grad():
        ref = official_loop(tiny_mar, labels, [11, 12], 5, cfg, sched, 0.9)
    # relative: the random head's tokens are ~1e4 (see the conformance README) and the loop's head batches differ
    torch.testing.assert_close(tokens, ref, atol=1e-3, rtol=1e-4)


def test_mar_sampler_shapes_and_step_map(tiny_mar):
    L, C = tiny_mar.seq_len, tiny_mar.token_channels
    tokens, stats = sample(tiny_mar, [0, 1, 2], "mar", seed=0, num_iter=4)
    assert tokens.shape == (3, L, C) and tokens.dtype == torch.float32 and torch.isfinite(tokens).all()
    assert stats["forward_passes"] == 4 and stats["tokens"] == 3 * L
    assert stats["seconds"] >= stats["head_seconds"] >= 0 and stats["transformer_seconds"] >= 0
    sm = stats["step_map"]
    assert sm.shape == (3, L) and int(sm.min()) == 0 and int(sm.max()) == 3
    # MAR's cosine schedule for L = 16, 4 passes: 14, 11, 6 unknown after passes 0..2 -> 2, 3, 5, 6 tokens
    for row in sm:
        assert torch.bincount(row, minlength=4).tolist() == [2, 3, 5, 6]
    for n in (1, L):  # one pass draws everything; L passes draw one token each
        _, st = sample(tiny_mar, [1], "mar", seed=0, num_iter=n)
        counts = torch.bincount(st["step_map"][0], minlength=n)
        assert st["forward_passes"] == n and len(counts) == n and int(counts.min()) >= 1 and int(counts.sum()) == L


@pytest.fixture
def one_thread():
    """Same bytes in any batch holds at a fixed thread count: multi-threaded BLAS splits sums by problem size."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def rows_batch_invariant() -> bool:
    """Is a row of a float32 product the same bytes alone as in a batch, at one thread? Not with MKL's default
    kernels on Intel's AVX-512 (one row takes another kernel); MKL_CBWR=AVX2,STRICT makes it so there."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 32, generator=g), torch.randn(6, 32, generator=g)
    full = torch.nn.functional.linear(x, w)
    return all(torch.equal(torch.nn.functional.linear(x[:m], w), full[:m]) for m in (1, 2, 3))


@pytest.mark.slow  # quick loop: kept under 3 minutes
@pytest.mark.parametrize("cfg", [1.0, 2.5])
def test_mar_sampler_batch_invariance(tiny_mar, cfg, one_thread, request):
    """Continuous tokens are the same bytes alone, in a batch and in chunks, given batch-invariant products. On a host
    whose BLAS computes a row alone otherwise (MKL on Intel's AVX-512), the check runs in a process with MKL's
    strict reproducible mode (docs/scale-out.md)."""
    if not rows_batch_invariant():
        import inspect
        import os
        import subprocess
        import sys
        premise = ("this host's BLAS computes a row alone otherwise than in a batch even in MKL's strict mode (MKL on "
                   "AMD's processors, AVX-512 and AVX2, ignores MKL_CBWR's AVX2 branch): continuous tokens cannot be "
                   "batch-invariant here")
        if os.environ.get("MKL_CBWR"):
            pytest.skip(premise)
        strict = {**os.environ, "MKL_CBWR": "AVX2,STRICT", "PYTEST_ADDOPTS": ""}
        check = (f"import torch\ntorch.set_num_threads(1)\n{inspect.getsource(rows_batch_invariant)}\n"
                 "raise SystemExit(0 if rows_batch_invariant() else 3)")
        if subprocess.run([sys.executable, "-c", check], env=strict, timeout=120).returncode == 3:
            pytest.skip(premise)  # known before the test's own process (about 10 s here) is started
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider",
                            request.node.nodeid], cwd=request.config.rootpath, capture_output=True, text=True,
                           env=strict, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:]
        if " skipped" in r.stdout and " passed" not in r.stdout:
            pytest.skip(premise)
        return
    kw = dict(num_iter=4, cfg_scale=cfg, cfg_schedule="linear")
    labels = [2, 0, 3]
    batch, st = sample(tiny_mar, labels, "mar", seed=7, **kw)
    for i, lab in enumerate(labels):
        alone, st1 = sample(tiny_mar, [lab], "mar", seed=7 + i, **kw)
        assert torch.equal(alone[0], batch[i]) and torch.equal(st1["step_map"][0], st["step_map"][i])
    chunked, _ = sample(tiny_mar, [2, 0, 3], "mar", seed=7, batch_size=2, **kw)
    assert torch.equal(chunked, batch)


def test_mar_sampler_seeds(tiny_mar):
    a, _ = sample(tiny_mar, [1, 1], "mar", seed=3, num_iter=4)
    b, _ = sample(tiny_mar, [1, 1], "mar", seed=3, num_iter=4)
    assert torch.equal(a, b)
    assert not torch.equal(a[0], a[1])  # same class, different seeds
    c, _ = sample(tiny_mar, [1], "mar", seed=3, num_iter=4, last_noise=True)
    assert not torch.equal(a[0], c[0])
    d, _ = sample(tiny_mar, [1], "mar", seed=3, num_iter=4, clip_x0=4.0)  # reaches the head
    assert not torch.equal(a[0], d[0]) and float(d.abs().max()) < float(a[0].abs().max())


def test_mar_sampler_option_errors(tiny_mar):
    L = tiny_mar.seq_len
    for n in (0, L + 1):
        with pytest.raises(VGenError, match="num_iter") as e:
            sample(tiny_mar, [0], "mar", num_iter=n)
        assert "\n" not in str(e.value)
    with pytest.raises(VGenError, match="top_k"):
        get_sampler("mar", model=tiny_mar, top_k=5)
    with pytest.raises(VGenError):
        sample(tiny_mar, [0], "mar", num_iter=4, temperature=0.0)
    with pytest.raises(VGenError, match="class id"):
        sample(tiny_mar, [TINY["class_num"]], "mar", num_iter=4)


def test_mar_model_training_and_masks(tiny_mar):
    m = build("mar", **{**TINY, "patch_size": 2, "vae_embed_dim": 1})
    x = torch.randn(2, 1, 4, 4)
    assert torch.equal(m.unpatchify(m.patchify(x)), x) and m.patchify(x).shape == (2, m.seq_len, 4)
    m.train()
    loss = m(x, torch.tensor([0, 1]))
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss) and m.z_proj.weight.grad is not None
    ratios = [m.mask_ratio() for _ in range(200)]
    assert min(ratios) >= m.config.mask_ratio_min and max(ratios) <= 1.0
    with pytest.raises(VGenError, match="same number"):
        tiny_mar.conditions(torch.zeros(2, 16, 4), torch.tensor([[1.0] * 3 + [0.0] * 13, [1.0] * 4 + [0.0] * 12]),
                            torch.tensor([0, 1]))


@pytest.mark.parametrize("dim,depth,heads,dd,dw,name", [(768, 12, 12, 6, 1024, "mar_base"),
                                                        (1280, 20, 16, 12, 1536, "mar_huge")])
def test_mar_released_sizes_need_no_config(dim, depth, heads, dd, dw, name):
    """A released checkpoint's shapes give its whole config (heads and the 1e-6 norm eps of mar_base/large/huge)."""
    from vgen.models.loading import preset_name
    from vgen.models.mar import MAR, MARConfig, infer_mar
    cfg = MARConfig(encoder_embed_dim=dim, encoder_depth=depth, encoder_num_heads=heads, decoder_embed_dim=dim,
                    decoder_depth=depth, decoder_num_heads=heads, diffloss_d=dd, diffloss_w=dw, norm_eps=1e-6)
    with torch.device("meta"):
        sd = MAR(cfg).state_dict()
    assert sd["class_emb.weight"].shape[0] == 1000
    inferred = infer_mar(sd)
    assert preset_name("mar", inferred) == name
    assert MARConfig(**inferred) == cfg


def test_a_known_unknown_count_drops_tokens_without_a_host_read(tiny_mar):
    """enc_dec with the schedule's count of unknown tokens: the same conditions, bit for bit, as with the count read
    from the mask (and the same as boolean indexing, the official form), and no host read of the mask (a GPU sync
    per pass before)."""
    from test_host_syncs import HostTrips
    torch.manual_seed(0)
    B, L, C = 4, tiny_mar.seq_len, tiny_mar.token_channels
    tokens = torch.randn(B, L, C)
    order = torch.rand(B, L).argsort(-1)
    mask = torch.zeros(B, L).scatter(-1, order[:, : L // 3], 1.0)
    emb = tiny_mar.class_embedding(torch.arange(B) % 3)
    with torch.no_grad():
        read = tiny_mar.enc_dec(tokens, mask, emb)
        trips = HostTrips()
        with trips:
            known = tiny_mar.enc_dec(tokens, mask, emb, unknown=L // 3)
        kept = torch.cat([torch.ones(B, tiny_mar.buffer_size, dtype=torch.bool), ~mask.bool()], 1)
        assert torch.equal(tiny_mar.kept_positions(mask, L // 3), kept.nonzero()[:, 1].reshape(B, -1))
    assert torch.equal(read, known)
    assert sum(c["reads"] for c in trips.intervals) == 0
