"""Continuous Speculative Decoding: exactness (two-sample tests with a power check), the official rule's failure,
the continuous AR sampler, options and errors."""
import pytest
import torch
from exact import energy_test

from vgen.errors import VGenError
from vgen.models.car import CAR, CARConfig
from vgen.samplers import sample

N = 1500  # samples per distribution in the two-sample tests


def micro(seed: int, channels: int = 2, steps: int = 10, width: int = 32) -> CAR:
    """A micro causal continuous model (2x2 grid of `channels`-D tokens) with every weight perturbed (random heads
    give informative, distinct distributions; clip_x0 keeps them bounded)."""
    torch.manual_seed(seed)
    m = CAR(CARConfig(dim=32, n_layer=1, n_head=2, num_classes=2, block_size=4, token_channels=channels,
                      diffloss_d=1, diffloss_w=width, num_sampling_steps=steps, token_dropout_p=0.0,
                      resid_dropout_p=0.0, ffn_dropout_p=0.0)).eval()
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) / max(1, p.shape[-1]) ** 0.5)
    return m


@pytest.fixture(scope="module")
def pair():
    return micro(0), micro(1)


OPTS = dict(clip_x0=3.0, num_draft=3, prefill_ratio=0.0)


def target_alone(model, stop_sigma, **kw):
    return sample(model, [1] * N, sampler="ar", seed=0, stop_sigma=stop_sigma, clip_x0=3.0, **kw)[0]


@pytest.mark.parametrize("stop_sigma", [0.0, 0.3])
def test_cspd_exact_matches_target_and_has_power(pair, stop_sigma):
    """CSpD's samples and the target's own are one distribution (energy test, disjoint seeds); the same test
    rejects the draft's samples (power)."""
    target, draft = pair
    ref = target_alone(target, stop_sigma)
    got, st = sample(target, [1] * N, sampler="cspd", draft=draft, seed=10 ** 6, stop_sigma=stop_sigma, **OPTS)
    assert 0.0 < st["acceptance_rate"] < 1.0  # both branches (accept, residual draw) are exercised
    assert not (got.abs().sum(-1) == 0).any()  # no zero vectors: every rejection got its residual draw
    _, p_same = energy_test(ref, got)
    _, p_draft = energy_test(ref, target_alone(draft, stop_sigma))
    assert p_same > 0.01, f"CSpD differs from the target (p={p_same})"
    assert p_draft < 0.01, f"the test cannot tell the draft from the target (p={p_draft}): no power"


@pytest.mark.slow
def test_cspd_exact_with_guidance(pair):
    target, draft = pair
    kw = dict(cfg_scale=2.0, cfg_schedule="linear")
    ref = target_alone(target, 0.3, **kw)
    got, _ = sample(target, [1] * N, sampler="cspd", draft=draft, seed=10 ** 6, stop_sigma=0.3, **kw, **OPTS)
    assert energy_test(ref, got)[1] > 0.01


@pytest.mark.slow
def test_cspd_exact_official_rule_fails(pair):
    """MarkXCloud/CSpD's rule (ratio at temperature 42, capped resampling) changes the distribution: the same test
    that accepts the exact rule rejects it."""
    target, draft = pair
    got, st = sample(target, [1] * N, sampler="cspd", draft=draft, seed=10 ** 6, stop_sigma=0.3, rule="official",
                     **OPTS)
    assert energy_test(target_alone(target, 0.3), got)[1] < 0.01
    assert st["acceptance_rate"] > 0.5  # it accepts far more than it should


def test_cspd_self_draft_accepts_everything_and_reproduces_ar(pair):
    """With the target as its own draft every token is accepted and the tokens are the AR sampler's (same noise)."""
    target, _ = pair
    ref, _ = sample(target, [0, 1, 1], sampler="ar", seed=3, stop_sigma=0.3, clip_x0=3.0)
    got, st = sample(target, [0, 1, 1], sampler="cspd", draft=target, seed=3, stop_sigma=0.3, **OPTS)
    assert st["acceptance_rate"] == 1.0
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert st["forward_passes"] < 4  # 1 prefill + one pass per round of 3 drafts


