"""Speculative samplers (SJD, GSD, LANTERN): exactness, drift, ragged batches, options, API and CLI."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from exact import chi2_p, conditional_tv, counts_of, exact_joint, toward, tv
from guards import needs_zoo

import vgen
from vgen.errors import VGenError
from vgen.kernels.neighbours import latent_neighbours
from vgen.kernels.sampling import sample_from_probs
from vgen.kernels.verify import correction
from vgen.samplers import sample
from vgen.samplers.speculative.jacobi import INITS
from vgen.samplers.speculative.rules import LanternRule

OPTS = dict(cfg_scale=2.0, top_k=3, temperature=0.9)
N = 10_000  # exactness: enough to reject a law a tenth of the way to the unguided one (exact.toward)
DRIFT_N = 20_000  # the relaxed samplers' drift: a TV noise floor below theirs, prefixes seen 400 times


def _codebook(V, seed=0):
    return F.normalize(torch.randn(V, 8, generator=torch.Generator().manual_seed(seed)), dim=-1)


@pytest.fixture(scope="module")
def micro(micro_gpt):
    _, joint = exact_joint(micro_gpt, 1, 2.0, top_k=3, temperature=0.9)
    _, unguided = exact_joint(micro_gpt, 1, 1.0, top_k=3, temperature=0.9)
    return micro_gpt, joint.numpy(), unguided.numpy()


# the quick loop keeps random drafts with the proposal's law; every other init and law in the full suite
@pytest.mark.parametrize("init,window,fresh_q", [
    pytest.param(i, 3, "proposal", marks=[pytest.mark.slow] if i != "random" else [])
    for i in INITS if i != "temporal"] + [pytest.param("random", 2, "onehot", marks=pytest.mark.slow),
                                          pytest.param("sample", 6, "onehot", marks=pytest.mark.slow)])
def test_sjd_matches_exact_distribution(micro, init, window, fresh_q):
    """Lossless: 10k batched SJD samples follow the enumerated joint (CFG, top-k, temperature on); the same
    counts reject the unguided distribution and one a tenth of the way to it (power), and no zero-probability image
    ever appears."""
    m, joint, unguided = micro
    tokens, st = sample(m, [1] * N, "sjd", seed=0, window=window, init=init, fresh_q=fresh_q, **OPTS)
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, joint) > 1e-3
    assert chi2_p(counts, unguided) < 1e-6 and chi2_p(counts, toward(joint, unguided)) < 1e-6
    assert counts[joint == 0].sum() == 0
    assert st["accepted_per_step"] > 1.0 and 0 < st["acceptance_rate"] <= 1


@pytest.mark.slow
def test_sjd_exact_on_a_3x3_grid_with_vertical_drafts():
    from vgen.models import build
    torch.manual_seed(5)
    m = build("gpt", dim=16, n_layer=1, n_head=2, vocab_size=3, num_classes=2, block_size=9).eval()
    torch.nn.init.normal_(m.output.weight, std=1.0)
    opts = dict(cfg_scale=1.5, top_k=2)
    _, joint = exact_joint(m, 0, 1.5, top_k=2)
    _, wrong = exact_joint(m, 0, 1.0, top_k=2)
    tokens, st = sample(m, [0] * N, "sjd", seed=1, window=4, init="vertical", **opts)
    counts = counts_of(tokens, 3)
    assert chi2_p(counts, joint.numpy()) > 1e-3
    assert chi2_p(counts, wrong.numpy()) < 1e-6 and chi2_p(counts, toward(joint, wrong)) < 1e-6
    assert st["accepted_per_step"] > 1.0


@pytest.mark.slow
def test_sjd_exact_on_a_video_grid_with_temporal_drafts():
    """init=temporal (copy the token at the same (h, w) in the previous frame) stays lossless: a (2, 2, 2) video
    GPT enumerated exactly; the same counts reject the unguided law (power)."""
    from vgen.models import build
    torch.manual_seed(3)
    m = build("video-gpt", dim=16, n_layer=1, n_head=2, vocab_size=3, num_classes=2, latent_shape=(2, 2, 2)).eval()
    torch.nn.init.normal_(m.output.weight, std=1.0)
    opts = dict(cfg_scale=1.5, top_k=2)
    _, joint = exact_joint(m, 0, 1.5, top_k=2)
    _, wrong = exact_joint(m, 0, 1.0, top_k=2)
    tokens, st = sample(m, [0] * 20_000, "sjd", seed=2, window=5, init="temporal", **opts)
    counts = counts_of(tokens, 3)
    assert chi2_p(counts, joint.numpy()) > 1e-3
    assert chi2_p(counts, wrong.numpy()) < 1e-6
    assert counts[joint.numpy() == 0].sum() == 0
    assert st["accepted_per_step"] > 1.0


def test_temporal_drafts_copy_the_previous_frame():
    """Drafts come from the same (h, w) one frame back (vertical in the first frame), across window sizes that
    span more than a frame; image models refuse init=temporal with the fix."""
    from vgen.models import build
    from vgen.samplers.speculative.jacobi import fresh_drafts
    grid = (3, 2, 2)
    tokens = torch.arange(100, 112)[None]  # token value = 100 + raster index
    p = torch.full((1, 200), 1 / 200)
    for last in range(0, 11):
        D = 11 - last
        f, q = fresh_drafts(tokens, torch.tensor([last]), p, torch.rand(1, D), init="temporal", fresh_q="proposal",
                            grid=grid)
        for j, x in enumerate(f[0].tolist()):
            t = last + 1 + j
            src = t - 4 * -(-(j + 1) // 4)
            if src < 0:  # first frame: vertical, then the left token
                src = t - 2 * -(-(j + 1) // 2)
                src = src if src >= 0 else last
            assert x == 100 + src, (last, j)
        assert torch.equal(q, F.one_hot(f, 200).float())
    img = build("gpt", dim=16, n_layer=1, n_head=2, vocab_size=8, num_classes=2, block_size=4)
    with pytest.raises(VGenError, match="init=temporal copies drafts from the previous frame.*init=vertical"):
        sample(img, [0], "sjd", init="temporal")


@pytest.mark.slow
def test_relaxed_samplers_report_drift_and_stay_in_support(micro, capsys):
    """GSD and LANTERN are not lossless: measure their distance from the exact distribution. LANTERN's
    per-token drift stays within delta; neither emits an image the target gives zero probability."""
    m, joint, _ = micro
    cb = _codebook(4)
    sjd_tokens, _ = sample(m, [1] * DRIFT_N, "sjd", seed=0, window=3, **OPTS)
    base = tv(counts_of(sjd_tokens, 4), joint)  # sampling noise floor at this N
    report = {"sjd": base}
    for name, extra in [("gsd", dict(d_threshold=4.0)), ("lantern", dict(delta=0.2))]:
        tokens, st = sample(m, [1] * DRIFT_N, name, seed=0, window=3, codebook=cb, **extra, **OPTS)
        counts = counts_of(tokens, 4)
        assert counts[joint == 0].sum() == 0
        report[name] = tv(counts, joint)
        assert report[name] > base  # the relaxation really moves mass ...
        if name == "lantern":
            mean_tv, worst = conditional_tv(m, tokens, 1, 2.0, top_k=3, temperature=0.9)
            report["lantern_per_token_mean"], report["lantern_per_token_max"] = mean_tv, worst
            assert mean_tv <= 0.2 + 0.02  # ... within its budget per token (+ sampling noise)
    with capsys.disabled():
        print("\njoint TV from exact (20k samples):", {k: round(v, 4) for k, v in report.items()})


def _naive_lantern(nbr, delta, lam):
    def rule(p, q, x, px, qx):
        cs = p.gather(-1, nbr[x].long()).cumsum(-1)
        moved = (cs * (cs <= delta)).amax(-1)
        return ((px + moved) / qx).clamp_max(1.0)
    return rule


@pytest.mark.parametrize("rule,bounded", [(LanternRule, True), (_naive_lantern, False)])
def test_lantern_keeps_each_token_within_delta_for_any_draft_distribution(rule, bounded):
    """One verification step, 400k times: the output distribution of a token stays within TV delta of p
    even for a full (non one-hot) draft distribution q; the uncapped rule overshoots here."""
    delta, n = 0.1, 400_000
    p = torch.tensor([0.45, 0.45, 0.025, 0.025, 0.025, 0.025, 0.0, 0.0])
    q = torch.full((8,), 1 / 8)
    nbr = torch.tensor([[1, 2, 3, 4], [0, 2, 3, 4], [3, 4, 5, 0], [4, 5, 2, 0],
                        [5, 2, 3, 0], [2, 3, 4, 0], [7, 0, 1, 2], [6, 0, 1, 2]])
    g = torch.Generator().manual_seed(0)
    u = torch.rand(n, 3, generator=g)
    P, Q = p.expand(n, 1, 8), q.expand(n, 1, 8)
    x = sample_from_probs(Q[:, 0], u[:, 0])[:, None]
    px, qx = p[x], q[x]
    a = rule(nbr, delta, 0.0)(P, Q, x, px, qx)
    a = torch.where(px > 0, a, torch.zeros_like(a))
    k = (u[:, 1:2] < a).long().sum(1)
    fix = correction(torch.cat([P, P], 1), Q, k, u[:, 2])
    out = torch.where(k == 1, x[:, 0], fix)
    d = tv(np.bincount(out.numpy(), minlength=8), p.numpy())
    assert (p[out] > 0).all()
    if bounded:
        assert d <= delta + 0.005
    else:
        assert d > delta + 0.05


def test_latent_neighbours_are_nearest_others_and_cached():
    cb = _codebook(50, seed=2)
    nbr = latent_neighbours(cb, 7)
    d = torch.cdist(cb, cb)
    d.fill_diagonal_(float("inf"))
    assert torch.equal(nbr.long(), d.topk(7, largest=False).indices) and nbr.dtype == torch.int32
    assert latent_neighbours(cb.clone(), 7) is nbr  # keyed by content
    assert latent_neighbours(cb, 500).shape == (50, 49)  # k clipped to V - 1


@pytest.mark.parametrize("name", ["sjd", "gsd", "lantern"])
def test_batch_invariance_ragged_progress_and_step_map(tiny_gpt, name):
    labels = [0, 1, 2, 3, 1]
    kw = dict(window=4, init="vertical", cfg_scale=2.0, top_k=10, codebook=_codebook(32))
    batch, st = sample(tiny_gpt, labels, name, seed=7, **kw)
    for i, lab in enumerate(labels):
        alone, _ = sample(tiny_gpt, [lab], name, seed=7 + i, **kw)
        assert torch.equal(alone[0], batch[i])
    smap = st["step_map"]
    L = tiny_gpt.seq_len
    assert smap.shape == (5, L) and (smap[:, 0] == 0).all()
    assert (smap[:, 1:] >= smap[:, :-1]).all()  # decided in raster order
    passes = smap[:, -1] + 1  # each sample's own number of passes
    assert int(passes.max()) == st["forward_passes"]
    assert st["accepted_per_step"] == pytest.approx(float((L / passes.double()).mean()))
    # several tokens per pass, at per-sample positions
    assert int(passes.min()) < L
    # continuous batching: 2 slots, finished samples replaced by the next: same samples, same step maps
    refilled, st2 = sample(tiny_gpt, labels, name, seed=7, batch_size=2, **kw)
    assert torch.equal(refilled, batch) and torch.equal(st2["step_map"], smap)
    assert st2["accepted_per_step"] == pytest.approx(st["accepted_per_step"])
    # one pass per iteration plus one prefill pass per refill round, never more than chunked batches need
    chunked = sum(int((smap[i:i + 2, -1] + 1).max()) for i in range(0, 5, 2))
    assert st2["forward_passes"] <= chunked


def test_window_covers_the_whole_image(tiny_gpt):
    """A window longer than what is left (or than the image) never writes past the end."""
    a, st = sample(tiny_gpt, [0, 1], "sjd", seed=3, window=40, top_k=10)
    assert a.shape == (2, 16) and a.max() < 32 and st["forward_passes"] <= 16


@pytest.mark.parametrize("name,opts,match", [
    ("sjd", dict(window=1), "window"), ("sjd", dict(init="diagonal"), "init must be one of"),
    ("sjd", dict(fresh_q="x"), "fresh_q"), ("gsd", dict(group_size=0), "group_size"),
    ("lantern", dict(delta=1.5), "delta"), ("lantern", dict(lam=0.5), "lam"), ("lantern", dict(k=0), "k must"),
])
def test_bad_options_fail_before_work(tiny_gpt, name, opts, match):
    with pytest.raises(VGenError, match=match):
        sample(tiny_gpt, [0], name, codebook=_codebook(32), **opts)


def test_codebook_required_and_checked(tiny_gpt):
    with pytest.raises(VGenError, match="codebook=tokenizer.codebook"):
        sample(tiny_gpt, [0], "lantern")
    with pytest.raises(VGenError, match="does not cover"):
        sample(tiny_gpt, [0], "gsd", codebook=_codebook(8))


def test_pipeline_passes_the_codebook_and_returns_step_maps(tiny_pipeline):
    from vgen import load_pipeline
    pipe = load_pipeline(str(tiny_pipeline))
    for name in ("gsd", "lantern", "sjd", "ar"):  # a fixed window: window=auto may run AR's loop, no codebook read
        gen = pipe.generate([0, 2, 3], sampler=name, seed=1, batch_size=2, **({} if name == "ar" else {"window": 4}))
        assert gen.images.shape[:2] == (3, 3) and gen.step_map.shape == (3, 16)
        assert "step_map" not in gen.stats


@pytest.mark.slow
def test_cli_runs_speculative_samplers(tiny_pipeline, tmp_path):
    """sjd in a real process; lantern in process (the main() the command runs: a process costs seconds of
    imports)."""
    from vgen.cli import main
    runs = [("sjd", ["sampler.init=vertical", "sampler.window=5"]), ("lantern", ["sampler.delta=0.2", "sampler.window=4"])]
    for name, extra in runs:
        args = ["sample", f"model.path={tiny_pipeline}", f"sampler={name}", *extra, "num_samples=3",
                f"outdir={tmp_path / name}", "progress=false"]
        if name == "sjd":
            r = subprocess.run([sys.executable, "-m", "vgen", *args], capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
        else:
            main(args)
        st = json.loads((tmp_path / name / "stats.json").read_text())
        assert st["sampler"] == name and st["accepted_per_step"] > 1 and st["forward_passes"] < 16


@pytest.mark.slow
def test_compiled_step_matches_eager(tiny_gpt):
    """The compiled verify step (what `vgen bench` times) decides the same tokens as the eager one."""
    kw = dict(window=4, init="vertical", cfg_scale=2.0, top_k=10)
    eager, st_e = sample(tiny_gpt, [0, 1, 2], "sjd", seed=5, **kw)
    comp, st_c = sample(tiny_gpt, [0, 1, 2], "sjd", seed=5, compile=True, **kw)
    assert torch.equal(eager, comp) and torch.equal(st_e["step_map"], st_c["step_map"])


def test_cfg_interval_and_greedy_match_ar(tiny_gpt):
    """With top_k=1 every sampler is deterministic: SJD must decide AR's tokens, including where
    cfg_interval switches guidance off mid-image."""
    kw = dict(cfg_scale=5.0, cfg_interval=3, top_k=1)
    ar, _ = sample(tiny_gpt, [0, 2, 3], "ar", seed=0, **kw)
    for init in (i for i in INITS if i != "temporal"):  # temporal: video models only
        sjd, _ = sample(tiny_gpt, [0, 2, 3], "sjd", seed=1, window=5, init=init, **kw)
        assert torch.equal(sjd, ar), init


def test_cost_aware_width_choice():
    from vgen.samplers.speculative.widths import best_width, expected_tokens
    costs = {1: 1.0, 2: 1.3, 4: 1.8}
    assert expected_tokens(0.5, 4, 256) == pytest.approx(1.875) and expected_tokens(0.5, 4, 2) == pytest.approx(1.5)
    assert best_width(costs, 0.0, 256) == 1      # nothing passes: a plain AR step
    assert best_width(costs, 0.4, 256) == 2      # 1.4 / 1.3 beats 1 / 1 and 1.62 / 1.8
    assert best_width(costs, 0.9, 256) == 4
    assert best_width(costs, 0.9, 1) == 1        # one token left: no draft can help
    # at batch 8 a sample that widens alone pays the pass's whole extra cost: 1/8 + 0.3 for width 2
    assert best_width(costs, 0.9, 256, batch=8) == 1 and best_width(costs, 0.9, 256, batch=2) == 4
    from vgen.samplers.speculative.widths import can_pay
    assert can_pay(costs) and not can_pay(costs, batch=8)   # 2 / 0.425 < 1 / 0.125: never, whatever passes
    assert not can_pay({1: 1.0, 2: 2.5, 4: 5.0})            # even at batch 1 when a draft costs more than a step


@pytest.mark.parametrize("init", ["vertical", pytest.param("random", marks=pytest.mark.slow),
                                  pytest.param("sample", marks=pytest.mark.slow)])
def test_adaptive_window_is_exact(micro, init):
    """window=auto switches width between passes (from the acceptance it has seen): still exactly the target."""
    m, joint, unguided = micro
    tokens, st = sample(m, [1] * N, "sjd", seed=4, init=init, max_window=4, costs="1:1,2:1.35,3:1.7,4:2", **OPTS)
    assert 1 < st["mean_window"] < 4 and st["mean_window"] != 2  # several widths were used
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, joint) > 1e-3
    assert chi2_p(counts, unguided) < 1e-6 and chi2_p(counts, toward(joint, unguided)) < 1e-6
    assert counts[joint == 0].sum() == 0


def test_adaptive_window_falls_back_to_ar_and_is_reproducible(tiny_gpt):
    kw = dict(cfg_scale=2.0, top_k=10, init="vertical")
    t, st = sample(tiny_gpt, [0, 1, 2], "sjd", seed=1, costs="1:1,2:50,4:90", **kw)
    assert st["mean_window"] == 1 and st["forward_passes"] == 16 and st["acceptance_rate"] == 0
    # no width can pay even if every draft passed: AR's own loop runs, AR's bytes
    ar, _ = sample(tiny_gpt, [0, 1, 2], "ar", seed=1, cfg_scale=2.0, top_k=10)
    assert torch.equal(t, ar)
    a, sa = sample(tiny_gpt, [0, 1, 2], "sjd", seed=1, costs="1:1,2:1.1,4:1.2", **kw)
    b, _ = sample(tiny_gpt, [0, 1, 2], "sjd", seed=1, costs="1:1,2:1.1,4:1.2", **kw)
    assert torch.equal(a, b) and sa["mean_window"] > 2 and sa["forward_passes"] < 16 * 3


def test_adaptive_window_is_batch_invariant(tiny_gpt):
    """Each sample picks its own widths from its own passes: the same tokens in any batch (and refilled slots)."""
    kw = dict(cfg_scale=2.0, top_k=10, init="vertical", costs="1:1,2:1.3,3:1.5,4:1.7")
    labels = [0, 1, 2, 3, 1, 2, 0]
    whole, st = sample(tiny_gpt, labels, "sjd", seed=9, **kw)
    for bs in (1, 3):
        part, _ = sample(tiny_gpt, labels, "sjd", seed=9, batch_size=bs, **kw)
        assert torch.equal(whole, part)
    assert 1 < st["mean_window"] < 4


def test_timed_choice_needs_a_paired_win_beyond_the_noise(monkeypatch):
    """The timed rule compares each round's width with AR's run of the same round: a width qualifies when its mean
    log ratio clears the margin and its lower 95% bound clears AR's loop; the qualified width with the best mean
    wins. While the leading width neither qualifies nor is ruled out, the choice is open (None, more rounds); with
    the rounds spent, a width that won two rounds by a lot and lost one does not run."""
    from vgen.samplers.speculative import widths as speculative
    choose = speculative.timed_choice
    ar3 = [100, 100, 100]
    assert choose({1: ar3, 2: [125, 120, 130], 4: [140, 112, 150]}) == 4  # both qualify: mean 1.33 vs 1.25
    # 4 leads on its mean but one round was a loss: open while rounds are left; 2 (a steady 1.25) once they are spent
    assert choose({1: ar3, 2: [125, 120, 130], 4: [160, 95, 150]}, final=False) is None
    assert choose({1: ar3, 2: [125, 120, 130], 4: [160, 95, 150]}) == 2
    # more rounds that agree settle it for 4
    assert choose({1: [100] * 7, 2: [125, 120, 130] + [125] * 4, 4: [160, 95, 150, 150, 155, 148, 152]},
                  final=False) == 4
    assert choose({1: ar3, 2: [125, 98, 130]}, final=False) is None  # won twice by 25-30%, lost once: open
    assert choose({1: ar3, 2: [125, 98, 130]}) == 1  # and AR's loop when no rounds are left
    assert choose({1: ar3, 2: [108, 109, 150]}) == 1  # one lucky round is not a win
    assert choose({1: ar3, 2: [90, 92, 91]}, final=False) == 1  # ruled out: AR's loop without more rounds
    assert choose({1: ar3, 2: [104, 103, 104]}) == 1  # a steady 1.04 < the margin
    # unpaired best-of-rounds would choose 2 here (best 115 >= 1.1 x AR's best 104), paired ratios 0.85-1.15 do not
    assert choose({1: [104, 80, 100], 2: [88, 82, 115]}) == 1
    assert choose({1: ar3}) == 1
    monkeypatch.setattr(speculative, "TIMED_MARGIN", 1.5)
    assert choose({1: ar3, 2: [125, 120, 130], 4: [140, 112, 150]}) == 1


def test_timed_rounds_add_rounds_for_ar_and_two_leaders_only_while_open():
    """The schedule: three rounds of everything; a decided choice stops there; an open one times AR's loop and the
    two widths with the best mean ratio again, round by round, until it is decided or TIMED_MAX_ROUNDS."""
    from vgen.samplers.speculative import widths as W
    calls = []

    def timer(table):
        def time_one(w):
            calls.append(w)
            return table[w][sum(c == w for c in calls) - 1]
        return time_one
    clear = {1: [100] * 9, 2: [125] * 9, 4: [140] * 9, 8: [90] * 9}
    speeds = W.timed_rounds([2, 4, 8], timer(clear))
    assert calls == [1, 2, 4, 8] * 3 and W.timed_choice(speeds) == 4
    calls.clear()  # 4 leads on a lost round, 2 is second: both get rounds (with AR's) until 4 qualifies
    open_ = {1: [100] * 9, 2: [120, 121, 119] + [120] * 6, 4: [160, 95, 150] + [150] * 6, 8: [90] * 9}
    speeds = W.timed_rounds([2, 4, 8], timer(open_))
    extra = calls[12:]
    assert extra and set(extra) == {1, 2, 4} and len(extra) % 3 == 0 and len(speeds[8]) == 3
    assert len(speeds[1]) <= W.TIMED_MAX_ROUNDS and W.timed_choice(speeds, final=False) == 4
    calls.clear()  # never settles: stops at TIMED_MAX_ROUNDS
    noisy = {1: [100] * 9, 2: [130, 80, 125, 82, 128, 79, 131, 81, 127]}
    speeds = W.timed_rounds([2], timer(noisy))
    assert len(speeds[1]) == len(speeds[2]) == W.TIMED_MAX_ROUNDS


def test_timed_rule_picks_better_widths_under_simulated_noise():
    """docs/scripts/timed_rule_simulation.py: under this CPU's kind of noise (runs moving by ~6%, slow spells of
    15-45% in one run of seven), the sequential rule keeps widths that lose to AR's loop out about as often as the
    fixed three-round rule did and runs faster widths where speculation barely pays."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "timed_rule_simulation", Path(__file__).parents[1] / "docs" / "scripts" / "timed_rule_simulation.py")
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    res = {rule: {name: sim.trial(true, rule, 600) for name, true in sim.CASES.items()} for rule in ("old", "new")}
    for name, true in sim.CASES.items():
        assert res["new"][name]["slower_than_ar"] <= 0.02
        if min(true.values()) > 1.0:
            assert res["new"][name]["mean_ratio"] >= res["old"][name]["mean_ratio"] - 0.005  # never worse
    eagle = next(n for n in sim.CASES if n.startswith("eagle"))
    assert res["new"][eagle]["mean_ratio"] > res["old"][eagle]["mean_ratio"] + 0.01


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_window_auto_times_ar_and_fixed_widths_once_per_job_batch(tiny_gpt, tmp_path, monkeypatch):
    """window=auto: AR's loop and widths 2 / 4 are timed whole once (cached per settings and job batch); the job
    runs the fastest width (that fixed width's tokens) or AR's loop (AR's tokens) when none beats it by the margin."""
    from vgen.samplers.speculative import widths as speculative
    monkeypatch.setenv("VGEN_CACHE", str(tmp_path))
    kw = dict(top_k=10, max_window=4, cfg_scale=2.0)
    first, st = sample(tiny_gpt, [0, 1], "sjd", seed=2, **kw)
    table = json.loads((tmp_path / "spec_speed.json").read_text())
    (speed,) = table.values()
    assert sorted(map(int, speed)) == [1, 2, 4]
    assert all(speculative.TIMED_ROUNDS <= len(v) <= len(speed["1"]) <= speculative.TIMED_MAX_ROUNDS and min(v) > 0
               for v in speed.values())
    fastest = speculative.timed_choice({int(w): v for w, v in speed.items()})
    if fastest > 1:
        want, _ = sample(tiny_gpt, [0, 1], "sjd", seed=2, window=fastest, **kw)
        assert st["mean_window"] == fastest
    else:
        want, _ = sample(tiny_gpt, [0, 1], "ar", seed=2, top_k=10, cfg_scale=2.0)
        assert st["mean_window"] == 1
    assert torch.equal(first, want)
    again, _ = sample(tiny_gpt, [0, 1], "sjd", seed=2, **kw)
    assert json.loads((tmp_path / "spec_speed.json").read_text()) == table and torch.equal(first, again)  # cached
    sample(tiny_gpt, [0, 1], "sjd", seed=2, top_p=0.9, max_window=4)
    assert len(json.loads((tmp_path / "spec_speed.json").read_text())) == 2  # other settings: their own timing
    sample(tiny_gpt, [0, 1], "sjd", seed=2, batch_size=1, **kw)
    assert len(json.loads((tmp_path / "spec_speed.json").read_text())) == 3  # another batch size: its own timing
    # the calls of one job (vgen sample's batches, torchrun's ranks) share the job's table: batches of 2 and a
    # last batch of 1 draw what one call of all three draws
    from vgen.samplers.base import sampling_job
    whole, _ = sample(tiny_gpt, [0, 1, 2], "sjd", seed=2, batch_size=2, **kw)
    with sampling_job(3, 2):
        head, _ = sample(tiny_gpt, [0, 1], "sjd", seed=2, batch_size=2, **kw)
        tail, _ = sample(tiny_gpt, [2], "sjd", seed=4, batch_size=2, **kw)
    assert torch.equal(torch.cat([head, tail]), whole)
    assert len(json.loads((tmp_path / "spec_speed.json").read_text())) == 3  # batch 2 again: the first table
    monkeypatch.setattr(speculative, "TIMED_MARGIN", 1e9)  # nothing can pay: AR's loop, AR's tokens, no new timing
    ar_loop, st = sample(tiny_gpt, [0, 1], "sjd", seed=2, **kw)
    ar, st_ar = sample(tiny_gpt, [0, 1], "ar", seed=2, top_k=10, cfg_scale=2.0)
    assert torch.equal(ar_loop, ar) and st["mean_window"] == 1.0 and st["forward_passes"] == st_ar["forward_passes"]


