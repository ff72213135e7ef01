"""Speculative Coupled Decoding: the counter-based Gumbel noise, identity with ``ar draw=gumbel`` (Gumbel coupling),
exactness of the maximal coupling, and the options every speculative sampler shares."""
import numpy as np
import pytest
import torch
from exact import chi2_p, counts_of, exact_joint, toward
from scipy import stats

from vgen.errors import VGenError
from vgen.kernels.gumbel import gumbel_draw, gumbel_keys, gumbel_noise
from vgen.kernels.verify import maximal_coupling
from vgen.samplers import sample

OPTS = dict(cfg_scale=2.0, top_k=3, temperature=0.9)
N = 10_000  # enough to reject a law a tenth of the way to the unguided one (exact.toward)


@pytest.fixture(scope="module")
def micro(micro_gpt):
    _, joint = exact_joint(micro_gpt, 1, 2.0, top_k=3, temperature=0.9)
    _, unguided = exact_joint(micro_gpt, 1, 1.0, top_k=3, temperature=0.9)
    return micro_gpt, joint.numpy(), unguided.numpy()


def test_gumbel_noise_is_a_function_of_seed_position_and_token():
    """Noise of (seed, position, token) never depends on the batch, the other positions asked for, or the device
    call; it is standard Gumbel; different positions and seeds are independent."""
    keys = gumbel_keys([5, 9, 5], 8)
    assert keys.dtype == torch.long and keys.shape == (3, 8) and torch.equal(keys[0], keys[2])
    assert int(keys.min()) >= 0 and int(keys.max()) < 2 ** 32
    assert torch.equal(gumbel_keys([9], 3)[0], keys[1, :3])  # a position's key: its seed's, whatever the length
    g = gumbel_noise(keys, 50)
    assert g.shape == (3, 8, 50) and g.dtype == torch.float32 and torch.isfinite(g).all()
    assert torch.equal(g[0], g[2])                # same seed: same noise
    assert not torch.equal(g[0, 1], g[1, 1])      # another seed
    assert not torch.equal(g[0, 0], g[0, 1])      # another position
    big = gumbel_noise(gumbel_keys(range(64), 32), 256).flatten().double()
    assert stats.kstest(big.numpy()[::7], "gumbel_r").pvalue > 1e-3
    k = gumbel_keys(range(4000), 2)
    a, b = gumbel_noise(k[:, 0], 4)[:, 0], gumbel_noise(k[:, 1], 4)[:, 0]
    assert abs(np.corrcoef(a.numpy(), b.numpy())[0, 1]) < 0.05
    c, d = gumbel_noise(k[:, 0], 4)[:, 1], gumbel_noise(k[:, 0], 4)[:, 2]  # neighbouring tokens of one position
    assert abs(np.corrcoef(c.numpy(), d.numpy())[0, 1]) < 0.05


def test_gumbel_draw_follows_p_and_never_draws_zero_mass():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0], dtype=torch.float64)
    n = 40_000
    keys = gumbel_keys(range(n), 4)
    t = gumbel_draw(p.expand(n, 5), keys[:, 3])
    counts = torch.bincount(t, minlength=5).numpy()
    assert counts[4] == 0
    assert stats.chisquare(counts[:4], p[:4].numpy() * n).pvalue > 1e-3
    assert stats.chisquare(counts[:4], np.full(4, n / 4)).pvalue < 1e-6  # power: not uniform
    t2 = gumbel_draw(p.expand(n, 5), keys[:, 2])  # another position: an independent draw
    same = float((t == t2).double().mean())
    assert same == pytest.approx(float((p ** 2).sum()), abs=0.01)
    # the draw is argmax(log p + g) with the noise gumbel_noise gives
    q = torch.softmax(torch.randn(6, 30, dtype=torch.float64), -1)
    kk = gumbel_keys(range(6), 30)
    assert torch.equal(gumbel_draw(q, kk[:, 7]), (q.log() + gumbel_noise(kk[:, 7], 30)).argmax(-1))