def test_cspd_stats_and_step_map(pair):
    target, draft = pair
    tok, st = sample(target, [0, 1], sampler="cspd", draft=draft, seed=5, stop_sigma=0.3, **OPTS)
    assert tok.shape == (2, 4, 2) and tok.dtype == torch.float32
    assert st["tokens"] == 8 and st["forward_passes"] >= 2 and st["draft_passes"] >= 3
    smap = st["step_map"]
    assert smap.shape == (2, 4) and int(smap.max()) < st["forward_passes"]
    assert (smap[:, 1:] >= smap[:, :-1]).all()  # tokens are decided in order


def test_cspd_needs_a_fitting_draft(pair):
    target, _ = pair
    with pytest.raises(VGenError, match="needs a draft"):
        sample(target, [0], sampler="cspd", seed=0)
    other = micro(2, channels=3)
    with pytest.raises(VGenError, match="token type"):
        sample(target, [0], sampler="cspd", draft=other, seed=0)
    with pytest.raises(VGenError, match="takes no draft"):
        sample(target, [0], sampler="ar", draft=target, seed=0)


@pytest.mark.parametrize("bad, msg", [(dict(top_k=5), "nothing for continuous"), (dict(top_p=0.9), "nothing for"),
                                      (dict(num_draft=0), "num_draft"), (dict(prefill_ratio=1.0), "prefill_ratio"),
                                      (dict(temperature=0.0), "temperature"), (dict(stop_sigma=1.5), "stop_sigma"),
                                      (dict(num_sampling_steps=5000), "num_sampling_steps")])
def test_cspd_bad_options_are_one_line_errors(pair, bad, msg):
    target, draft = pair
    with pytest.raises(VGenError, match=msg) as e:
        sample(target, [0], sampler="cspd", draft=draft, seed=0, **bad)
    assert "\n" not in str(e.value)


def test_continuous_ar_seeds_batches_and_teacher_forcing(pair):
    """Sample i depends on its seed only (up to float rounding of batched matrix products), and the
    transformer's cached conditions equal teacher forcing's."""
    target, _ = pair
    tok, st = sample(target, [0, 1, 1], sampler="ar", seed=7, clip_x0=3.0)
    alone, _ = sample(target, [1], sampler="ar", seed=8, clip_x0=3.0)
    torch.testing.assert_close(alone[0], tok[1], atol=1e-4, rtol=1e-4)
    again, _ = sample(target, [0, 1, 1], sampler="ar", seed=7, clip_x0=3.0)
    assert torch.equal(again, tok)
    assert st["forward_passes"] == 4 and st["head_seconds"] > 0 and st["transformer_seconds"] > 0
    cache = target.new_cache(3)
    z0 = target.prefill(torch.tensor([0, 1, 1]), cache)
    z = target.decode(tok[:, :3], torch.arange(1, 4), cache)
    tf = target(tok, torch.tensor([0, 1, 1]))
    torch.testing.assert_close(torch.cat([z0[:, None], z], 1), tf, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_stop_sigma_raises_acceptance(pair):
    """The last step's Gaussian is wider when the reverse process stops at a noise floor: acceptance rises."""
    target, draft = pair
    acc = [sample(target, [1] * 64, sampler="cspd", draft=draft, seed=0, stop_sigma=s, **OPTS)[1]["acceptance_rate"]
           for s in (0.0, 0.3)]
    assert acc[1] > acc[0]


@pytest.mark.parametrize("stop_sigma", [0.0, 0.3])
def test_cspd_exact_path_rule_matches_target(pair, stop_sigma):
    """rule=path (whole reverse paths accepted on their density ratio, residual over paths) is exact too."""
    target, draft = pair
    got, st = sample(target, [1] * N, sampler="cspd", draft=draft, seed=10 ** 6, stop_sigma=stop_sigma,
                     rule="path", **OPTS)
    assert 0.0 < st["acceptance_rate"] < 1.0
    assert energy_test(target_alone(target, stop_sigma), got)[1] > 0.01


@pytest.mark.slow
def test_cspd_exact_path_rule_with_guidance(pair):
    target, draft = pair
    kw = dict(cfg_scale=2.0, cfg_schedule="linear")
    got, _ = sample(target, [1] * N, sampler="cspd", draft=draft, seed=10 ** 6, stop_sigma=0.3, rule="path", **kw,
                    **OPTS)
    assert energy_test(target_alone(target, 0.3, **kw), got)[1] > 0.01


def test_cspd_path_rule_self_draft_accepts_everything(pair):
    target, _ = pair
    ref, _ = sample(target, [0, 1, 1], sampler="ar", seed=3, stop_sigma=0.3, clip_x0=3.0)
    got, st = sample(target, [0, 1, 1], sampler="cspd", draft=target, seed=3, stop_sigma=0.3, rule="path", **OPTS)
    assert st["acceptance_rate"] == 1.0
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["exact", "path"])
def test_cspd_exact_with_a_coarse_draft(pair, rule):
    """draft_refresh=3: the draft's network runs at every third step only (a cheaper draft); still exact."""
    target, draft = pair
    got, st = sample(target, [1] * N, sampler="cspd", draft=draft, seed=10 ** 6, stop_sigma=0.3, rule=rule,
                     draft_refresh=3, **OPTS)
    assert 0.0 < st["acceptance_rate"] < 1.0
    assert energy_test(target_alone(target, 0.3), got)[1] > 0.01


