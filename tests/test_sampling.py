"""The AR sampler and sampling kernels: exact distributions, batch invariance, seeds, options."""
import pytest
import torch
from exact import chi2_p, counts_of, exact_joint, toward
from scipy import stats

from vgen.errors import VGenError
from vgen.kernels.sampling import filter_probs, per_sample_uniforms, sample_from_probs
from vgen.samplers import get_sampler, list_samplers, sample


def test_filter_probs_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    p = filter_probs(logits, top_k=2)
    torch.testing.assert_close(p, torch.tensor([[0.5 / 0.7, 0.2 / 0.7, 0, 0, 0]]))
    p = filter_probs(logits, top_p=0.6)  # keeps the token that crosses 0.6
    torch.testing.assert_close(p, torch.tensor([[0.5 / 0.7, 0.2 / 0.7, 0, 0, 0]]))
    p = filter_probs(logits, top_p=0.45)
    torch.testing.assert_close(p, torch.tensor([[1.0, 0, 0, 0, 0]]))
    p = filter_probs(logits, temperature=0.0)  # greedy limit
    assert p[0, 0] > 0.999


def test_inverse_cdf_draws_match_probs_and_never_hit_zero_mass():
    probs = torch.tensor([0.0, 0.3, 0.0, 0.5, 0.2, 0.0])
    u = torch.rand(200_000, generator=torch.Generator().manual_seed(0))
    tok = sample_from_probs(probs.expand(len(u), -1), u)
    counts = torch.bincount(tok, minlength=6).numpy()
    assert counts[[0, 2, 5]].sum() == 0
    p = probs[[1, 3, 4]].double().numpy()
    assert stats.chisquare(counts[[1, 3, 4]], counts.sum() * p / p.sum()).pvalue > 1e-3
    edge = sample_from_probs(probs.expand(3, -1), torch.tensor([0.0, 0.9999999, 1.0 - 2 ** -24]))
    assert all(probs[t] > 0 for t in edge)


def test_uniforms_depend_only_on_seed():
    a = per_sample_uniforms([3, 4, 5], (7,))
    b = per_sample_uniforms([5], (7,))
    assert torch.equal(a[2], b[0])


def test_ar_matches_exact_distribution_with_cfg_and_top_k(micro_gpt):
    opts = dict(cfg_scale=2.0, top_k=3, temperature=0.9)
    seqs, joint = exact_joint(micro_gpt, 1, 2.0, top_k=3, temperature=0.9)
    assert abs(float(joint.sum()) - 1) < 1e-4
    n = 10_000  # enough to reject a law a tenth of the way to the unguided one (exact.toward)
    tokens, st = sample(micro_gpt, [1] * n, "ar", seed=0, **opts)
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, joint.numpy()) > 1e-3
    # power: the same samples clearly reject the distribution without guidance, and one a tenth of the way to it
    _, wrong = exact_joint(micro_gpt, 1, 1.0, top_k=3, temperature=0.9)
    assert chi2_p(counts, wrong.numpy()) < 1e-6 and chi2_p(counts, toward(joint.numpy(), wrong.numpy())) < 1e-6
    # tokens outside the top-k support never appear
    assert counts[joint.numpy() == 0].sum() == 0


def test_batch_invariance_and_seeds(tiny_gpt):
    labels = [0, 1, 2, 3, 1]
    batch, _ = sample(tiny_gpt, labels, "ar", seed=7, cfg_scale=2.0, top_k=10)
    for i, lab in enumerate(labels):
        alone, _ = sample(tiny_gpt, [lab], "ar", seed=7 + i, cfg_scale=2.0, top_k=10)
        assert torch.equal(alone[0], batch[i])
    again, _ = sample(tiny_gpt, labels, "ar", seed=7, cfg_scale=2.0, top_k=10)
    assert torch.equal(again, batch)
    other, _ = sample(tiny_gpt, labels, "ar", seed=8, cfg_scale=2.0, top_k=10)
    assert not torch.equal(other, batch)


def test_cfg_interval_turns_guidance_off(tiny_gpt):
    """Tokens after index cfg_interval+1 come from the conditional logits (official semantics)."""
    a, _ = sample(tiny_gpt, [2], "ar", seed=0, cfg_scale=5.0, cfg_interval=3, top_k=1)
    tokens = a[0]
    with torch.no_grad():
        lc = tiny_gpt(tokens[None], torch.tensor([2]))[0]
        lu = tiny_gpt(tokens[None], torch.tensor([4]))[0]
    guided = lu + 5.0 * (lc - lu)
    for t in range(16):
        expect = guided[t].argmax() if t <= 4 else lc[t].argmax()
        assert tokens[t] == expect, t


def test_stats_fields(tiny_gpt):
    _, st = sample(tiny_gpt, [0, 1], "ar", seed=0, cfg_scale=2.0)
    assert st["forward_passes"] == 16 and st["tokens"] == 32
    assert st["kv_cache_bytes"] == 2 * 2 * 2 * 4 * 17 * 32 * 4  # k+v, layers, 2B rows, heads, slots, dim, fp32
    assert st["seconds"] > 0 and st["nll"] > 0


@pytest.mark.parametrize("opts,match", [
    (dict(temperature=-1), "temperature"), (dict(top_k=-1), "top_k"), (dict(top_k=33), "vocabulary"),
    (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(cfg_scale=-0.5), "cfg_scale"),
])
def test_bad_options_fail_before_work(tiny_gpt, opts, match):
    with pytest.raises(VGenError, match=match):
        sample(tiny_gpt, [0], "ar", **opts)


def test_bad_labels_and_sampler(tiny_gpt):
    with pytest.raises(VGenError, match="class id 4 out of range"):
        sample(tiny_gpt, [0, 4], "ar")
    with pytest.raises(VGenError, match="available samplers: ar"):
        sample(tiny_gpt, [0], "nope")
    with pytest.raises(VGenError, match="unknown option"):
        get_sampler("ar", topk=3)
    assert "ar" in list_samplers()
