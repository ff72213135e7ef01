"""Text-to-image: prompts reach a text-conditional GPT through the text encoder, every token sampler takes them, and
padding never changes a sample (a prompt's tokens are the same alone or beside longer and shorter prompts)."""
import json

import pytest
import torch
from guards import cli_refusal

from vgen.errors import VGenError
from vgen.pipeline import load_pipeline

PROMPTS = ["a photo of the moon", "a dark close-up of the left part of the cat in black and white , mirrored",
           "cat", "a warm photo of the coffee"]
SAMPLERS = [("ar", {}), ("sjd", {"window": 4}), ("scd", {"window": 4}), ("gsd", {"window": 4}),
            ("lantern", {"window": 4}), ("zipar", {}), ("pjd", {"lag": 2, "window": 3})]


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


@pytest.mark.slow  # quick loop: kept under 3 minutes
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


def test_prompt_accuracy_reads_real_captioned_crops():
    """On real captioned crops (the training region, a seed training never drew: the generator's domain) with their
    true captions the accuracies are high; with the captions shuffled the subject accuracy falls to near chance."""
    from vgen.data.captions import captioned_photos
    from vgen.eval.t2i import prompt_accuracy
    d = captioned_photos("train", 64, seed=424242)
    acc = prompt_accuracy(d.images, list(d.captions))
    assert acc["subject_n"] == 64 and acc["subject_accuracy"] >= 0.8
    assert acc["colour_n"] > 0 and acc["colour_accuracy"] >= 0.8
    assert acc["brightness_n"] > 0 and acc["brightness_accuracy"] >= 0.8
    shuffled = list(d.captions[17:]) + list(d.captions[:17])
    assert prompt_accuracy(d.images, shuffled)["subject_accuracy"] <= 0.3


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_eval_suite_t2i_scores_a_sample_folder(tmp_path, monkeypatch):
    from vgen.cli import main
    from vgen.data.captions import captioned_photos
    from vgen.io import atomic_write_json, save_png
    monkeypatch.delenv("VGEN_CLIP_WEIGHTS", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # no CLIP weights anywhere: CLIP score left out
    d = captioned_photos("train", 12, seed=424243)
    folder = tmp_path / "samples"
    for i, x in enumerate(d.images):
        save_png(folder / f"{i:06d}.png", x)
    atomic_write_json(folder / "stats.json", {"prompts": list(d.captions)})
    main(["eval", "suite=t2i", f"samples={folder}", "progress=false"])
    res = json.loads((folder / "t2i.json").read_text())
    assert res["fid"] > 0 and res["subject_n"] == 12 and res["subject_accuracy"] >= 0.7
    assert res["clip_score"] is None and any("CLIP score left out" in w for w in res["warnings"])
    assert (folder / "t2i.md").read_text().startswith("| metric | value |")


@pytest.mark.filterwarnings("ignore:.*truncated")
def test_drafter_recipe_trains_on_a_text_model_and_eagle_keeps_padding_invariance(tiny_t2i_pipeline, tmp_path):
    """The drafter recipe reads a text pipeline (captioned crops and self-samples on prompts); eagle with the head
    takes prompts, and a prompt's tokens are the same alone or in a batch."""
    from vgen.train.common import run_recipe
    from vgen.train.drafter import DrafterTrainConfig
    run_recipe(DrafterTrainConfig(out=str(tmp_path / "d"), model=str(tiny_t2i_pipeline), steps=3, n_train=8,
                                  n_test=4, self_samples=4, batch_size=4, save_every=3, install=True))
    assert json.loads((tiny_t2i_pipeline / "pipeline.json").read_text())["drafter"] == "drafter.safetensors"
    assert (tiny_t2i_pipeline / "drafter.safetensors").is_file()
    pipe = load_pipeline(str(tiny_t2i_pipeline))
    together = pipe.generate(prompts=PROMPTS, sampler="eagle", seed=7, batch_size=4, window=3)
    for i, p in enumerate(PROMPTS):
        alone = pipe.generate(prompts=[p], sampler="eagle", seed=7 + i, window=3)
        assert torch.equal(alone.tokens[0], together.tokens[i])


def _released_folder(tmp_path, conf_dir):
    """A folder laid out like the LlamaGen-T2I release (GPT .pt under "model", VQ .pt, a T5 folder), holding the
    conformance fixture's official t2i weights (its sizes go in the card's model_config)."""
    from conftest import load_io, tiny_text_encoder
    from safetensors.torch import load_file

    from vgen.models import build
    from vgen.pipeline import llamagen_t2i_card
    io = load_io(conf_dir, "llamagen_gpt_t2i")
    folder = llamagen_t2i_card(tmp_path / "llamagen-t2i", stage=1)
    torch.manual_seed(1)
    tiny_vq = build("vq", codebook_size=io["config"]["vocab_size"], codebook_embed_dim=8, encoder_ch_mult=[1, 2],
                    decoder_ch_mult=[1, 2], z_channels=32, ch=32, num_res_blocks=1)
    torch.save({"model": load_file(str(conf_dir / "llamagen_gpt_t2i.safetensors"))}, folder / "t2i_XL_stage1_256.pt")
    torch.save({"model": tiny_vq.state_dict()}, folder / "vq_ds16_t2i.pt")
    c = io["config"]
    tiny_text_encoder(caption_tokens=c["cls_token_num"], d_model=c["caption_dim"]).save(folder / "flan-t5-xl")
    card = json.loads((folder / "pipeline.json").read_text())
    assert card["sampling"]["cfg_scale"] == 7.5 and card["sampling"]["top_k"] == 1000  # the official defaults
    card["sampling"]["top_k"] = 100  # the fixture's vocabulary is 256
    g = int(round(c["block_size"] ** 0.5))
    card.update(token_shape=[g, g], vocab_size=c["vocab_size"], image_size=g * 2,
                model_config={"block_size": c["block_size"], "n_head": c["n_head"]})
    (folder / "pipeline.json").write_text(json.dumps(card))
    return folder, io


def test_released_llamagen_t2i_layout_loads_unchanged(tmp_path, conf_dir):
    """The released files' layout (GPT checkpoint under "model", the t2i keys) loads through the card, the caption
    path runs FLAN-T5's way (120 positions, left-padded), and the official defaults apply (cfg 7.5, top-k 1000)."""
    folder, io = _released_folder(tmp_path, conf_dir)
    pipe = load_pipeline(str(folder))
    assert pipe.model.config.model_type == "t2i" and pipe.model.cond_len == io["config"]["cls_token_num"]
    s = pipe.make_sampler()
    assert s.options.cfg_scale == 7.5 and s.options.top_k == 100
    feats = pipe.encode(pipe.condition(prompts=["a photo of the moon"]))
    assert feats.shape == (1, 120, io["config"]["caption_dim"]) and pipe.model.cond_mask(feats)[0, -6:].all()
    assert not pipe.model.cond_mask(feats)[0, :-6].any()  # 5 words + </s>, left-padded
    gen = pipe.generate(prompts=["a photo of the moon"], seed=0)
    assert gen.tokens.shape == (1, io["config"]["block_size"])


def test_released_layout_names_every_missing_file_and_its_source(tmp_path, conf_dir):
    folder, _ = _released_folder(tmp_path, conf_dir)
    (folder / "t2i_XL_stage1_256.pt").unlink()
    import shutil
    shutil.rmtree(folder / "flan-t5-xl")
    with pytest.raises(VGenError, match=r"lacks t2i_XL_stage1_256.pt \(https://huggingface.co/peizesun.*flan-t5-xl "
                                        r"\(huggingface-cli download google/flan-t5-xl"):
        load_pipeline(str(folder))


@pytest.mark.parametrize("args,msg", [
    (['prompts=["a photo of the moon"]'], "class-conditional model and reads no text"),
    (["prompt_file=nope.txt"], "nope.txt"),
])
def test_cli_refuses_prompts_for_a_class_model(args, msg, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = cli_refusal(["sample", *args, f"outdir={tmp_path / 'out'}", "progress=false"], capsys)
    assert code == 2 and msg in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,msg", [
    (["labels=[0]"], "text-to-image model: give prompts"),
    ([], "text-to-image model: give prompts"),
    (['prompts=[""]'], "empty prompt"),
    (["prompt_file=p.csv"], "column"),
    (["prompt_file=b.txt"], "blank"),
    (['prompts=["a"]', "prompt_file=b.txt"], "not both"),
    (["samples_per_class=2"], "samples_per_class is for class models"),
])
def test_cli_refuses_bad_conditions_for_a_text_model(tiny_t2i_pipeline, args, msg, tmp_path, capsys, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "p.csv").write_text("title\na photo of the moon\n")
    (work / "b.txt").write_text("a photo of the moon\n\ncat\n")
    before = sorted(p.name for p in work.iterdir())
    code, err = cli_refusal(["sample", f"model.path={tiny_t2i_pipeline}", *args, f"outdir={work / 'out'}", "progress=false"],
                     capsys)
    assert code == 2 and msg in err, err
    assert sorted(p.name for p in work.iterdir()) == before  # nothing written


