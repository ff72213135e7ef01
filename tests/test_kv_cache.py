"""The cached path: rollback by position, arbitrary masks, per-sample positions."""
import torch


def _fresh(model, cond, tokens):
    cache = model.new_cache(cond.shape[0])
    model.prefill(cond, cache)
    return model.decode(tokens, torch.arange(1, 1 + tokens.shape[1]), cache), cache


def _masked(model, cond, tokens, edit=None):
    """Prefill, then decode ``tokens`` at positions 1.. with an explicit causal mask (``edit`` may change it)."""
    cache = model.new_cache(cond.shape[0])
    model.prefill(cond, cache)
    pos = torch.arange(1, 1 + tokens.shape[1])
    mask = (torch.arange(cache.max_len)[None] <= pos[:, None]).clone()
    if edit is not None:
        edit(mask)
    return model.decode(tokens, pos, cache, attn_mask=mask[None, None])


def test_rollback_is_free(tiny_gpt):
    """Write 6 tokens, roll back to 3 and write different ones: same logits as a fresh cache."""
    torch.manual_seed(0)
    cond = torch.tensor([1, 2])
    a = torch.randint(0, 32, (2, 6))
    b = torch.cat([a[:, :3], torch.randint(0, 32, (2, 3))], 1)
    with torch.no_grad():
        _, cache = _fresh(tiny_gpt, cond, a)
        again = tiny_gpt.decode(b[:, 3:], torch.arange(4, 7), cache)  # positions 4..6 overwrite the old drafts
        ref, _ = _fresh(tiny_gpt, cond, b)
    torch.testing.assert_close(again, ref[:, 3:], atol=1e-5, rtol=0)


def test_explicit_mask_equals_default_causal(tiny_gpt):
    torch.manual_seed(1)
    cond = torch.tensor([0])
    toks = torch.randint(0, 32, (1, 5))
    with torch.no_grad():
        ref, _ = _fresh(tiny_gpt, cond, toks)
        out = _masked(tiny_gpt, cond, toks)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_custom_mask_changes_what_a_token_sees(tiny_gpt):
    """Hiding token 1 from token 3 changes token 3's logits and nothing before it."""
    torch.manual_seed(2)
    cond = torch.tensor([3])
    toks = torch.randint(0, 32, (1, 4))
    def hide(mask):
        mask[3, 2] = False  # query at position 4 (token 3) cannot see position 2 (token 1)

    with torch.no_grad():
        ref, _ = _fresh(tiny_gpt, cond, toks)
        out = _masked(tiny_gpt, cond, toks, hide)
    torch.testing.assert_close(out[:, :3], ref[:, :3], atol=1e-5, rtol=0)
    assert (out[:, 3] - ref[:, 3]).abs().max() > 1e-3


def test_per_sample_positions(tiny_gpt):
    """Each sample may sit at its own position (ragged progress): same as running them apart."""
    torch.manual_seed(3)
    cond = torch.tensor([0, 1])
    pre = torch.randint(0, 32, (2, 4))
    with torch.no_grad():
        cache = tiny_gpt.new_cache(2)
        tiny_gpt.prefill(cond, cache)
        tiny_gpt.decode(pre, torch.arange(1, 5), cache)
        nxt = torch.randint(0, 32, (2, 2))
        pos = torch.tensor([[3, 4], [5, 6]])  # sample 0 rolled back to 2 tokens, sample 1 moves on from 4
        out = tiny_gpt.decode(nxt, pos, cache)
        r0, _ = _fresh(tiny_gpt, cond[:1], torch.cat([pre[:1, :2], nxt[:1]], 1))
        r1, _ = _fresh(tiny_gpt, cond[1:], torch.cat([pre[1:], nxt[1:]], 1))
    torch.testing.assert_close(out[0], r0[0, 2:], atol=1e-5, rtol=0)
    torch.testing.assert_close(out[1], r1[0, 4:], atol=1e-5, rtol=0)


def test_small_row_linear_matches_f_linear():
    from vgen.kernels.linear import linear
    torch.manual_seed(0)
    w, b = torch.randn(48, 16), torch.randn(48)
    for shape in [(2, 16), (3, 5, 16), (100, 16)]:
        x = torch.randn(*shape)
        with torch.inference_mode():
            torch.testing.assert_close(linear(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)