def test_maximal_coupling_has_law_p_and_keeps_the_draft_when_it_can():
    g = torch.Generator().manual_seed(0)
    V, n = 6, 60_000
    q = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.1, 0.0], dtype=torch.float64)
    p = torch.tensor([0.1, 0.2, 0.3, 0.2, 0.0, 0.2], dtype=torch.float64)
    x = torch.multinomial(q, n, replacement=True, generator=g)
    y = maximal_coupling(p.expand(n, 1, V), q.expand(n, 1, V), x[:, None], torch.rand(n, 1, generator=g),
                         torch.rand(n, 1, generator=g))[:, 0]
    counts = torch.bincount(y, minlength=V).numpy()
    assert counts[4] == 0 and stats.chisquare(counts[p > 0], p[p > 0].numpy() * n).pvalue > 1e-3
    assert counts[5] > 0.18 * n  # power: q puts no mass there, p 0.2
    kept = float((y == x).double().mean())
    assert kept == pytest.approx(float(torch.minimum(p, q).sum()), abs=0.01)  # the most any coupling keeps


@pytest.mark.parametrize("init", ["vertical", pytest.param("random", marks=pytest.mark.slow),
                                  pytest.param("sample", marks=pytest.mark.slow)])
def test_scd_exact_maximal_coupling(micro, init):
    """SCD-MC is lossless: 10k batched samples follow the enumerated joint (CFG, top-k, temperature), the same counts
    reject the unguided joint and one a tenth of the way to it (power), and no zero-probability image appears."""
    m, joint, unguided = micro
    tokens, st = sample(m, [1] * N, "scd", coupling="maximal", seed=0, window=3, init=init, **OPTS)
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, joint) > 1e-3
    assert chi2_p(counts, unguided) < 1e-6 and chi2_p(counts, toward(joint, unguided)) < 1e-6
    assert counts[joint == 0].sum() == 0
    assert st["accepted_per_step"] > 1.0


@pytest.mark.slow
def test_scd_exact_gumbel_coupling(micro):
    """SCD-GS: its samples are ar's with draw=gumbel (identity, in float64 so no near-tie can flip), and those follow
    the enumerated joint; the unguided joint is rejected (power). The identity is checked sample by sample on the
    first 5k seeds (sample i draws with seed i in any batch; test_scd_gumbel_gives_ar_gumbel_tokens checks it at
    every window, batch size and init), the law on all 10k (with the power to reject a law a tenth of the way to
    the unguided one)."""
    m, joint, unguided = micro
    m64 = type(m)(m.config).double().eval()
    m64.load_state_dict(m.state_dict())
    ar, _ = sample(m64, [1] * N, "ar", draw="gumbel", seed=0, **OPTS)
    scd, st = sample(m64, [1] * 5_000, "scd", seed=0, window=3, init="sample", **OPTS)
    assert torch.equal(scd, ar[:5_000]) and st["accepted_per_step"] > 1.0
    counts = counts_of(ar, 4)
    assert chi2_p(counts, joint) > 1e-3
    assert chi2_p(counts, unguided) < 1e-6 and chi2_p(counts, toward(joint, unguided)) < 1e-6
    assert counts[joint == 0].sum() == 0


@pytest.fixture
def tiny64(tiny_gpt):
    return tiny_gpt.double()


@pytest.mark.parametrize("init", ["vertical"] + [pytest.param(i, marks=pytest.mark.slow)
                                                 for i in ("random", "horizontal", "sample")])
def test_scd_gumbel_gives_ar_gumbel_tokens(tiny64, init):
    """Same seed and settings: the same tokens as ar draw=gumbel, at every window, batch size and init, with
    continuous batching and with the cost-aware window (several widths in one run)."""
    labels = [0, 1, 2, 3, 1, 2]
    kw = dict(cfg_scale=2.0, top_k=10, temperature=0.9)
    ar, _ = sample(tiny64, labels, "ar", seed=11, draw="gumbel", **kw)
    other, _ = sample(tiny64, labels, "ar", seed=11, **kw)
    assert not torch.equal(ar, other)  # the Gumbel draw is another (equally exact) draw
    for window, bs in [(2, 6), (4, 1), (16, 4), ("auto", 6), ("auto", 2)]:
        extra = dict(costs="1:1,2:1.1,4:1.3,8:1.7,16:2.6") if window == "auto" else {}
        t, st = sample(tiny64, labels, "scd", seed=11, window=window, init=init, batch_size=bs, **kw, **extra)
        assert torch.equal(t, ar), (window, bs)
        assert st["accepted_per_step"] >= 1.0


