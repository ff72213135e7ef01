"""Text-to-image: prompts reach a text-conditional GPT through the text encoder, every token sampler takes them, and
padding never changes a sample (a prompt's tokens are the same alone or beside longer and shorter prompts)."""
import json

import pytest
import torch

from vgen.errors import VGenError
from vgen.pipeline import load_pipeline

PROMPTS = ["a photo of the moon", "a dark close-up of the left part of the cat in black and white , mirrored",
           "cat", "a warm photo of the coffee"]
SAMPLERS = [("ar", {}), ("sjd", {"window": 4}), ("scd", {"window": 4}), ("gsd", {"window": 4}),
            ("lantern", {"window": 4}), ("zipar", {})]


def test_prompts_generate_images_and_are_recorded(tiny_t2i_pipeline):
    pipe = load_pipeline(str(tiny_t2i_pipeline))
    assert pipe.card.conditioning == "text" and pipe.card.spec.conditioning == "text"
    gen = pipe.generate(prompts=PROMPTS[:2], seed=3)
    assert gen.images.dtype == torch.uint8 and gen.images.shape[0] == 2
    assert gen.prompts == PROMPTS[:2] and gen.labels is None
    again = pipe.generate(prompts=PROMPTS[:2], seed=3)
    assert torch.equal(gen.tokens, again.tokens)
    other = pipe.generate(prompts=[PROMPTS[2], PROMPTS[2]], seed=3)
    assert not torch.equal(gen.tokens[0], other.tokens[0])  # the prompt reaches the model


def test_caption_features_are_left_padded_with_zero_rows(tiny_t2i_pipeline):
    pipe = load_pipeline(str(tiny_t2i_pipeline))
    feats = pipe.encode(pipe.condition(prompts=PROMPTS[:3]))
    T = pipe.model.cond_len
    assert feats.shape == (3, T, pipe.text_encoder.dim)
    ids, mask = pipe.text_encoder.tokenize(PROMPTS[:3])
    valid = pipe.model.cond_mask(feats)
    for i in range(3):
        n = int(mask[i].sum())
        assert valid[i].tolist() == [False] * (T - n) + [True] * n  # valid rows at the end, padding zero


@pytest.mark.filterwarnings("ignore:.*truncated")
@pytest.mark.parametrize("sampler,opts", SAMPLERS)
def test_padding_never_changes_a_sample(tiny_t2i_pipeline, sampler, opts):
    """Each prompt alone (seed s) gives the tokens it gets in a batch with longer and shorter prompts."""
    pipe = load_pipeline(str(tiny_t2i_pipeline))
    together = pipe.generate(prompts=PROMPTS, sampler=sampler, seed=7, batch_size=4, **opts)
    for i, p in enumerate(PROMPTS):
        alone = pipe.generate(prompts=[p], sampler=sampler, seed=7 + i, **opts)
        assert torch.equal(alone.tokens[0], together.tokens[i]), (sampler, p)


def test_scd_is_ar_with_gumbel_draws_on_prompts(tiny_t2i_pipeline):
    """SCD's identity with AR under the Gumbel coupling holds on prompts (a lossless sampler's tokens = AR's)."""
    pipe = load_pipeline(str(tiny_t2i_pipeline))
    ar = pipe.generate(prompts=PROMPTS, sampler="ar", seed=1, draw="gumbel")
    scd = pipe.generate(prompts=PROMPTS, sampler="scd", seed=1, window=4)
    assert torch.equal(ar.tokens, scd.tokens)


def test_window_auto_calibrates_on_the_cards_example_prompts(tiny_t2i_pipeline, tmp_path, monkeypatch):
    monkeypatch.setenv("VGEN_CACHE", str(tmp_path / "cache"))
    pipe = load_pipeline(str(tiny_t2i_pipeline))
    gen = pipe.generate(prompts=PROMPTS[:1], sampler="sjd", seed=0, window="auto")
    assert gen.tokens.shape == (1, 16)


@pytest.mark.parametrize("kw,msg", [
    (dict(labels=[0]), "text-to-image model: give prompts"),
    (dict(), "text-to-image model: give prompts"),
    (dict(prompts=[""]), "empty prompt"),
    (dict(prompts=["a", 3]), "must be a string"),
    (dict(prompts=[]), "is empty"),
    (dict(prompts=["a"], labels=[0]), "not both"),
])
def test_bad_conditions_for_a_text_model(tiny_t2i_pipeline, kw, msg):
    pipe = load_pipeline(str(tiny_t2i_pipeline))
    with pytest.raises(VGenError, match=msg):
        pipe.generate(**kw)


def test_prompts_for_a_class_model_are_refused(tiny_pipeline):
    pipe = load_pipeline(str(tiny_pipeline))
    with pytest.raises(VGenError, match="reads no text"):
        pipe.generate(prompts=["a photo of the moon"])


def test_long_prompt_is_truncated_with_a_warning(tiny_t2i_pipeline):
    pipe = load_pipeline(str(tiny_t2i_pipeline))
    with pytest.warns(UserWarning, match="truncated"):
        gen = pipe.generate(prompts=["a photo of the moon " * 5], seed=0)
    assert gen.tokens.shape[0] == 1


def test_missing_text_encoder_files_are_named_before_weights_load(tiny_t2i_pipeline):
    (tiny_t2i_pipeline / "text" / "model.safetensors").unlink()
    (tiny_t2i_pipeline / "gpt.safetensors").write_bytes(b"not read")  # weights never opened: the folder is checked first
    with pytest.raises(VGenError, match=r"lacks model.safetensors or pytorch_model.bin"):
        load_pipeline(str(tiny_t2i_pipeline))


def test_sample_job_takes_prompts_and_prompt_files(tiny_t2i_pipeline, tmp_path):
    from vgen.cli import main
    out = tmp_path / "s"
    main(["sample", f"model.path={tiny_t2i_pipeline}", 'prompts=["a photo of the moon","cat"]', "num_samples=3",
          "batch_size=2", f"outdir={out}", "progress=false"])
    assert sorted(p.name for p in out.glob("0*.png")) == ["000000.png", "000001.png", "000002.png"]
    run = json.loads((out / "run.json").read_text())
    assert run["prompts"] == ["a photo of the moon", "cat"]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["prompts"] == ["a photo of the moon", "cat", "a photo of the moon"]
    f = tmp_path / "p.txt"
    f.write_text("a photo of the moon\ncat\n")
    out2 = tmp_path / "s2"
    main(["sample", f"model.path={tiny_t2i_pipeline}", f"prompt_file={f}", "num_samples=3", "batch_size=1",
          f"outdir={out2}", "progress=false"])
    for i in range(3):  # the same samples from the file as inline (sample i: prompt i % 2, seed i)
        assert (out2 / f"{i:06d}.png").read_bytes() == (out / f"{i:06d}.png").read_bytes()
