"""Reproduce the official LlamaGen outputs stored in ../shared/conformance (see its README)."""
import pytest
import torch
from safetensors.torch import load_file

from conftest import load_io
from vgen.models import load_official
from vgen.samplers import sample


def _gpt(conf_dir):
    io = load_io(conf_dir, "llamagen_gpt_c2i")
    model = load_official("gpt", conf_dir / "llamagen_gpt_c2i.safetensors", **io["config"])
    return model, io


def test_conformance_gpt_teacher_forced_logits(conf_dir):
    model, io = _gpt(conf_dir)
    with torch.no_grad():
        logits = model(io["tokens"], io["cond"])
    n = io["tokens"].shape[1]
    assert logits.shape == io["logits"][:, :n].shape
    torch.testing.assert_close(logits, io["logits"][:, :n], atol=1e-4, rtol=0)


def test_conformance_gpt_cached_logits(conf_dir):
    """Prefill at position 0, then every token in one cached call (the official KV-cache path)."""
    model, io = _gpt(conf_dir)
    b, n = io["tokens"].shape
    with torch.no_grad():
        cache = model.new_cache(b)
        first = model.prefill(io["cond"], cache)
        rest = model.decode(io["tokens"], torch.arange(1, n + 1), cache)
    torch.testing.assert_close(torch.cat([first[:, None], rest], 1), io["logits"], atol=1e-4, rtol=0)


def test_conformance_gpt_incremental_matches_one_call(conf_dir):
    """Token-by-token decoding through the static cache gives the same logits as one call."""
    model, io = _gpt(conf_dir)
    b, n = io["tokens"].shape
    with torch.no_grad():
        cache = model.new_cache(b)
        rows = [model.prefill(io["cond"], cache)]
        for t in range(n):
            rows.append(model.decode(io["tokens"][:, t:t + 1], torch.tensor([1 + t]), cache)[:, 0])
    torch.testing.assert_close(torch.stack(rows, 1), io["logits"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("key,cfg", [("greedy_cfg4", 4.0), ("greedy_nocfg", 1.0)])
def test_conformance_gpt_greedy_generation(conf_dir, key, cfg):
    model, io = _gpt(conf_dir)
    tokens, stats = sample(model, io["cond"], "ar", cfg_scale=cfg, top_k=1)
    assert torch.equal(tokens, io[key])
    assert stats["forward_passes"] == io[key].shape[1]


def test_conformance_gpt_greedy_compiled(conf_dir):
    """The compiled decode step (freezing + C++ wrapper) produces the official tokens too."""
    model, io = _gpt(conf_dir)
    tokens, _ = sample(model, io["cond"], "ar", cfg_scale=4.0, top_k=1, compile=True)
    assert torch.equal(tokens, io["greedy_cfg4"])


def test_conformance_vq_codes_and_decode(conf_dir):
    io = load_io(conf_dir, "llamagen_vq")
    vq = load_official("vq", conf_dir / "llamagen_vq.safetensors", **io["config"])
    with torch.no_grad():
        codes = vq.encode_to_codes(io["image"])
        assert torch.equal(codes, io["codes"])
        h = w = int(io["codes"].shape[1] ** 0.5)
        dec = vq.decode_code(io["codes"], shape=[io["codes"].shape[0], io["config"]["codebook_embed_dim"], h, w])
    torch.testing.assert_close(dec, io["decoded"], atol=1e-4, rtol=0)


def test_conformance_state_dict_round_trip(conf_dir):
    """Weights move both ways unchanged: our state_dict has exactly the official keys and tensors."""
    for name, kind in [("llamagen_gpt_c2i", "gpt"), ("llamagen_vq", "vq")]:
        io = load_io(conf_dir, name)
        sd = load_file(str(conf_dir / f"{name}.safetensors"))
        model = load_official(kind, sd, **io["config"])
        ours = model.state_dict()
        assert set(ours) == set(sd)
        for k in sd:
            assert torch.equal(ours[k], sd[k]), k
