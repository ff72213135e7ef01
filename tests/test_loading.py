"""load_official: every official layout loads; mismatches fail with errors that name the fix."""
import pytest
import torch

from vgen.errors import VGenError
from vgen.models import build, load_official, read_checkpoint


@pytest.fixture
def gpt_sd():
    torch.manual_seed(0)
    m = build("gpt", dim=64, n_layer=2, n_head=2, vocab_size=32, num_classes=4, block_size=16)
    return m, m.state_dict()


@pytest.mark.parametrize("wrap", ["model", "module", "state_dict", None])
@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_official_layouts_load(tmp_path, gpt_sd, wrap, fmt):
    m, sd = gpt_sd
    sd = {**sd, "freqs_cis": torch.zeros(17, 16, 2)}  # stray RoPE table in some released files
    if fmt == "pt":
        ckpt = {wrap: sd, "epoch": 3} if wrap else sd
        path = tmp_path / "ckpt.pt"
        torch.save(ckpt, path)
    else:
        if wrap is not None:
            pytest.skip("safetensors files are flat")
        from safetensors.torch import save_file
        path = tmp_path / "ckpt.safetensors"
        save_file(sd, str(path))
    loaded = load_official("gpt", path, n_head=2)
    assert loaded.config.block_size == 16  # read from the stray freqs_cis rows
    x = torch.randint(0, 32, (2, 16))
    c = torch.tensor([0, 3])
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, c), m.eval()(x, c))


def test_prefixes_are_stripped(gpt_sd):
    _, sd = gpt_sd
    wrapped = {"module." + k: v for k, v in sd.items()}
    flat, _ = read_checkpoint({"state_dict": wrapped})
    assert set(flat) == set(sd)


def test_wrong_architecture_names_the_right_kind(tiny_vq):
    with pytest.raises(VGenError, match=r"LlamaGen VQ tokenizer.*load_official\('vq'"):
        load_official("gpt", tiny_vq.state_dict())


def test_missing_keys_and_preset_hint(gpt_sd):
    _, sd = gpt_sd
    with pytest.raises(VGenError) as e:
        load_official("gpt", sd, n_head=2, n_layer=3)
    msg = str(e.value)
    assert "missing keys: layers.2." in msg and "n_layer=2" in msg


def test_shape_conflict_is_listed(gpt_sd):
    _, sd = gpt_sd
    with pytest.raises(VGenError, match="shape conflicts: .*tok_embeddings.weight"):
        load_official("gpt", sd, n_head=2, vocab_size=48)


def test_n_head_must_be_given_for_non_preset_widths(gpt_sd):
    _, sd = gpt_sd
    with pytest.raises(VGenError, match="n_head cannot be read"):
        load_official("gpt", sd)


def test_preset_is_named_for_released_sizes():
    """A GPT-B-shaped checkpoint (meta tensors: no memory) loaded with a wrong depth names GPT-B."""
    with torch.device("meta"):
        m = build("gpt", dim=768, n_layer=12, n_head=12, vocab_size=16384, num_classes=1000, block_size=256)
    sd = m.state_dict()
    from vgen.models.gpt import infer_gpt
    from vgen.models.loading import check_state_dict, preset_name
    inferred = infer_gpt(sd)
    assert inferred["n_head"] == 12 and inferred["num_classes"] == 1000
    assert preset_name("gpt", inferred) == "GPT-B"
    with torch.device("meta"):
        other = build("gpt", dim=768, n_layer=11, n_head=12, vocab_size=16384, num_classes=1000, block_size=256)
    with pytest.raises(VGenError, match=r"GPT-B"):
        check_state_dict(other, sd, "gpt", {"n_layer": 11}, inferred)


def test_vq_config_inferred_from_shapes(tiny_vq):
    loaded = load_official("vq", tiny_vq.state_dict())
    c = loaded.config
    assert (c.codebook_size, c.ch, c.encoder_ch_mult, c.decoder_ch_mult, c.num_res_blocks) == (32, 32, [1, 2], [1, 2], 1)


def test_t2i_layout_loads_and_prefills():
    torch.manual_seed(0)
    m = build("gpt", dim=64, n_layer=1, n_head=2, vocab_size=32, block_size=16, model_type="t2i",
              caption_dim=24, cls_token_num=5)
    loaded = load_official("gpt", m.state_dict(), n_head=2, block_size=16)
    assert loaded.config.model_type == "t2i" and loaded.config.cls_token_num == 5
    caption = torch.randn(2, 5, 24)
    with torch.no_grad():
        logits = loaded.prefill(caption, loaded.new_cache(2))
        assert logits.shape == (2, 32)
        # the null caption for CFG is the stored uncond embedding
        assert torch.equal(loaded.null_cond(caption)[0], loaded.cls_embedding.uncond_embedding)


def test_unknown_kind_and_field():
    with pytest.raises(VGenError, match="available kinds"):
        build("nope")
    with pytest.raises(VGenError, match="unknown config field"):
        build("gpt", dimm=3)


def test_weights_only_loading_refuses_pickled_code(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("boom",))

    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"model": Evil()}, f)
    with pytest.raises(VGenError, match="holds pickled Python objects.*will not be loaded") as e:
        load_official("gpt", path)
    assert "\n" not in str(e.value) and "weights_only=False" not in str(e.value)  # one line, no unsafe advice


def test_corrupt_and_disguised_checkpoints_give_one_line(tmp_path, capsys):
    """A truncated safetensors file, a pickle renamed .safetensors, a truncated torch file: one line each."""
    import pickle

    from vgen.io import save_safetensors
    from vgen.models import build
    m = build("gpt", dim=64, n_layer=1, n_head=2, vocab_size=16, num_classes=2, block_size=4)
    good = tmp_path / "good.safetensors"
    save_safetensors(m.state_dict(), good)
    (tmp_path / "cut.safetensors").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (tmp_path / "pickle.safetensors").write_bytes(pickle.dumps({"a": 1}))
    torch.save(m.state_dict(), tmp_path / "full.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "full.pt").read_bytes()[:100])
    for name, msg in (("cut.safetensors", "not a readable safetensors file"),
                      ("pickle.safetensors", "not a readable safetensors file"),
                      ("cut.pt", "not a readable torch checkpoint")):
        with pytest.raises(VGenError, match=msg) as e:
            load_official("gpt", tmp_path / name, n_head=2)
        assert "\n" not in str(e.value), name
    assert load_official("gpt", good, n_head=2).config.n_layer == 1
