"""Reproduce the official LlamaGen outputs stored in ../shared/conformance (see its README)."""
import pytest
import torch
from conftest import load_io
from safetensors.torch import load_file

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


@pytest.mark.slow  # quick loop: kept under 3 minutes
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


# ---- VAR + multi-scale VQVAE --------------------------------------------------------------------------------
def _var(conf_dir):
    io = load_io(conf_dir, "var")
    c = io["config"]
    vae = load_official("var-vqvae", conf_dir / "var_vqvae.safetensors", v_patch_nums=list(c["patch_nums"]))
    var = load_official("var", conf_dir / "var.safetensors")  # every field read from the tensors
    assert var.patch_nums == list(c["patch_nums"]) and var.config.depth == c["depth"]
    assert var.vocab_size == c["V"] and var.config.Cvae == c["Cvae"] and var.num_classes == c["num_classes"]
    return var.attach_tokenizer(vae), vae, io


def test_conformance_var_vqvae_indices_and_reconstruction(conf_dir):
    _, vae, io = _var(conf_dir)
    with torch.no_grad():
        idx = vae.encode_scales(io["image"])
        rec = vae.decode_scales(io["idx_list"])
        var_input = vae.quantize.teacher_input(io["idx_list"])
    assert len(idx) == len(io["idx_list"])
    for a, b in zip(idx, io["idx_list"]):
        assert torch.equal(a, b)
    torch.testing.assert_close(rec, io["recon"], atol=1e-4, rtol=0)
    torch.testing.assert_close(var_input, io["var_input"], atol=1e-4, rtol=0)


def test_conformance_var_teacher_forced_logits(conf_dir):
    var, _, io = _var(conf_dir)
    with torch.no_grad():
        logits = var(io["labels"], io["var_input"])
    torch.testing.assert_close(logits, io["logits"], atol=1e-4, rtol=0)


def test_conformance_var_greedy_generation_cfg15(conf_dir):
    """The sampler's KV-cached, scale-by-scale path picks the official tokens and image (cfg 1.5, top-k 1)."""
    var, vae, io = _var(conf_dir)
    labels = io["labels"]
    tokens, stats = sample(var, labels, "var", cfg=1.5, top_k=1)
    ref = torch.cat(io["greedy_idx_cfg1.5"], dim=1)
    assert torch.equal(tokens, ref)
    assert stats["forward_passes"] == len(var.patch_nums)
    with torch.no_grad():
        img = vae.decode_codes(tokens).add(1).mul(0.5)
    torch.testing.assert_close(img, io["greedy_img_cfg1.5"], atol=1e-4, rtol=0)


def test_conformance_var_key_mismatch_is_explained(conf_dir):
    from vgen.errors import VGenError
    sd = load_file(conf_dir / "var.safetensors")
    broken = {k.replace("attn.mat_qkv", "attn.qkv"): v for k, v in sd.items()}
    with pytest.raises(VGenError) as e:
        load_official("var", broken)
    msg = str(e.value)
    assert "missing keys: " in msg and "blocks.0.attn.mat_qkv.weight" in msg
    assert "unexpected keys: " in msg and "blocks.0.attn.qkv.weight" in msg
    assert "the tensors suggest" in msg
    with pytest.raises(VGenError, match="load_official\\('var-vqvae'"):
        load_official("var", conf_dir / "var_vqvae.safetensors")


# ---- NAR (next-neighbour heads) -----------------------------------------------------------------------------
def _nar(conf_dir):
    io = load_io(conf_dir, "nar_c2i")
    c = dict(io["config"])
    model = load_official("nar", conf_dir / "nar_c2i.safetensors", **c)
    assert model.config.n_layer == c["n_layer"] and len(model.layers) == c["n_layer"] + c["medusa_attention_num"]
    return model, io