@pytest.mark.slow
def test_scd_gumbel_identity_compiled(tiny_gpt):
    kw = dict(cfg_scale=2.0, top_k=10, cfg_interval=5)
    ar, _ = sample(tiny_gpt, [0, 1, 2], "ar", seed=2, draw="gumbel", **kw)  # eager: one compile is the test's cost
    t, _ = sample(tiny_gpt, [0, 1, 2], "scd", seed=2, window=5, init="vertical", compile=True, **kw)
    assert torch.equal(t, ar)


def test_scd_gumbel_identity_with_a_prefix(tiny_gpt):
    kw = dict(cfg_scale=2.0, top_k=10, cfg_interval=5)
    ar, _ = sample(tiny_gpt, [0, 1, 2], "ar", seed=2, draw="gumbel", **kw)
    prefix = ar[:, :5]
    a, _ = sample(tiny_gpt, [0, 1, 2], "ar", seed=2, draw="gumbel", prefix=prefix, **kw)
    s, _ = sample(tiny_gpt, [0, 1, 2], "scd", seed=2, window=4, prefix=prefix, **kw)
    assert torch.equal(a, s) and torch.equal(a, ar)  # the noise belongs to positions: a continuation keeps them


def test_scd_falls_back_to_ar_gumbel(tiny_gpt):
    """Where no width can pay, window=auto runs AR's loop, with the Gumbel draw: still the same tokens."""
    kw = dict(cfg_scale=2.0, top_k=10)
    t, st = sample(tiny_gpt, [0, 1], "scd", seed=4, costs="1:1,2:50,4:90", **kw)
    ar, _ = sample(tiny_gpt, [0, 1], "ar", seed=4, draw="gumbel", **kw)
    assert st["mean_window"] == 1 and torch.equal(t, ar)


def test_scd_on_a_video_grid_with_temporal_drafts():
    from vgen.models import build
    torch.manual_seed(3)
    m = build("video-gpt", dim=32, n_layer=1, n_head=2, vocab_size=16, num_classes=2, latent_shape=(3, 2, 3)).eval()
    torch.nn.init.normal_(m.output.weight, std=0.5)
    m = m.double()
    kw = dict(cfg_scale=1.5, top_k=6)
    ar, _ = sample(m, [0, 1, 1], "ar", seed=0, draw="gumbel", **kw)
    for coupling in ("gumbel", "maximal"):
        t, st = sample(m, [0, 1, 1], "scd", seed=0, window=6, init="temporal", coupling=coupling, **kw)
        assert t.shape == ar.shape and st["forward_passes"] <= 18 and (t < 16).all()
        if coupling == "gumbel":
            assert torch.equal(t, ar)


