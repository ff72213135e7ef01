"""Reproduce the official text-conditional LlamaGen outputs in ../shared/conformance (llamagen_gpt_t2i*: random
tiny weights, left-padded random caption features with their masks; see its README). Every size is read from the
fixture's ``config``, so another fixture set of the same format runs unchanged."""
import pytest
import torch
from conftest import load_io

from vgen.models import load_official
from vgen.samplers import sample


def _t2i(conf_dir):
    io = load_io(conf_dir, "llamagen_gpt_t2i")
    model = load_official("gpt", conf_dir / "llamagen_gpt_t2i.safetensors", **io["config"])
    return model, io


def _caption(io):
    """The caption as vgen's text path hands it to a t2i GPT: padding rows zero, so the mask is the non-zero rows."""
    cap = io["caption"] * io["emb_mask"][..., None].to(io["caption"].dtype)
    return cap


def test_conformance_t2i_layout_read_from_the_keys(conf_dir):
    """The t2i layout is recognised from its keys: caption MLP, uncond_embedding rows = caption positions."""
    model, io = _t2i(conf_dir)
    c = io["config"]
    assert model.config.model_type == "t2i" and model.conditioning == "text"
    assert model.cond_len == c["cls_token_num"] and model.config.caption_dim == c["caption_dim"]
    inferred = load_official("gpt", conf_dir / "llamagen_gpt_t2i.safetensors", n_head=c["n_head"],
                             block_size=c["block_size"]).config
    assert inferred.model_type == "t2i" and inferred.cls_token_num == c["cls_token_num"]
    assert inferred.caption_dim == c["caption_dim"] and inferred.dim == c["dim"]


def test_conformance_t2i_mask_is_the_nonzero_rows(conf_dir):
    model, io = _t2i(conf_dir)
    assert torch.equal(model.cond_mask(_caption(io)), io["emb_mask"].bool())
    null = model.null_cond(_caption(io))  # the null caption under the same mask
    assert torch.equal(model.cond_mask(null), io["emb_mask"].bool())


def test_conformance_t2i_cached_logits(conf_dir):
    """Prefill the 120 caption positions, then every token in one cached call (the official KV-cache path)."""
    model, io = _t2i(conf_dir)
    b, n = io["tokens"].shape
    T = io["config"]["cls_token_num"]
    with torch.no_grad():
        cache = model.new_cache(b)
        first = model.prefill(_caption(io), cache)
        rest = model.decode(io["tokens"][:, :-1], torch.arange(T, T + n - 1), cache)
    torch.testing.assert_close(torch.cat([first[:, None], rest], 1), io["logits"], atol=1e-4, rtol=0)


def test_conformance_t2i_teacher_forced_logits(conf_dir):
    """The training forward (causal mask with the caption's padding hidden) gives the cached path's logits."""
    model, io = _t2i(conf_dir)
    with torch.no_grad():
        logits = model(io["tokens"], _caption(io))
    torch.testing.assert_close(logits, io["logits"], atol=1e-4, rtol=0)


def test_conformance_t2i_padding_is_invisible(conf_dir):
    """What sits in the padding rows changes nothing (the official mask hides them): the null caption's values
    there, or random ones."""
    model, io = _t2i(conf_dir)
    b, n = io["tokens"].shape
    T = io["config"]["cls_token_num"]
    cap = _caption(io)
    with torch.no_grad():
        ref = model(io["tokens"], cap)
        cache = model.new_cache(b)
        model.prefill(cap, cache)
        junk = torch.randn_like(cap) * (~io["emb_mask"].bool())[..., None]
        cache.mask_keys(io["emb_mask"].bool())  # what prefill sets from the zero rows, set by hand for the junk
        h = model.embed_cond(cap + junk)
        pos = torch.arange(T)
        mask = cache.causal_mask(pos) | (cache.slots[: cache.length] == pos[:, None])[None, None]
        model.run_layers(h, pos, cache, mask)
        rest = model.decode(io["tokens"][:, :-1], torch.arange(T, T + n - 1), cache)
    torch.testing.assert_close(rest, ref[:, 1:], atol=1e-4, rtol=0)


@pytest.mark.parametrize("key,cfg", [("greedy_cfg4", 4.0), ("greedy_nocfg", 1.0)])
def test_conformance_t2i_greedy_generation(conf_dir, key, cfg):
    model, io = _t2i(conf_dir)
    tokens, stats = sample(model, _caption(io), "ar", cfg_scale=cfg, top_k=1)
    assert torch.equal(tokens, io[key])
    assert stats["forward_passes"] == io[key].shape[1]


@pytest.mark.parametrize("sampler", ["sjd", "scd"])
def test_conformance_t2i_greedy_lossless_samplers(conf_dir, sampler):
    """Greedy speculative decoding on the official t2i model gives the official greedy tokens (the caption mask
    holds through verification windows and CFG)."""
    model, io = _t2i(conf_dir)
    tokens, _ = sample(model, _caption(io), sampler, cfg_scale=4.0, top_k=1, window=4)
    assert torch.equal(tokens, io["greedy_cfg4"])


def test_conformance_t2i_batch_invariant(conf_dir):
    """A caption's tokens are the same alone or in a batch with longer and shorter captions."""
    model, io = _t2i(conf_dir)
    cap = _caption(io)
    together, _ = sample(model, cap, "ar", cfg_scale=4.0, top_k=50, seed=3)
    for i in range(cap.shape[0]):
        alone, _ = sample(model, cap[i:i + 1], "ar", cfg_scale=4.0, top_k=50, seed=3 + i)
        assert torch.equal(alone[0], together[i])