def test_small_jobs_skip_the_timing(tiny_gpt, tmp_path, monkeypatch):
    """window=auto in a job smaller than TIMED_JOB_RATIO x the timing's samples: no timing (nothing cached), the
    prior's width (its tokens exactly, its pass costs and tokens per pass cached, the stats naming it); a job large
    enough, one whose timing is cached, or any job inside ``time_any_job`` (vgen bench's cells) times / uses it."""
    from vgen.samplers.base import sampling_job
    from vgen.samplers.speculative import widths
    monkeypatch.setenv("VGEN_CACHE", str(tmp_path))
    from vgen.samplers.speculative import prior
    monkeypatch.setattr(widths, "TIMED_JOB_RATIO", 4)
    kw = dict(top_k=10, max_window=4, cfg_scale=2.0)
    need = widths.TIMED_JOB_RATIO * widths.timing_samples([2, 4], 2)
    _, st = sample(tiny_gpt, [0, 1], "sjd", seed=2, **kw)  # 32 tokens: too short a job to measure tokens per pass
    assert (st["window_rule"], st["window"]) in (("fallback", 1), ("prior", 1))
    monkeypatch.setattr(prior, "PRIOR_BUDGET", 1e6)  # as a long job's budget
    small, st = sample(tiny_gpt, [0, 1], "sjd", seed=2, **kw)
    assert st["window_rule"] == "prior" and st["window"] in (1, 2, 4) and st["window_seconds"] > 0
    if st["window"] == 1:
        fixed, _ = sample(tiny_gpt, [0, 1], "ar", seed=2, top_k=10, cfg_scale=2.0)
    else:
        fixed, _ = sample(tiny_gpt, [0, 1], "sjd", seed=2, window=st["window"], **kw)
    assert torch.equal(small, fixed)
    assert not (tmp_path / "spec_speed.json").exists() and (tmp_path / "pass_costs.json").exists()
    again, st2 = sample(tiny_gpt, [0, 1], "sjd", seed=2, **kw)  # the prior's tables are cached: the same choice
    assert torch.equal(again, small) and st2["window"] == st["window"]
    with widths.time_any_job():  # vgen bench: a small cell stands for large jobs, timed
        _, st = sample(tiny_gpt, [0, 1], "sjd", seed=2, **kw)
    assert (tmp_path / "spec_speed.json").exists() and st["window_rule"] == "timed"
    (tmp_path / "spec_speed.json").unlink()
    with sampling_job(need, 2):  # a job that repays the timing: timed (then cached for every job)
        sample(tiny_gpt, [0, 1], "sjd", seed=2, **kw)
    assert (tmp_path / "spec_speed.json").exists()
    (speed,) = json.loads((tmp_path / "spec_speed.json").read_text()).values()
    cached, st = sample(tiny_gpt, [0, 1], "sjd", seed=2, **kw)  # small again, but the timing is known
    assert st["mean_window"] == widths.timed_choice({int(w): v for w, v in speed.items()})
    assert st["window_rule"] == "cached" and st["window"] == widths.timed_choice(
        {int(w): v for w, v in speed.items()})
    from vgen.samplers.speculative import SpeculativeSampler
    monkeypatch.setattr(SpeculativeSampler, "plain_ar", lambda self, *a, **k: (None, {}))  # (no compile here)
    _, st = sample(tiny_gpt, [0, 1], "sjd", seed=2, **{**kw, "max_window": 8}, compile=True)
    assert st["window_rule"] == "fallback" and st["window"] == 1  # compiled, nothing cached: AR's loop, no compile