def test_relaxed_rules_take_maximal_coupling(tiny_gpt):
    cb = torch.nn.functional.normalize(torch.randn(32, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    for name in ("gsd", "lantern", "sjd"):
        a, st = sample(tiny_gpt, [0, 1, 2], name, seed=1, window=4, coupling="maximal", codebook=cb, cfg_scale=2.0)
        b, _ = sample(tiny_gpt, [0, 1, 2], name, seed=1, window=4, coupling="maximal", codebook=cb, cfg_scale=2.0,
                      batch_size=1)
        assert torch.equal(a, b) and st["accepted_per_step"] > 1
        with pytest.raises(VGenError, match="coupling=gumbel does not fit.*sampler=scd"):
            sample(tiny_gpt, [0], name, coupling="gumbel", codebook=cb)


@pytest.mark.parametrize("opts,match", [(dict(coupling="exact"), "coupling must be one of"),
                                        (dict(coupling="independent"), "independent does not fit.*gumbel or maximal"),
                                        (dict(window=1), "window"), (dict(max_window=1), "max_window")])
def test_scd_bad_options_fail_before_work(tiny_gpt, opts, match):
    with pytest.raises(VGenError, match=match):
        sample(tiny_gpt, [0], "scd", **opts)
    with pytest.raises(VGenError, match="draw must be one of inverse-cdf, gumbel"):
        sample(tiny_gpt, [0], "ar", draw="gumbel-max")


def test_scd_auto_window_is_one_width_per_job(tiny_gpt, tmp_path, monkeypatch):
    """window=auto for scd: one width for the job, the best tokens per second from the pass costs and the calibrated
    tokens per pass (cached, the same for every job); its tokens are the fixed window's (and ar draw=gumbel's)."""
    from vgen.samplers.scd import SCDSampler
    from vgen.samplers.speculative.tables import pass_tokens
    from vgen.samplers.speculative.widths import best_job_width
    assert best_job_width({1: 1.0, 2: 1.1, 4: 1.4}, {2: 1.5, 4: 2.2}) == 4      # 2.2 / 1.4 > 1.5 / 1.1 > 1
    assert best_job_width({1: 1.0, 2: 1.6, 4: 2.5}, {2: 1.5, 4: 2.2}) == 1      # no width beats a plain step
    assert best_job_width({1: 1.0, 2: 1.4, 4: 1.6}, {2: 1.5, 4: 1.9}) == 1     # 1.19 at best: inside the margin
    assert best_job_width({1: 1.0, 2: 1.4, 4: 1.6}, {2: 1.5, 4: 1.9}, margin=1.0) == 4
    monkeypatch.setenv("VGEN_CACHE", str(tmp_path))
    kw = dict(cfg_scale=2.0, top_k=10)
    costs = "1:1,2:1.05,4:1.2,8:1.5,16:2.5"
    s = SCDSampler(costs=costs, **kw)
    s.validate(tiny_gpt)
    s.options.compile = False
    tokens = pass_tokens(s, tiny_gpt, [2, 4, 8, 16])
    assert set(tokens) == {2, 4, 8, 16} and all(t >= 1 for t in tokens.values())
    calls = []
    real = SCDSampler._run
    monkeypatch.setattr(SCDSampler, "_run", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    assert pass_tokens(s, tiny_gpt, [2, 4, 8, 16]) == tokens and not calls  # cached
    monkeypatch.setattr(SCDSampler, "_run", real)
    w = best_job_width({1: 1, 2: 1.05, 4: 1.2, 8: 1.5, 16: 2.5}, tokens)
    auto, st = sample(tiny_gpt, [0, 1, 2, 3], "scd", seed=3, costs=costs, batch_size=3, **kw)
    ar, _ = sample(tiny_gpt, [0, 1, 2, 3], "ar", seed=3, draw="gumbel", **kw)
    assert torch.equal(auto, ar)
    if w > 1:
        fixed, sf = sample(tiny_gpt, [0, 1, 2, 3], "scd", seed=3, window=w, batch_size=3, **kw)
        assert st["mean_window"] == w and st["forward_passes"] == sf["forward_passes"]
    else:
        assert st["mean_window"] == 1


@pytest.mark.parametrize("timed, want", [((1, "timed"), (1, "job, timed")), ((8, "cached"), (8, "job, timed")),
                                         (None, (8, "job"))])
def test_scd_job_width_is_timed_against_ar_before_the_job_runs_it(tiny_gpt, monkeypatch, timed, want):
    """The job rule's width runs only where it beat AR's own loop timed whole (a compiled AR loop can beat what the
    pass-cost table promised): AR's loop where it did not; the job rule's own choice where the job is too small to
    repay the timing (timed_width gives None)."""
    import vgen.samplers.speculative.sampler as spec
    from vgen.samplers.scd import SCDSampler
    from vgen.samplers.speculative.widths import time_any_job
    asked = []
    monkeypatch.setattr(SCDSampler, "job_width", lambda self, model, b, codebook=None, given="": 8)
    monkeypatch.setattr(spec, "timed_width", lambda sampler, model, widths, batch, run, **k: asked.append(widths)
                        or timed)
    kw = dict(cfg_scale=2.0, top_k=10, compile=False)
    with time_any_job():
        tokens, st = sample(tiny_gpt, [0, 1, 2, 3], "scd", seed=3, batch_size=2, **kw)
    assert asked == [[8]] and (st["window"], st["window_rule"]) == want
    ar, _ = sample(tiny_gpt, [0, 1, 2, 3], "ar", seed=3, draw="gumbel", **kw)
    assert torch.equal(tokens, ar)  # coupled: the same tokens whichever width ran