@pytest.mark.parametrize("rule", ["path", "exact"])
def test_cspd_is_batch_invariant(pair, rule):
    """A sample's tokens, residual draws included, depend on its seed only: alone or in any batch, up to float
    rounding of batched matrix products (other row counts), which this micro model's reverse process and its
    conditioning on earlier tokens amplify to ~1e-3 by the last token; another decision or another residual
    candidate would move a token by O(1)."""
    target, draft = pair
    labels, kw = [1, 0, 1, 1, 0], dict(sampler="cspd", draft=draft, seed=5, rule=rule, stop_sigma=0.3, **OPTS)
    whole, st = sample(target, labels, **kw)
    assert st["acceptance_rate"] < 1.0  # residual draws happened
    parts, _ = sample(target, labels, batch_size=2, **kw)
    torch.testing.assert_close(parts, whole, atol=1e-2, rtol=0)


def test_continuous_compile_option():
    """compile=auto decides from the job's head calls against the warm-up (a cold cache: the same choice on every
    machine state); a bad value is a one-line error; the sampler that runs sees a bool."""
    from vgen.interfaces import Order
    from vgen.samplers.base import sampler_class, sampling_job
    model = micro(0)
    o = sampler_class("ar", Order.CONTINUOUS_NEXT_TOKEN).Options(compile="AUTO")
    o.validate()
    assert o.compile == "auto"
    assert not o.compile_pays(model, 10, 10)           # 4 head calls: never repays a compilation
    assert o.compile_pays(model, 10 ** 4, 1)           # 40,000 head calls: repays it
    s = sampler_class("ar", Order.CONTINUOUS_NEXT_TOKEN)()
    assert s.resolved(model, 4, 4).options.compile is False
    with sampling_job(10 ** 4, 1):
        assert s.resolved(model, 4, 4).options.compile is True
    with pytest.raises(VGenError, match="compile must be true, false or auto"):
        sample(model, [0], sampler="ar", compile="sometimes")


@pytest.mark.slow
def test_compiled_head_matches_eager():
    """The compiled reverse process (rows padded to a power of two) draws what the eager one does, to float
    rounding: tokens, last-step Gaussians, whole paths and their densities, with per-row guidance and a noise floor.
    Every sampler runs the same code around either, so CSpD's exactness carries over to compile=true. refresh=3
    (runs of 12 steps, the network at every third) and the noise floor (a shorter last run) exercise every branch
    of the run loop; refresh=1 is the same function with the network at every step."""
    refresh = 3
    head = micro(0, channels=3, steps=25).diffloss
    g = torch.Generator().manual_seed(0)
    z = torch.randn((6, head.net.cond_embed.in_features), generator=g)
    noise, step_noise = torch.randn((3, 3), generator=g), torch.randn((25, 3, 3), generator=g)
    cfg = torch.tensor([1.0, 2.0, 3.0])
    with torch.no_grad():
        runs = [head.sample(z, noise, step_noise, 0.9, cfg, None, True, 0.05, 3.0, path=True, refresh=refresh,
                            compiled=c) for c in (False, True)]
    for name in ("token", "mean", "log_std", "states", "path_logpdf"):
        torch.testing.assert_close(getattr(runs[1], name), getattr(runs[0], name), atol=2e-5, rtol=2e-5,
                                   check_dtype=False, msg=name)
    assert runs[1].states.shape[1] == 3 and runs[1].token.shape[0] == 3  # the padding rows never leave the call