def test_prior_chooses_ar_where_wide_passes_cost_too_much():
    """The small-job rule on synthetic cost tables shaped like this project's 2-core CPU (photos-gpt, eager, pass
    costs in ms): at batch 8 a wide pass costs 1.4-2.8x AR's step and no width pays at sjd's tokens per pass, so the
    prior runs AR's loop; at batch 1 passes cost little more than AR's step and the widest pays. The margin is
    larger past batch 1, where one pass's cost misses the scheduler's work and the wait for a batch's slowest
    sample."""
    from vgen.samplers.speculative.prior import PRIOR_BATCH_MARGIN, PRIOR_MARGIN, prior_choice, tokens_at
    sjd = {2: 1.31, 4: 1.68, 8: 1.87}  # sjd's tokens per pass on photos-gpt at fixed widths
    batch8 = {0: 7.9, 2: 11.2, 4: 14.8, 8: 21.4}
    batch1 = {0: 4.4, 2: 5.2, 4: 6.3, 8: 6.8}
    assert prior_choice(batch8, sjd, 8) == 1
    assert prior_choice(batch8, {2: 2.0, 4: 4.0, 8: 8.0}, 8) == 8  # every draft passing would pay
    assert prior_choice(batch1, {2: 1.31, 4: 1.68, 8: 2.6}, 1) == 8
    assert prior_choice(batch1, sjd, 1) == 8  # 1.87 * 4.4 / 6.8 = 1.21: the best tokens per cost, past the margin
    assert prior_choice({0: 4.4, 2: 5.2, 4: 6.3, 8: 8.0}, sjd, 1) == 4  # 1.68 * 4.4 / 6.3 = 1.17
    gain = 1.87 * 4.4 / 6.8
    assert (gain >= PRIOR_MARGIN) == (prior_choice(batch1, {8: 1.87}, 1) == 8)
    assert prior_choice(batch1, {8: 1.87}, 2) == (8 if gain >= PRIOR_BATCH_MARGIN else 1)
    assert prior_choice({0: 1.0}, {}, 1) == 1
    # a wider run's passes credited to a narrower width: each pass of c tokens takes ceil(c / w) passes
    assert tokens_at({1: 2, 4: 2}, 4) == 10 / 4 and tokens_at({1: 2, 4: 2}, 2) == 10 / 6
    assert tokens_at({1: 2, 4: 2}, 1) == 1.0 and tokens_at({}, 4) == 1.0

