"""Training recipes: a few steps as a smoke test, resume from the last checkpoint, export loads back."""
import json

import pytest
import torch

from vgen.errors import VGenError
from vgen.models import load_official
from vgen.train.gpt import GPTTrainConfig, train_gpt
from vgen.train.vq import VQTrainConfig, train_vq

TINY_VQ = dict(codebook_size=32, codebook_embed_dim=8, codebook_l2_norm=True, encoder_ch_mult=[1, 2, 2],
               decoder_ch_mult=[1, 2, 2], z_channels=32, ch=32, num_res_blocks=1)


@pytest.mark.slow
def test_vq_and_gpt_recipes_run_resume_and_export(tmp_path):
    vq_cfg = VQTrainConfig(out=str(tmp_path / "vq"), steps=3, batch_size=4, save_every=2, eval_n=8,
                           restart_every=2, model=TINY_VQ)
    m = train_vq(vq_cfg)
    assert 0 < m["codebook_usage"] <= 1 and m["test_psnr"] > 0
    state = torch.load(tmp_path / "vq" / "last.pt", weights_only=True)
    assert state["step"] == 3
    # resume: asking for more steps continues from step 3, not from scratch
    vq_cfg.steps = 4
    train_vq(vq_cfg)
    log = [json.loads(l) for l in (tmp_path / "vq" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r.get("final")] == [3, 4]
    vq = load_official("vq", tmp_path / "vq" / "vq.safetensors")
    assert vq.config.codebook_size == 32

    gcfg = GPTTrainConfig(out=str(tmp_path / "gpt"), tokenizer=str(tmp_path / "vq" / "vq.safetensors"), steps=2,
                          batch_size=4, n_train=16, n_test=8, save_every=1, precision="bf16",
                          model=dict(dim=32, n_layer=1, n_head=2, vocab_size=32, num_classes=16, block_size=256,
                                     cls_token_num=1))
    gm = train_gpt(gcfg)
    assert gm["test_loss"] > 0 and gm["steps"] == 2
    gpt = load_official("gpt", tmp_path / "gpt" / "gpt.safetensors")
    assert gpt.config.n_head == 2 and gpt.config.block_size == 256  # config travels in the metadata

    # NAR: the same loop and data with the next-neighbour model; its codes cache is reused when copied over
    from vgen.train.nar import NARTrainConfig, train_nar
    (tmp_path / "nar").mkdir()
    for f in ("codes_train.pt", "codes_test.pt"):
        (tmp_path / "nar" / f).write_bytes((tmp_path / "gpt" / f).read_bytes())
    ncfg = NARTrainConfig(out=str(tmp_path / "nar"), tokenizer=str(tmp_path / "vq" / "vq.safetensors"), steps=2,
                          batch_size=4, n_train=16, n_test=8, save_every=1,
                          model=dict(dim=32, n_layer=1, n_head=2, vocab_size=32, num_classes=16, block_size=256,
                                     cls_token_num=1, medusa_attention_num=1))
    nm = train_nar(ncfg)
    assert nm["test_loss"] > 0 and nm["steps"] == 2
    nar = load_official("nar", tmp_path / "nar" / "nar.safetensors")
    assert nar.config.n_layer == 1 and len(nar.layers) == 2 and nar.order == "next-neighbour"


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_photo_classifier_recipe_runs_resumes_and_loads(tmp_path):
    from vgen.eval.extractors import load_photo_classifier
    from vgen.train.photo import PhotoTrainConfig, train_photo
    cfg = PhotoTrainConfig(out=str(tmp_path / "cls"), arch="test_resnet", steps=3, batch_size=8, save_every=2,
                           eval_n=32, warmup=1)
    m = train_photo(cfg)
    assert 0 <= m["test_accuracy"] <= 1 and len(m["per_class_accuracy"]) == 16
    cfg.steps = 4
    train_photo(cfg)
    log = [json.loads(l) for l in (tmp_path / "cls" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r.get("final")] == [3, 4]
    clf = load_photo_classifier(tmp_path / "cls" / "classifier.safetensors")
    feats, logits = clf(torch.zeros(2, 3, 64, 64, dtype=torch.uint8))
    assert feats.shape == (2, clf.num_features) and logits.shape == (2, 16) and clf.arch == "test_resnet"


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_photo_classifier_recipe_learns_from_tokenizer_round_trips_and_continues_from_a_file(tmp_path):
    """recipe.roundtrip shows a share of the crops after a VQ round trip (labels unchanged) and reports accuracy on
    round trips of unseen crops; recipe.init continues from a classifier file; bad values fail before the run."""
    from vgen.eval.extractors import load_photo_classifier
    from vgen.train.photo import PhotoTrainConfig, round_trip, train_photo
    train_vq(VQTrainConfig(out=str(tmp_path / "vq"), steps=1, batch_size=2, save_every=1, eval_n=8, model=TINY_VQ))
    vq_path = tmp_path / "vq" / "vq.safetensors"
    base = dict(arch="test_resnet", steps=2, batch_size=8, save_every=2, eval_n=16, warmup=1, data="captioned")
    first = train_photo(PhotoTrainConfig(out=str(tmp_path / "a"), **base))
    assert "train_region_accuracy_roundtrip" not in first
    m = train_photo(PhotoTrainConfig(out=str(tmp_path / "b"), roundtrip=str(vq_path), roundtrip_share=0.5,
                                     init=str(tmp_path / "a" / "classifier.safetensors"), **base))
    for key in ("test_accuracy_roundtrip", "train_region_accuracy", "train_region_accuracy_roundtrip"):
        assert 0 <= m[key] <= 1
    vq = load_official("vq", vq_path).eval()
    x = torch.randint(0, 256, (3, 3, 64, 64), dtype=torch.uint8)
    rt = round_trip(vq, x, batch=2)
    assert rt.dtype == torch.uint8 and rt.shape == x.shape and not torch.equal(rt, x)
    clf = load_photo_classifier(tmp_path / "b" / "classifier.safetensors")
    assert clf.arch == "test_resnet"
    with pytest.raises(VGenError, match="roundtrip_share is a share"):
        train_photo(PhotoTrainConfig(out=str(tmp_path / "bad"), roundtrip=str(vq_path), roundtrip_share=2.0, **base))
    with pytest.raises(VGenError, match="not found"):
        train_photo(PhotoTrainConfig(out=str(tmp_path / "bad2"), roundtrip=str(tmp_path / "none.safetensors"), **base))
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad2").exists()


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_msvq_and_var_recipes_run_resume_and_export(tmp_path):
    from vgen.train.msvq import MSVQTrainConfig, train_msvq
    from vgen.train.var import VARTrainConfig, train_var
    mcfg = MSVQTrainConfig(out=str(tmp_path / "msvq"), steps=2, batch_size=4, save_every=1, eval_n=8,
                           restart_every=1, model=dict(vocab_size=32, z_channels=8, ch=32, ch_mult=[1, 2, 2],
                                                       num_res_blocks=1, v_patch_nums=[1, 2, 4, 8, 16]))
    m = train_msvq(mcfg)
    assert 0 < m["codebook_usage"] <= 1 and m["test_psnr"] > 0
    mcfg.steps = 3  # resume continues from step 2
    train_msvq(mcfg)
    log = [json.loads(l) for l in (tmp_path / "msvq" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r.get("final")] == [2, 3]
    vae = load_official("msvq", tmp_path / "msvq" / "msvq.safetensors")
    assert vae.patch_nums == [1, 2, 4, 8, 16]  # scale schedule travels in the metadata

    vcfg = VARTrainConfig(out=str(tmp_path / "var"), tokenizer=str(tmp_path / "msvq" / "msvq.safetensors"), steps=2,
                          batch_size=4, n_train=8, n_test=4, save_every=1,
                          model=dict(vocab_size=32, Cvae=8, depth=1, embed_dim=32, num_heads=2, num_classes=16,
                                     patch_nums=[1, 2, 4, 8, 16]))
    vm = train_var(vcfg)
    assert vm["test_loss"] > 0 and vm["steps"] == 2 and len(vm["test_loss_per_scale"]) == 5
    var = load_official("var", tmp_path / "var" / "var.safetensors")
    assert var.config.embed_dim == 32 and var.patch_nums == [1, 2, 4, 8, 16]


class _Crash(Exception):
    pass


def _train_with_crash(train, cfg, monkeypatch, at_step):
    """Run ``train(cfg)`` as if the process died right after writing the checkpoint of ``at_step``."""
    from vgen.train.common import RunDir
    save = RunDir.save

    def save_then_crash(self, state):
        save(self, state)
        if state["step"] == at_step:
            raise _Crash
    with monkeypatch.context() as m:
        m.setattr(RunDir, "save", save_then_crash)
        with pytest.raises(_Crash):
            train(cfg)


def _tiny_vq_file(path):
    from dataclasses import asdict

    from vgen.tokenizers.vq import VQConfig, VQModel
    from vgen.train.common import RunDir
    torch.manual_seed(0)
    vq = VQModel(VQConfig(**TINY_VQ))
    return str(RunDir(path).export("vq.safetensors", vq.state_dict(), asdict(vq.config)))


@pytest.mark.slow  # quick loop: kept under 3 minutes
@pytest.mark.parametrize("recipe", ["vq", "gpt"])
def test_interrupted_run_resumes_bit_identically(tmp_path, monkeypatch, recipe):
    """N steps in one go == N/2 steps, a crash after the checkpoint, and a resumed run for the rest: same weights,
    optimiser state, recipe state (VQ's code usage, with dead-code restarts drawing from the restored RNG)
    and metrics. The GPT has dropout, so its RNG must come back too."""
    if recipe == "vq":
        def make(out):
            # a codebook larger than a batch's 16 x 16 tokens: dead codes, restarted at steps 2 and 4
            return VQTrainConfig(out=str(out), steps=6, batch_size=1, save_every=3, eval_n=8, restart_every=2,
                                 model=dict(TINY_VQ, codebook_size=1024), device="cpu")
        train, export = train_vq, "vq.safetensors"
    else:
        tok = _tiny_vq_file(tmp_path / "tok")

        def make(out):
            return GPTTrainConfig(out=str(out), tokenizer=tok, steps=6, batch_size=4, n_train=16, n_test=8,
                                  save_every=3, precision="fp32", device="cpu",
                                  model=dict(dim=32, n_layer=1, n_head=2, vocab_size=32, num_classes=16,
                                             block_size=256, cls_token_num=1, class_dropout_prob=0.5,
                                             resid_dropout_p=0.1, ffn_dropout_p=0.1))
        train, export = train_gpt, "gpt.safetensors"
    once = train(make(tmp_path / "once"))
    _train_with_crash(train, make(tmp_path / "twice"), monkeypatch, at_step=3)
    assert torch.load(tmp_path / "twice" / "last.pt", weights_only=True)["step"] == 3
    twice = train(make(tmp_path / "twice"))
    assert once == twice
    from safetensors.torch import load_file
    a, b = load_file(tmp_path / "once" / export), load_file(tmp_path / "twice" / export)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa = torch.load(tmp_path / "once" / "last.pt", weights_only=True)
    sb = torch.load(tmp_path / "twice" / "last.pt", weights_only=True)
    assert sa.keys() == sb.keys() and sa["step"] == sb["step"] == 6
    assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])
    for i, st in sa["opt"]["state"].items():
        assert all(torch.equal(v, sb["opt"]["state"][i][k]) for k, v in st.items())
    assert all(t.device.type == "cpu" for t in sa["model"].values())
    if recipe == "vq":
        assert torch.equal(sa["last_used"], sb["last_used"])


RECIPES = ["vq", "gpt", "nar", "photo", "msvq", "var"]


def _recipe(name):
    import importlib
    mod = importlib.import_module(f"vgen.train.{name}")
    cls = {"vq": "VQ", "gpt": "GPT", "nar": "NAR", "photo": "Photo", "msvq": "MSVQ", "var": "VAR"}[name]
    return getattr(mod, f"{cls}TrainConfig"), getattr(mod, f"train_{name}")


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_has_a_device_field_checked_before_any_work(tmp_path, recipe):
    from vgen.errors import VGenError
    config_cls, train = _recipe(recipe)
    assert config_cls().device == "cpu"
    cfg = config_cls(out=str(tmp_path / "run"), device="meta")
    with pytest.raises(VGenError, match="meta"):
        train(cfg)
    assert not (tmp_path / "run").exists()  # failed up front: no run folder, no tokenizer load, no training


@pytest.mark.parametrize("device", ["meta", "nonsense", "cuda:99", "", "cpu:x"])
def test_train_device_rejects_what_cannot_train_clearly(device):
    from vgen.errors import VGenError
    from vgen.train.common import train_device
    with pytest.raises(VGenError, match="device"):
        train_device(device)


def test_train_device_accepts_cpu():
    from vgen.train.common import train_device
    assert train_device("cpu") == torch.device("cpu")


@pytest.mark.cuda
def test_recipes_train_on_cuda_and_checkpoint_for_the_cpu(tmp_path):
    vq_cfg = VQTrainConfig(out=str(tmp_path / "vq"), steps=4, batch_size=4, save_every=2, eval_n=8,
                           restart_every=2, model=TINY_VQ, device="cuda")
    train_vq(vq_cfg)
    state = torch.load(tmp_path / "vq" / "last.pt", weights_only=True)  # no map_location: CPU tensors inside
    assert state["last_used"].device.type == "cpu" and "cuda" in state["rng"]
    vq_cfg.steps = 5
    train_vq(vq_cfg)
    gm = train_gpt(GPTTrainConfig(out=str(tmp_path / "gpt"), tokenizer=str(tmp_path / "vq" / "vq.safetensors"),
                                  steps=2, batch_size=4, n_train=16, n_test=8, save_every=1, precision="bf16",
                                  device="cuda", model=dict(dim=32, n_layer=1, n_head=2, vocab_size=32,
                                                            num_classes=16, block_size=256, cls_token_num=1)))
    assert gm["steps"] == 2 and gm["test_loss"] > 0


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_vq_recipe_fine_tunes_on_captioned_crops(tmp_path):
    """recipe.data=captioned trains on photos-t2i's treated crops and reports how often a round trip keeps each
    treatment; recipe.init starts from a trained VQ (its architecture, not recipe.model)."""
    base = VQTrainConfig(out=str(tmp_path / "base"), steps=1, batch_size=2, save_every=1, eval_n=8, model=TINY_VQ)
    train_vq(base)
    cfg = VQTrainConfig(out=str(tmp_path / "ft"), steps=2, batch_size=2, save_every=1, eval_n=16, data="captioned",
                        init=str(tmp_path / "base" / "vq.safetensors"), model={"codebook_size": 999})
    m = train_vq(cfg)
    assert 0 <= m["colour_kept"] <= 1 and 0 <= m["brightness_kept"] <= 1
    assert set(m["colour_kept_by_value"]) <= {"natural", "black and white", "warm", "cool"}
    assert load_official("vq", tmp_path / "ft" / "vq.safetensors").config.codebook_size == 32  # the init's
    with pytest.raises(VGenError, match="recipe.data must be photos or captioned"):
        train_vq(VQTrainConfig(out=str(tmp_path / "bad"), data="coco"))
    with pytest.raises(VGenError, match="not found"):
        train_vq(VQTrainConfig(out=str(tmp_path / "bad2"), init=str(tmp_path / "missing.safetensors")))


def test_a_gpt_deepened_by_repeating_its_layers_computes_the_same_function():
    """recipe=t2i grows a GPT it continues from to recipe.model.n_layer: each layer repeated, the repeats' output
    projections zeroed, so the deeper model starts from the same logits (and trains from there)."""
    from vgen.models.gpt import GPT, GPTConfig
    from vgen.train.t2i import deepen
    torch.manual_seed(0)
    small = dict(dim=32, n_head=2, vocab_size=64, block_size=16, model_type="t2i", cls_token_num=4, caption_dim=8)
    g2 = GPT(GPTConfig(n_layer=2, **small)).eval()
    for p in g2.parameters():  # every weight non-zero, so a repeat left active would show
        torch.nn.init.normal_(p, 0.0, 0.2)
    g6 = GPT(GPTConfig(n_layer=6, **small)).eval()
    grown = deepen(g2.state_dict(), 6)
    g6.load_state_dict(grown)
    x, c = torch.randint(0, 64, (3, 16)), torch.randn(3, 4, 8)
    with torch.no_grad():
        torch.testing.assert_close(g6(x, c), g2(x, c), rtol=1e-5, atol=1e-5)
    assert torch.equal(grown["layers.3.attention.wqkv.weight"], g2.state_dict()["layers.1.attention.wqkv.weight"])
    assert not grown["layers.4.feed_forward.w2.weight"].any() and grown["layers.3.feed_forward.w2.weight"].any()
    assert deepen(g2.state_dict(), 2) is not None and len(deepen(g2.state_dict(), 2)) == len(g2.state_dict())
    with pytest.raises(VGenError, match="multiple of the GPT continued from"):
        deepen(g2.state_dict(), 3)


@pytest.mark.slow
def test_t2i_recipe_runs_exports_and_continues_from_a_pipeline(tmp_path):
    """recipe=t2i at toy size: caption tokenizer, codes, GPT + T5 end to end, the pipeline folder (loads and
    samples from prompts); recipe.init_pipeline continues from that folder (every GPT tensor, its encoder and
    caption tokenizer) instead of starting the caption path afresh."""
    import vgen
    from vgen.train.t2i import T2ITrainConfig, train_t2i
    train_vq(VQTrainConfig(out=str(tmp_path / "vq"), steps=1, batch_size=2, save_every=1, eval_n=8, model=TINY_VQ))
    tiny = dict(out=str(tmp_path / "t2i"), tokenizer=str(tmp_path / "vq" / "vq.safetensors"), init_gpt="", steps=2,
                batch_size=2, n_train=8, n_test=4, save_every=1, caption_tokens=8,
                text=dict(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2),
                model=dict(dim=32, n_layer=1, n_head=2, vocab_size=32, block_size=256, class_dropout_prob=0.1),
                sampling=dict(cfg_scale=3.0, top_k=8))
    m = train_t2i(T2ITrainConfig(**tiny))
    folder = tmp_path / "t2i" / "pipeline"
    assert m["steps"] == 2 and m["init_tensors_copied"] == 0
    pipe = vgen.load_pipeline(str(folder))
    assert pipe.card.conditioning == "text"
    g = pipe.generate(prompts=["a photo of the cat"], seed=0)
    assert g.images.shape == (1, 3, 64, 64)

    cont = train_t2i(T2ITrainConfig(**{**tiny, "out": str(tmp_path / "more"), "init_pipeline": str(folder),
                                       "subject_dropout": 0.3, "treatments": 2}))
    assert torch.load(tmp_path / "more" / "codes_train_v1.pt", weights_only=True)["codes"].shape[0] == 8
    gpt_keys = len(load_official("gpt", folder / "gpt.safetensors").state_dict())
    assert cont["init_tensors_copied"] == gpt_keys
    copied_tokenizer = (tmp_path / "more" / "text" / "tokenizer.json").read_text()
    assert copied_tokenizer == (folder / "text" / "tokenizer.json").read_text()
    with pytest.raises(VGenError, match="not found"):
        train_t2i(T2ITrainConfig(**{**tiny, "out": str(tmp_path / "bad"), "init_pipeline": str(tmp_path / "none")}))
    with pytest.raises(VGenError, match="subject_dropout is a share"):
        train_t2i(T2ITrainConfig(**{**tiny, "out": str(tmp_path / "bad2"), "subject_dropout": 1.5}))
    assert not (tmp_path / "bad2").exists()
    deeper = train_t2i(T2ITrainConfig(**{**tiny, "out": str(tmp_path / "deeper"), "init_pipeline": str(folder),
                                         "steps": 1, "model": {**tiny["model"], "n_layer": 2}}))
    assert deeper["gpt_params"] > m["gpt_params"]
    assert load_official("gpt", tmp_path / "deeper" / "pipeline" / "gpt.safetensors").config.n_layer == 2
    with pytest.raises(VGenError, match="multiple of the GPT continued from"):
        train_t2i(T2ITrainConfig(**{**tiny, "out": str(tmp_path / "bad4"),
                                    "init_pipeline": str(tmp_path / "deeper" / "pipeline"),
                                    "model": {**tiny["model"], "n_layer": 3}}))
    assert not (tmp_path / "bad4").exists()
    with pytest.raises(VGenError, match="treatments is how many looks"):
        train_t2i(T2ITrainConfig(**{**tiny, "out": str(tmp_path / "bad3"), "treatments": 0}))
    assert not (tmp_path / "bad3").exists()
