"""Continuous tokens end to end: the KL tokenizer (diffusers AutoencoderKL), continuous pipelines (CAR, MAR) with
their samplers, drafts named by the card, `vgen sample`, the demo, and the checks made before weights load."""
import json

import pytest
import torch

from vgen.errors import VGenError

STEPS = 5  # head steps of the tiny models


@pytest.fixture(scope="module")
def tiny_kl():
    from vgen.models import build
    torch.manual_seed(0)
    return build("kl", latent_channels=4, block_out_channels=[32, 32], image_size=16).eval()  # 16 px -> 8x8


def tiny_car(seed, dim=32, num_classes=3):
    from vgen.models import build
    torch.manual_seed(seed)
    m = build("car", dim=dim, n_layer=1, n_head=2, num_classes=num_classes, block_size=64, token_channels=4, diffloss_d=1,
              diffloss_w=32, num_sampling_steps=STEPS).eval()
    with torch.no_grad():
        for p in m.diffloss.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


@pytest.fixture(scope="module")
def pipes(tmp_path_factory, tiny_kl):
    """Pipeline folders: a CAR target naming its draft, the draft, a MAR, and a draft on another tokenizer."""
    from vgen.models import build
    from vgen.pipeline import save_pipeline
    root = tmp_path_factory.mktemp("continuous")
    sampling = {"cfg_scale": 2.0, "cfg_schedule": "linear", "clip_x0": 4.0, "num_iter": 8}
    draft = save_pipeline(root / "draft", tiny_car(1, dim=16), tiny_kl, model_kind="car", tokenizer_kind="kl",
                          sampling=sampling)
    target = save_pipeline(root / "target", tiny_car(0), tiny_kl, model_kind="car", tokenizer_kind="kl",
                           sampling=sampling, extra={"draft": str(draft)})
    torch.manual_seed(2)
    mar = build("mar", img_size=16, vae_stride=2, patch_size=1, encoder_embed_dim=32, encoder_depth=1,
                encoder_num_heads=2, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2, vae_embed_dim=4,
                buffer_size=4, class_num=3, diffloss_d=1, diffloss_w=32, num_sampling_steps=STEPS).eval()
    marp = save_pipeline(root / "mar", mar, tiny_kl, model_kind="mar", tokenizer_kind="kl", sampling=sampling)
    torch.manual_seed(9)
    from vgen.models import build as b2
    other_kl = b2("kl", latent_channels=4, block_out_channels=[32, 32], image_size=16).eval()
    foreign = save_pipeline(root / "foreign", tiny_car(3, dim=16), other_kl, model_kind="car", tokenizer_kind="kl")
    return {"target": target, "draft": draft, "mar": marp, "foreign": foreign}


def test_kl_tokenizer_round_trip_and_layouts(tiny_kl, tmp_path):
    """Tokens are channels-last latents scaled by the config; a plain diffusers AutoencoderKL state dict loads as it
    is (keys without ``vae.``), config read from the shapes."""
    from safetensors.torch import save_file

    from vgen.models import load_official
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        t = tiny_kl.encode(x)
        assert t.shape == (2, 8, 8, 4)
        assert tiny_kl.decode(t).shape == (2, 3, 16, 16)
        assert tiny_kl.decode(t.flatten(1, 2)).shape == (2, 3, 16, 16)  # flat raster tokens of a square grid
    plain = {k[len("vae."):]: v for k, v in tiny_kl.state_dict().items()}
    save_file(plain, tmp_path / "diffusers_vae.safetensors")
    kl = load_official("kl", tmp_path / "diffusers_vae.safetensors", image_size=16)
    assert kl.config.block_out_channels == [32, 32] and kl.config.latent_channels == 4
    with torch.no_grad():
        torch.testing.assert_close(kl.decode(t), tiny_kl.decode(t))


def test_continuous_pipeline_generates_images_and_latents(pipes):
    from vgen import load_pipeline
    pipe = load_pipeline(str(pipes["target"]))
    gen = pipe.generate([0, 2], seed=1)  # the plain sampler: ar (the target alone)
    assert gen.images.shape == (2, 3, 16, 16) and gen.images.dtype == torch.uint8
    assert gen.tokens.shape == (2, 64, 4) and gen.tokens.is_floating_point()
    assert gen.stats["sampler"] == "ar" and gen.stats["forward_passes"] == 64
    assert gen.stats["options"]["cfg_scale"] == 2.0  # the card's settings
    again = pipe.generate([0, 2], seed=1)
    assert torch.equal(again.tokens, gen.tokens)