def test_pass_costs_measured_once_and_cached(tiny_gpt, tmp_path, monkeypatch):
    """scd's job rule prices widths from per-pass costs: measured once per settings and job batch, cached."""
    from vgen.samplers.speculative import sampler as speculative
    monkeypatch.setenv("VGEN_CACHE", str(tmp_path))
    calls = []
    real = speculative.pass_costs

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(speculative, "pass_costs", counted)
    first, st = sample(tiny_gpt, [0, 1], "scd", seed=2, top_k=10, max_window=4)
    table = json.loads((tmp_path / "pass_costs.json").read_text())
    (entry,) = table.values()
    assert sorted(map(int, entry)) == [1, 2, 4] and all(c > 0 for c in entry.values())
    again, _ = sample(tiny_gpt, [0, 1], "scd", seed=2, top_k=10, max_window=4)
    assert json.loads((tmp_path / "pass_costs.json").read_text()) == table  # read back, not measured again
    assert torch.equal(first, again) and len(calls) == 2
    sample(tiny_gpt, [0, 1], "scd", seed=2, top_k=10, max_window=4, batch_size=1)
    assert len(json.loads((tmp_path / "pass_costs.json").read_text())) == 2  # another batch size: its own costs


@pytest.mark.parametrize("opts,match", [(dict(window="wide"), "window must be auto or a whole number"),
                                        (dict(window=1), "window must be auto"),
                                        (dict(costs="2:1"), "width 1 included"),
                                        (dict(costs="1:x"), "costs must look like"),
                                        (dict(max_window=1), "max_window must be >= 2")])
