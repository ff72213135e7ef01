"""ZipAR: the schedule, what each token sees (against a token-by-token reference), AR at full width, batching."""
import pytest
import torch

from vgen.errors import VGenError
from vgen.kernels.decode import token_step
from vgen.kernels.sampling import per_sample_uniforms
from vgen.samplers import get_sampler, sample
from vgen.samplers.zipar import plan, schedule


@pytest.mark.parametrize("rows,width,window", [(4, 4, 1), (4, 4, 2), (4, 4, 3), (4, 4, 4), (16, 16, 4), (6, 3, 2)])
def test_plan_decides_every_token_once_in_its_pass(rows, width, window):
    p = schedule(rows, width, window)
    src, at, dst = plan(rows, width, window)
    assert src.shape[0] + 1 == (rows - 1) * window + width  # passes, the prefill included
    decided = {0: 0}
    for t in range(src.shape[0]):
        for s, a, d in zip(src[t].tolist(), at[t].tolist(), dst[t].tolist()):
            assert p[s] < t + 1  # only decided tokens are fed
            if d >= 0:
                assert d not in decided and p[d] == t + 1 and a == d - 1  # its predecessor's slot
                decided[d] = t + 1
                if s != a:  # a stand-in: a new row whose row above has not ended
                    assert d % width == 0 and p[d - 1] >= t + 1
    assert sorted(decided) == list(range(rows * width))


def reference_zipar(model, cond, seeds, window, **o):
    """Token by token, straight from the definition: token i = (r, c) is drawn in pass P[i] from the model's output
    at slot i - 1, whose input is token i - 1 (or, when that is not decided before pass P[i], the latest decided
    token of the row above that slot's row), attending to the condition, the decided tokens before i - 1 and itself;
    every token's keys and values are those it got when fed, seeing what was decided by then."""
    rows, width = model.token_shape
    L = rows * width
    P = schedule(rows, width, window)
    u = per_sample_uniforms(seeds, (L,))
    B, C = cond.shape[0], model.cond_len
    cfg = o["cfg_scale"] != 1.0
    tokens = torch.zeros((B, L), dtype=torch.long)
    for i in sorted(range(L), key=lambda i: (int(P[i]), i)):
        x = tokens.clone()
        if i > 0 and P[i - 1] >= P[i]:
            r = i // width
            row = range((r - 2) * width, (r - 1) * width) if r >= 2 else range(width)
            x[:, i - 1] = tokens[:, [j for j in row if P[j] < P[i]][-1]]
        seen = torch.ones(C + L - 1, C + L - 1, dtype=torch.bool).tril()
        for j in range(L - 1):  # token j's keys and values: computed once, fed the pass after it is decided
            seen[C + j, C:C + j] = P[:j] <= P[j]
        if i > 0:
            q = C + i - 1
            seen[q, C:] = False
            seen[q, C:C + i - 1] = P[: i - 1] < P[i]
            seen[q, q] = True
        c_in = torch.cat([cond, model.null_cond(cond)]) if cfg else cond
        logits = model(torch.cat([x, x]) if cfg else x, c_in, attn_mask=seen[None, None])[:, i]
        tok, _ = token_step(logits, u[:, i], cfg, True, o["cfg_scale"], o["temperature"], o["top_k"], o["top_p"])
        tokens[:, i] = tok
    return tokens


@pytest.mark.parametrize("window", [1, 2, 3])
def test_each_token_sees_what_zipar_defines(tiny_gpt, window):
    o = dict(cfg_scale=2.0, top_k=10, temperature=1.0, top_p=1.0)
    cond, seeds = torch.tensor([0, 1, 2, 3]), [5, 6, 7, 8]
    got, st = get_sampler("zipar", window=window, **o)(tiny_gpt, cond, seeds)
    with torch.inference_mode():
        want = reference_zipar(tiny_gpt, cond, seeds, window, **o)
    assert torch.equal(got, want)
    assert torch.equal(st["step_map"], schedule(4, 4, window).expand(4, -1))


def test_full_width_window_is_ar_and_drift_is_scored(tiny_gpt):
    o = dict(cfg_scale=2.0, top_k=10)
    ar, sa = sample(tiny_gpt, [0, 1, 2, 3], "ar", seed=3, **o)
    z, sz = sample(tiny_gpt, [0, 1, 2, 3], "zipar", seed=3, window=4, score=True, **o)
    assert torch.equal(ar, z) and sz["forward_passes"] == 16
    assert sz["nll"] == pytest.approx(sa["nll"], abs=1e-5)  # scored under AR: its own nll
    z2, s2 = sample(tiny_gpt, [0, 1, 2, 3], "zipar", seed=3, window=2, **o)
    assert "nll" not in s2 and s2["forward_passes"] == 3 * 2 + 4  # unscored: no nll to mistake for AR's


def test_batch_invariant_and_cfg_interval(tiny_gpt):
    o = dict(cfg_scale=2.0, top_k=10, window=2, cfg_interval=3)
    whole, _ = sample(tiny_gpt, [0, 1, 2, 3, 1], "zipar", seed=11, **o)
    parts, _ = sample(tiny_gpt, [0, 1, 2, 3, 1], "zipar", seed=11, batch_size=2, **o)
    assert torch.equal(whole, parts)
    alone, _ = sample(tiny_gpt, [2], "zipar", seed=13, **o)
    assert torch.equal(alone[0], whole[2])
    unguided, _ = sample(tiny_gpt, [0, 1, 2, 3, 1], "zipar", seed=11, **{**o, "cfg_interval": -1})
    assert not torch.equal(whole, unguided)  # cfg_interval stops guidance after token 4


def test_window_out_of_range_is_one_line(tiny_gpt):
    for w in (0, 5):
        with pytest.raises(VGenError, match=r"window must be in 1\.\.4"):
            sample(tiny_gpt, [0], "zipar", window=w)