@pytest.mark.slow
def test_cspd_takes_the_draft_from_the_card_or_the_option(pipes):
    from vgen import load_pipeline
    pipe = load_pipeline(str(pipes["target"]))
    gen = pipe.generate([1], sampler="cspd", seed=0, num_draft=3)
    assert 0.0 <= gen.stats["acceptance_rate"] <= 1.0 and gen.stats["forward_passes"] <= 64
    assert gen.images.shape == (1, 3, 16, 16)
    named = pipe.generate([1], sampler="cspd", seed=0, num_draft=3, draft=str(pipes["draft"]))
    assert torch.equal(named.tokens, gen.tokens)
    path = pipe.generate([1], sampler="cspd", seed=0, num_draft=3, rule="path")
    assert path.tokens.shape == (1, 64, 4)


def test_step_logpdf_sums_to_the_path_logpdf():
    """DiffusionHead.step_logpdf (what car-distill trains on) is, summed over a path's steps, the path's density
    (path_logpdf and sample(path=True) agree), guided with per-row scales and clip_x0 on."""
    m = tiny_car(0)
    torch.manual_seed(1)
    R, C = 3, 4
    z, cfg = torch.randn(2 * R, m.config.dim), torch.tensor([1.5, 2.0, 3.0])
    with torch.no_grad():
        hs = m.sample_head(z, torch.randn(R, C), torch.randn(STEPS, R, C), 1.0, cfg, clip_x0=4.0, path=True)
        full = m.head_path_logpdf(z, hs.states, 1.0, cfg, clip_x0=4.0)
    r, i = torch.arange(R).repeat_interleave(STEPS), torch.arange(STEPS).repeat(R)
    lp = m.diffloss.step_logpdf(torch.cat([z[:R][r], z[R:][r]]), i, hs.states[i, r], hs.states[i + 1, r], 1.0, cfg[r],
                                clip_x0=4.0)
    tol = dict(rtol=1e-5, atol=1e-4)  # float32 networks summed in float64
    torch.testing.assert_close(lp.reshape(R, STEPS).sum(1), hs.path_logpdf, **tol)
    torch.testing.assert_close(lp.reshape(R, STEPS).sum(1), full, **tol)
    assert lp.requires_grad  # what the distillation trains through


@pytest.mark.slow
def test_car_distill_raises_the_drafts_density_of_target_paths(pipes, tiny_kl, tmp_path):
    """recipe=car-distill: target paths cached, the draft trained on them (held-out log P/Q falls, the path rule's
    acceptance of target paths does not fall), resumable, a pipeline folder the cspd sampler takes as its draft;
    a draft that does not fit, or a target whose classes are not the photos', is refused before any run folder
    exists."""
    from vgen import load_pipeline
    from vgen.data import NUM_CLASSES
    from vgen.pipeline import save_pipeline
    from vgen.train.car_distill import CarDistillConfig, train_car_distill
    sampling = {"cfg_scale": 2.0, "cfg_schedule": "linear", "clip_x0": 4.0}
    draft = save_pipeline(tmp_path / "draft", tiny_car(1, dim=16, num_classes=NUM_CLASSES), tiny_kl,
                          model_kind="car", tokenizer_kind="kl", sampling=sampling)
    target = save_pipeline(tmp_path / "target", tiny_car(0, num_classes=NUM_CLASSES), tiny_kl, model_kind="car",
                           tokenizer_kind="kl", sampling=sampling, extra={"draft": str(draft)})
    out = tmp_path / "run"
    cfg = CarDistillConfig(out=str(out), target=str(target), draft=str(draft), n_seq=16, n_test=8,
                           positions=8, batch_size=8, path_steps=STEPS, steps=20, save_every=10, warmup=2, lr=3e-3)
    m = train_car_distill(cfg)
    assert m["test_log_ratio"] < m["before"]["test_log_ratio"] - 0.1, m
    assert m["test_path_acceptance"] >= m["before"]["test_path_acceptance"] - 0.02, m
    cfg.steps = 22
    train_car_distill(cfg)
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r.get("final")] == [20, 22]
    own = train_car_distill(CarDistillConfig(out=str(tmp_path / "own"), target=str(target), draft=str(draft),
                                             contexts="target", n_seq=8, n_test=4, positions=4, batch_size=4,
                                             steps=2, save_every=2, warmup=1))
    ctx = torch.load(tmp_path / "own" / "contexts_test.pt", weights_only=True)  # the target's own samples
    assert ctx["mean"].shape == (4, 64, 4) and float(ctx["std"].abs().max()) == 0
    assert 0 <= own["test_path_acceptance"] <= 1
    pipe = load_pipeline(str(target))
    g = pipe.generate([1], sampler="cspd", seed=0, num_draft=3, rule="path", draft=str(out / "pipeline"))
    assert g.tokens.shape == (1, 64, 4) and 0.0 <= g.stats["acceptance_rate"] <= 1.0
    foreign = save_pipeline(tmp_path / "foreign", tiny_car(3, dim=16, num_classes=NUM_CLASSES),
                            load_pipeline(str(pipes["foreign"])).tokenizer, model_kind="car", tokenizer_kind="kl",
                            sampling=sampling)
    with pytest.raises(VGenError, match="contexts=nope"):
        train_car_distill(CarDistillConfig(out=str(tmp_path / "refused"), target=str(target), draft=str(draft),
                                           contexts="nope"))
    for t, d, msg in ((target, pipes["mar"], "not a causal continuous-token model"),
                      (target, foreign, "another tokenizer"),
                      (pipes["target"], pipes["draft"], "classes")):
        refused = tmp_path / "refused"
        with pytest.raises(VGenError, match=msg):
            train_car_distill(CarDistillConfig(out=str(refused), target=str(t), draft=str(d)))
        assert not refused.exists()