def test_adaptive_options_are_checked(tiny_gpt, opts, match):
    with pytest.raises(VGenError, match=match):
        sample(tiny_gpt, [0], "sjd", **opts)


@pytest.mark.cuda
@pytest.mark.parametrize("name,extra", [("sjd", {}), ("sjd", dict(coupling="maximal", init="sample")),
                                        ("gsd", {}), ("lantern", {}), ("scd", {}), ("scd", dict(coupling="maximal")),
                                        ("sjd", dict(window="auto", costs="1:1,2:1.1,4:1.3"))])
def test_speculative_samplers_run_on_cuda(tiny_gpt, name, extra):
    """On a GPU every Jacobi draft source and rule keeps its tensors on the device, decides every token in the
    vocabulary, and gives the same bytes for the same seed, alone or in a smaller batch (slots refilled)."""
    m = tiny_gpt.cuda()
    kw = {**OPTS, "window": 4, "init": "vertical", "top_k": 10, "codebook": _codebook(32).cuda(), **extra}
    if name in ("sjd", "scd"):
        kw.pop("codebook")
    a, st = sample(m, [0, 1, 2], name, seed=5, **kw)
    b, _ = sample(m, [0, 1, 2], name, seed=5, batch_size=2, **kw)
    assert a.device.type == "cuda" and a.shape == (3, m.seq_len)
    assert int(a.min()) >= 0 and int(a.max()) < m.vocab_size
    assert st["forward_passes"] < 3 * m.seq_len and 1.0 <= st["accepted_per_step"]
    assert torch.equal(a, b)