def test_conformance_nar_proximity_mask_and_teacher_forced_logits(conf_dir):
    from vgen.kernels.proximity import proximity_mask
    model, io = _nar(conf_dir)
    h, w = model.token_shape
    assert torch.equal(proximity_mask((h, w), model.cond_len), io["proximity_mask"])
    with torch.no_grad():
        logits = model(io["tokens"], io["cond"])
    torch.testing.assert_close(logits, io["logits"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("key,cfg", [("greedy_cfg4", 4.0), ("greedy_nocfg", 1.0)])
def test_conformance_nar_greedy_generation(conf_dir, key, cfg):
    model, io = _nar(conf_dir)
    h, w = model.token_shape
    for bs in (1, None):  # one sample at a time, and one batch: same tokens
        tokens, stats = sample(model, io["cond"], "nar", top_k=1, cfg_scale=cfg, batch_size=bs)
        assert torch.equal(tokens, io[key].long())
    assert stats["forward_passes"] == h + w - 1


def test_conformance_nar_loads_with_the_right_split_and_explains_mismatches(conf_dir):
    from vgen.errors import VGenError
    io = load_io(conf_dir, "nar_c2i")
    c = {k: v for k, v in io["config"].items() if k not in ("n_layer", "medusa_attention_num")}
    sd = load_file(str(conf_dir / "nar_c2i.safetensors"))
    n_blocks = io["config"]["n_layer"] + io["config"]["medusa_attention_num"]
    m = load_official("nar", sd, **c)  # default: one extra block before the down head (official default)
    assert m.config.n_layer == n_blocks - 1 and m.config.medusa_attention_num == 1
    assert set(m.state_dict()) == set(sd)
    if n_blocks > 2:
        m2 = load_official("nar", sd, medusa_attention_num=2, **c)
        assert m2.config.n_layer == n_blocks - 2
    with pytest.raises(VGenError, match="load_official\\('nar'"):
        load_official("gpt", sd, **c)
    broken = {k: v for k, v in sd.items() if not k.startswith("medusa_norm")}
    with pytest.raises(VGenError, match="missing keys: medusa_norm.weight"):
        load_official("nar", broken, **c)


# ---- NAR video (LARP-AR with right, down and time heads) ----------------------------------------------------
def _nar_video(conf_dir):
    io = load_io(conf_dir, "nar_video")
    model = load_official("nar-video", conf_dir / "nar_video.safetensors", **io["config"])
    return model, io


def test_conformance_video_nar_proximity_mask_and_teacher_forced_logits(conf_dir):
    from vgen.kernels.proximity import proximity_mask
    model, io = _nar_video(conf_dir)
    assert model.token_shape == tuple(io["config"]["latent_shape"])
    assert torch.equal(proximity_mask(model.token_shape, model.cond_len), io["proximity_mask"])
    with torch.no_grad():
        logits = model(io["tokens"], io["cond"])
    torch.testing.assert_close(logits, io["logits"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("key,cfg", [("greedy_cfg4", 4.0), ("greedy_nocfg", 1.0)])
def test_conformance_video_nar_greedy_generation_and_passes(conf_dir, key, cfg):
    model, io = _nar_video(conf_dir)
    t, h, w = model.token_shape
    for bs in (1, None):
        tokens, stats = sample(model, io["cond"], "nar", top_k=1, cfg_scale=cfg, batch_size=bs)
        assert torch.equal(tokens, io[key].long())
    assert stats["forward_passes"] == io["num_forward_passes"] == t + h + w - 2


def test_conformance_video_nar_loads_official_keys_and_explains_mismatches(conf_dir):
    from vgen.errors import VGenError
    from vgen.models import detect_kind
    io = load_io(conf_dir, "nar_video")
    sd = load_file(str(conf_dir / "nar_video.safetensors"))
    assert detect_kind(sd) == "nar-video"
    c = {k: v for k, v in io["config"].items() if k not in ("n_layer", "attn_num_back", "attn_num_down",
                                                             "max_seq_len", "num_classes", "vocab_size", "dim")}
    m = load_official("nar-video", sd, **c)  # the rest from the shapes, the block split by the official default
    assert set(m.state_dict()) == set(sd)
    assert m.config.n_layer == io["config"]["n_layer"] and len(m.layers) == io["config"]["n_layer"] + 2
    with pytest.raises(VGenError, match="latent_shape cannot be read"):
        load_official("nar-video", sd, n_head=io["config"]["n_head"])
    with pytest.raises(VGenError, match="load_official\\('nar-video'"):
        load_official("nar", sd, n_head=io["config"]["n_head"])
    broken = {k: v for k, v in sd.items() if not k.startswith("norm_B")}
    with pytest.raises(VGenError, match="missing keys: norm_B.weight"):
        load_official("nar-video", broken, **c)
    with pytest.raises(ValueError, match="max_seq_len must equal"):
        load_official("nar-video", sd, **{**c, "latent_shape": [2, 4, 4]})