def test_draft_mismatches_are_one_line_errors_before_weights_load(pipes, tmp_path):
    import dataclasses

    from vgen.cards import Card
    from vgen.pipeline import resolve_sampler
    card = Card.load(str(pipes["target"]))
    with pytest.raises(VGenError, match="another tokenizer"):
        resolve_sampler(card, "cspd", draft=str(pipes["foreign"]))
    bad = tmp_path / "wide"
    bad.mkdir()
    c = json.loads((pipes["draft"] / "pipeline.json").read_text())
    c["latent_channels"] = 16
    (bad / "pipeline.json").write_text(json.dumps(c))
    with pytest.raises(VGenError, match="token type") as e:
        resolve_sampler(card, "cspd", draft=str(bad))
    assert "\n" not in str(e.value)
    nodraft = dataclasses.replace(card, draft="")
    with pytest.raises(VGenError, match="names no draft"):
        resolve_sampler(nodraft, "cspd")
    with pytest.raises(VGenError, match="nothing for continuous"):
        resolve_sampler(card, "ar", top_k=10)


def test_mar_pipeline_uses_its_own_sampler(pipes):
    from vgen import load_pipeline
    from vgen.samplers import fitting_samplers
    pipe = load_pipeline(str(pipes["mar"]))
    gen = pipe.generate([0, 1], seed=0)
    assert gen.stats["sampler"] == "mar" and gen.stats["forward_passes"] == 8  # the card's num_iter
    assert gen.images.shape == (2, 3, 16, 16) and gen.tokens.shape == (2, 64, 4)
    assert fitting_samplers(pipe.card) == ["mar"]
    with pytest.raises(VGenError, match="masked"):
        pipe.generate([0], sampler="sjd")


def test_vgen_sample_cli_on_a_continuous_model(pipes, tmp_path, capsys):
    from vgen.cli import main
    out = tmp_path / "s"
    main(["sample", f"model.path={pipes['target']}", "sampler=cspd", "sampler.num_draft=2", "num_samples=2",
          f"outdir={out}", "progress=false"])
    assert (out / "000000.png").exists() and (out / "000001.png").exists()
    st = json.loads((out / "stats.json").read_text())
    assert "acceptance_rate" in json.dumps(st)


def test_demo_races_cspd_against_the_target(pipes):
    from vgen.demo import LOCAL, Demo
    d = Demo(allowed_dirs=[str(pipes["target"].parent)])
    # the target as its own draft: every draft is accepted, so the race shows the passes saved
    res = d.race(LOCAL, str(pipes["target"]), 1, 0, ["cspd"], {"num_draft": 2, "draft": str(pipes["target"])})
    assert [r["sampler"] for r in res] == ["ar", "cspd"]
    assert res[0]["forward_passes"] == 64 and res[1]["forward_passes"] < 40
    assert res[1]["image"].shape == res[0]["image"].shape


def test_mar_kl_checkpoint_layout_loads_through_diffusers():
    """A KL autoencoder in MAR's (LDM's) key layout, made by the official code (tests/fixtures/README.md), loads
    into diffusers' AutoencoderKL through diffusers' converter and reproduces the official outputs."""
    from pathlib import Path

    from vgen.models import load_official
    fx = Path(__file__).parent / "fixtures"
    io = torch.load(fx / "mar_kl_small_io.pt", weights_only=True)
    kl = load_official("kl", fx / "mar_kl_small.safetensors", image_size=32)
    assert kl.config.block_out_channels == [32, 64] and kl.config.latent_channels == 4
    with torch.no_grad():
        post = kl.posterior(io["image"])
        torch.testing.assert_close(post.mean, io["posterior_mean"], atol=1e-4, rtol=0)
        torch.testing.assert_close(post.logvar, io["posterior_logvar"], atol=1e-4, rtol=0)
        torch.testing.assert_close(kl.vae.decode(io["z"]).sample, io["decoded"], atol=1e-4, rtol=0)


def test_kl_checkpoint_with_attention_inside_levels_is_refused():
    from pathlib import Path

    from safetensors.torch import load_file

    from vgen.models import load_official
    sd = load_file(Path(__file__).parent / "fixtures" / "mar_kl_small.safetensors")
    sd["encoder.down.1.attn.0.q.weight"] = torch.zeros(64, 64, 1, 1)  # LDM attn_resolutions at a level
    with pytest.raises(VGenError, match="attention inside its resolution levels"):
        load_official("kl", sd)