def test_demo_races_samplers_on_a_prompt(tiny_t2i_pipeline):
    from vgen.demo import LOCAL, Demo
    d = Demo(allowed_dirs=[str(tiny_t2i_pipeline.parent)])
    res = d.race(LOCAL, str(tiny_t2i_pipeline), None, 0, ["sjd"], {"window": 4}, prompt="a photo of the moon")
    assert [r["sampler"] for r in res] == ["ar", "sjd"]
    alone = load_pipeline(str(tiny_t2i_pipeline)).generate(prompts=["a photo of the moon"], seed=0)
    assert torch.equal(res[0]["image"], alone.images[0])
    with pytest.raises(VGenError, match="type a prompt"):
        d.race(LOCAL, str(tiny_t2i_pipeline), None, 0, ["sjd"], {}, prompt="  ")


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_app_shows_a_prompt_box_for_a_text_model(tiny_t2i_pipeline):
    pytest.importorskip("gradio")
    from vgen.demo import Demo, build_app
    app = build_app(Demo(allowed_dirs=[str(tiny_t2i_pipeline.parent)]), "photos-gpt", str(tiny_t2i_pipeline))
    blocks = list(app.blocks.values())
    prompt = [b for b in blocks if getattr(b, "label", None) == "prompt"]
    cls = [b for b in blocks if getattr(b, "label", None) == "class"]
    assert prompt and prompt[0].visible and prompt[0].value == "a photo of the moon"
    assert cls and not cls[0].visible