@pytest.mark.cuda
@needs_zoo("photos-gpt")
@pytest.mark.parametrize("extra", [dict(window=8), dict(window=4, verify="token"),
                                   dict(window=8, accept="lantern"), dict(tree="3,2,1", children="top", window=16)])
def test_eagle_runs_on_cuda(extra):
    """The shipped draft head's chain and tree on a GPU: on the device, the same bytes for the same seed in any
    batch, more than one token per pass (a chain of 3+ drafts: more than 1.5), its depth statistics computed."""
    pipe = vgen.load_pipeline("photos-gpt", device="cuda")
    a = pipe.generate([0, 3, 7], sampler="eagle", seed=1, **extra)
    b = pipe.generate([0, 3, 7], sampler="eagle", seed=1, batch_size=2, **extra)
    assert torch.equal(a.tokens, b.tokens) and a.tokens.shape == (3, 256)
    assert a.stats["accepted_per_step"] > (1.0 if "tree" in extra else 1.5) and a.stats["accepted_by_depth"][0] > 0


def test_eagle_finds_a_gpts_features_on_every_python(tiny_gpt):
    """A GPT is a FeatureModel although its ``tok_embeddings`` lives in ``nn.Module._modules``, where Python 3.12's
    static protocol lookup (``isinstance`` on a runtime-checkable protocol) does not see it: eagle asks ``satisfies``,
    which looks members up as attributes. A model without the features is refused in one line."""
    import inspect

    from vgen.interfaces import FeatureModel, satisfies
    with pytest.raises(AttributeError):
        inspect.getattr_static(tiny_gpt, "tok_embeddings")
    assert satisfies(tiny_gpt, FeatureModel) and not satisfies(object(), FeatureModel)


def test_an_acceptance_rule_is_one_class_on_the_shared_core(tiny_gpt):
    """The speculative core takes any object with ``block`` and ``__call__(p, q, x, px, qx)``: the exact rule written
    again as a new class gives sjd's bytes; a rule that accepts nothing decides one token per pass."""
    from dataclasses import dataclass

    from vgen.samplers.sjd import SJDSampler

    @dataclass(frozen=True)
    class Ratio:
        block = False

        def __call__(self, p, q, x, px, qx):
            return torch.minimum(px / qx.clamp_min(1e-30), torch.ones_like(px))

    @dataclass(frozen=True)
    class Never:
        block = False

        def __call__(self, p, q, x, px, qx):
            return torch.zeros_like(px)

    def with_rule(rule):
        class Custom(SJDSampler):
            def acceptance(self, model, codebook):
                return rule
        return Custom(window=4, init="vertical", **OPTS)

    cond = torch.tensor([0, 1, 2])
    mine, st = with_rule(Ratio())(tiny_gpt, cond, [5, 6, 7], batch_size=2)
    ref, st_ref = sample(tiny_gpt, [0, 1, 2], "sjd", seed=5, window=4, init="vertical", batch_size=2, **OPTS)
    assert torch.equal(mine, ref) and st["forward_passes"] == st_ref["forward_passes"] < 3 * tiny_gpt.seq_len
    _, none = with_rule(Never())(tiny_gpt, cond, [5, 6, 7])
    assert none["accepted_per_step"] == 1.0 and none["acceptance_rate"] == 0.0


def test_weight_dependent_tables_are_keyed_by_the_weights(tiny_gpt):
    """window=auto's acceptance and timing tables depend on the weights: a model retrained in the same architecture
    must not read another's (the key held the architecture only)."""
    import copy

    from vgen.samplers.speculative.tables import fingerprint
    a = fingerprint(tiny_gpt)
    assert fingerprint(tiny_gpt) == a
    other = copy.deepcopy(tiny_gpt)
    with torch.no_grad():
        next(other.parameters()).add_(1e-3)
    assert fingerprint(other) != a and other.config_dict() == tiny_gpt.config_dict()
