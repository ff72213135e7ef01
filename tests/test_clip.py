"""CLIP score (vgen.eval.clip_score, `vgen eval clip`) and prompt files (vgen.io.read_prompts), offline.

No CLIP weights or vocabulary can be downloaded here, so the models are transformers ``CLIPModel``s with random
weights, saved as the Hugging Face folders OpenAI's are (config.json, model.safetensors), with a CLIP tokenizer made
from a synthetic byte-level vocabulary (every byte, alone and word-final, and a few merges: it tokenizes any text,
one character a token). One model has the standard ViT-B/32 shapes (transformers' ``CLIPConfig()`` defaults); the
others are tiny. The numbers mean nothing: the code path and the arithmetic are what is tested."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from vgen.errors import VGenError, VGenWarning
from vgen.io import read_prompts

transformers = pytest.importorskip("transformers")
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizerFast  # noqa: E402

from vgen.eval.clip import MODELS, clip_score, clip_weights_folder, load_clip, read_config  # noqa: E402

MERGES = [("t", "h"), ("th", "e</w>"), ("a", "t</w>"), ("o", "g</w>"), ("c", "at</w>"), ("i", "n</w>")]
PROMPTS = ["a photo of a cat", "the dog in the snow", "A red car at night", "two birds on a wire",
           "an astronaut", "a bowl of fruit, painted", "city skyline"]
B32 = MODELS["ViT-B/32"]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's (and CLIP's) byte -> printable character table."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_tokenizer(folder) -> tuple[int, int, int]:
    """vocab.json + merges.txt of a small CLIP BPE (the layout of OpenAI's files); -> (vocab size, bos, eos)."""
    chars = list(bytes_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + [a + b for a, b in MERGES] + ["<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    return len(vocab), len(vocab) - 2, len(vocab) - 1


def special_ids() -> dict:
    n = 2 * 256 + len(MERGES) + 2
    return dict(bos_token_id=n - 2, eos_token_id=n - 1, pad_token_id=n - 1)


def tiny_config(image_size: int = 32) -> CLIPConfig:
    n = 2 * 256 + len(MERGES) + 2
    text = dict(vocab_size=n, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=77, **special_ids())
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=image_size, patch_size=8)
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)


def make_clip(folder, config: CLIPConfig, seed: int = 0, processor: bool = True):
    """A CLIP weights folder as `hf download openai/clip-...` leaves it: config.json, model.safetensors,
    vocab.json, merges.txt (and preprocessor_config.json unless ``processor`` is False)."""
    torch.manual_seed(seed)
    model = CLIPModel(config).eval()
    model.save_pretrained(folder)
    write_tokenizer(folder)
    if processor:
        s = config.vision_config.image_size
        CLIPImageProcessor(size={"shortest_edge": s}, crop_size={"height": s, "width": s}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_clip(tmp_path_factory.mktemp("clip") / "tiny", tiny_config(), seed=1)


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("VGEN_CLIP_WEIGHTS", raising=False)


def images(n: int, size, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randint(0, 256, (n, 3, h, w), generator=g, dtype=torch.uint8)


def reference_cosines(folder, imgs: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """The straightforward computation, one pair at a time: images already at the model's input size (so the
    processor only scales and normalises), OpenAI's mean / std by hand, get_image_features / get_text_features,
    L2-normalise, cosine."""
    model = CLIPModel.from_pretrained(folder).eval()
    tok = CLIPTokenizerFast.from_pretrained(folder)
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(3, 1, 1)
    assert imgs.shape[-1] == imgs.shape[-2] == model.config.vision_config.image_size
    out = []
    with torch.no_grad():
        for im, p in zip(imgs, prompts):
            x = ((im.float() / 255 - mean) / std)[None]
            e = tok([p], truncation=True, max_length=77, return_tensors="pt")
            a = model.get_image_features(pixel_values=x)
            b = model.get_text_features(input_ids=e["input_ids"], attention_mask=e["attention_mask"])
            a, b = (t if torch.is_tensor(t) else t.pooler_output for t in (a, b))
            out.append((a / a.norm(dim=-1, keepdim=True) * (b / b.norm(dim=-1, keepdim=True))).sum().item())
    return torch.tensor(out, dtype=torch.float64)


# ---- the score ------------------------------------------------------------------------------------------------
@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_the_standard_vit_b32_shapes(tmp_path):
    """transformers' CLIPConfig() is ViT-B/32 (the shapes of openai/clip-vit-base-patch32); one random-weights
    model of those shapes, without preprocessor_config.json (the OpenAI preprocessing by default), scores two
    224 px images as the straightforward computation does."""
    cfg = CLIPConfig(text_config=special_ids())
    v, t = cfg.vision_config, cfg.text_config
    assert (v.patch_size, v.hidden_size, v.num_hidden_layers, v.image_size, cfg.projection_dim) == B32.arch()
    assert (t.hidden_size, t.num_hidden_layers, t.max_position_embeddings, t.vocab_size) == (512, 12, 77, 49408)
    folder = make_clip(tmp_path / "b32", cfg, seed=3, processor=False)
    ims, prompts = images(2, 224, seed=5), ["a photo of a cat", "the dog in the snow"]
    res = clip_score(ims, prompts, weights=folder)
    assert res["model"] == "ViT-B/32" and res["n"] == 2 and res["weights"] == str(folder)
    cos = reference_cosines(folder, ims, prompts)
    expected = (100 * cos).clamp(min=0)
    assert torch.allclose(torch.tensor(res["scores"], dtype=torch.float64), expected, atol=1e-4, rtol=0)
    assert abs(res["mean"] - expected.mean().item()) < 1e-4
    assert res["clamped"] == int((cos < 0).sum())


def test_the_score_is_the_straightforward_computation(tiny):
    ims = images(len(PROMPTS), 32, seed=1)
    res = clip_score(ims, PROMPTS, weights=tiny, batch_size=4)
    cos = reference_cosines(tiny, ims, PROMPTS)
    expected = (100 * cos).clamp(min=0)
    assert torch.allclose(torch.tensor(res["scores"], dtype=torch.float64), expected, atol=1e-4, rtol=0)
    assert res["n"] == len(PROMPTS) and res["model"].startswith("custom (patch 8, width 32")
    assert abs(res["mean"] - expected.mean().item()) < 1e-4
    assert abs(res["std"] - expected.std(correction=0).item()) < 1e-4


def test_the_clamp_is_per_pair(tiny):
    """A pair whose cosine is negative scores 0 (it does not pull the mean down); the mean is of the clamped
    scores, not the clamp of the mean."""
    ims = images(len(PROMPTS), 32, seed=1)
    res = clip_score(ims, PROMPTS, weights=tiny)
    cos = reference_cosines(tiny, ims, PROMPTS)
    neg = cos < 0
    assert 0 < int(neg.sum()) < len(PROMPTS), "the case needs negative and positive pairs"
    assert res["clamped"] == int(neg.sum())
    scores = torch.tensor(res["scores"], dtype=torch.float64)
    assert (scores[neg] == 0).all() and (scores[~neg] > 0).all()
    assert res["mean"] > max(100 * cos.mean().item(), 0) + 1  # the clamp of the mean would be lower


def test_batch_size_and_source_do_not_change_the_score(tiny, tmp_path):
    ims = images(len(PROMPTS), (40, 56), seed=2)  # not the model's size: resized and cropped
    first = clip_score(ims, PROMPTS, weights=tiny, batch_size=1)["scores"]
    for b in (3, len(PROMPTS), 64):
        assert np.allclose(clip_score(ims, PROMPTS, weights=tiny, batch_size=b)["scores"], first, atol=1e-4, rtol=0)
    npz = tmp_path / "samples.npz"
    np.savez(npz, arr_0=ims.permute(0, 2, 3, 1).numpy())
    assert np.allclose(clip_score(str(npz), PROMPTS, weights=tiny)["scores"], first, atol=1e-4, rtol=0)
    nhwc = ims.permute(0, 2, 3, 1).numpy()
    assert np.allclose(clip_score(nhwc, PROMPTS, weights=tiny)["scores"], first, atol=1e-4, rtol=0)


def test_the_preprocessing_is_clips(tmp_path):
    """Without preprocessor_config.json: shortest side to the model's size (bicubic), center crop, OpenAI mean /
    std, as OpenAI's own transform does it (PIL bicubic; the rounding of resized pixels aside)."""
    from PIL import Image
    folder = make_clip(tmp_path / "noproc", tiny_config(image_size=32), processor=False)
    proc = load_clip(folder, read_config(folder, "ViT-B/32")[0])[2]
    assert list(proc.to_dict()["image_mean"]) == [0.48145466, 0.4578275, 0.40821073]
    assert list(proc.to_dict()["image_std"]) == [0.26862954, 0.26130258, 0.27577711]
    im = images(1, (100, 80), seed=4)[0]
    got = proc(images=[im], return_tensors="pt")["pixel_values"][0]
    pil = Image.fromarray(im.permute(1, 2, 0).numpy()).resize((32, 40), Image.BICUBIC)  # 80 -> 32, 100 -> 40
    a = torch.from_numpy(np.array(pil)).permute(2, 0, 1).float()[:, 4:36, :] / 255  # center crop 32
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(3, 1, 1)
    want = (a - mean) / std
    assert got.shape == want.shape == (3, 32, 32)
    assert (got - want).abs().mean() < 0.01 and (got - want).abs().max() < 0.1


def test_prompts_are_truncated_to_77_tokens(tiny):
    """CLIP reads 77 tokens: start, 75, end (single-letter words are one token each here)."""
    words = [chr(ord("a") + i % 26) for i in range(100)]
    long, cut = " ".join(words), " ".join(words[:75])
    ims = images(1, 32, seed=6).repeat(2, 1, 1, 1)
    with pytest.warns(VGenWarning, match="1 of 2 prompts are longer than CLIP's 77 tokens"):
        res = clip_score(ims, [long, cut], weights=tiny)
    assert res["truncated"] == 1
    assert abs(res["scores"][0] - res["scores"][1]) < 1e-4
    other = clip_score(ims[:1], [" ".join(words[:74])], weights=tiny)["scores"][0]
    assert abs(other - res["scores"][1]) > 1e-3  # one word fewer is another prompt


# ---- where the weights come from ------------------------------------------------------------------------------
def put_in_hf_cache(cache, repo_id, folder, revision="main"):
    """``folder``'s files as the cached snapshot of ``repo_id`` (the layout huggingface_hub writes)."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in folder.iterdir():
        (snap / f.name).symlink_to(f)
    return snap


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_weights_from_the_env_and_the_hf_cache(tiny, hf_cache, monkeypatch):
    ims = images(2, 32, seed=7)
    want = clip_score(ims, PROMPTS[:2], weights=tiny)["scores"]
    snap = put_in_hf_cache(hf_cache, B32.repo, tiny)
    assert clip_weights_folder(None, "ViT-B/32") == snap  # the cache, offline, when nothing else names a folder
    assert clip_score(ims, PROMPTS[:2])["scores"] == want
    assert clip_weights_folder(f"hf://{B32.repo}") == snap
    monkeypatch.setenv("VGEN_CLIP_WEIGHTS", str(tiny))
    assert clip_weights_folder(None) == tiny  # $VGEN_CLIP_WEIGHTS before the cache
    assert clip_weights_folder(snap) == snap  # weights= before both
    monkeypatch.delenv("VGEN_CLIP_WEIGHTS")
    with pytest.raises(VGenError) as e:
        clip_weights_folder(None, "ViT-L/14")
    assert_one_line(e, "ViT-L/14", "not in the local Hugging Face cache", "never downloading",
                    f"download {MODELS['ViT-L/14'].repo} config.json model.safetensors", "VGEN_CLIP_WEIGHTS")
    import huggingface_hub.constants as constants  # online as far as huggingface_hub knows: still the cache only
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert clip_weights_folder(None, "ViT-B/32") == snap
    with pytest.raises(VGenError) as e:
        clip_weights_folder(None, "ViT-L/14")
    assert_one_line(e, "not in the local Hugging Face cache", "never downloading")


def test_the_folder_must_hold_the_named_model(tmp_path):
    b32 = tmp_path / "b32"
    CLIPConfig().save_pretrained(b32)
    assert read_config(b32, "ViT-B/32")[1] == "ViT-B/32"
    with pytest.raises(VGenError) as e:
        read_config(b32, "ViT-L/14")
    assert_one_line(e, "holds ViT-B/32", "not ViT-L/14", "clip_model=ViT-B/32")
    l14 = tmp_path / "l14"
    CLIPConfig(vision_config=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                  num_attention_heads=16, patch_size=14),
               text_config=dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12),
               projection_dim=768).save_pretrained(l14)
    assert read_config(l14, "ViT-L/14")[1] == "ViT-L/14"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(VGenError) as e:
        read_config(tmp_path / "other", "ViT-B/32")
    assert_one_line(e, "not a CLIP model's config", "'bert'")


# ---- one-line errors ------------------------------------------------------------------------------------------
def assert_one_line(err, *words):
    msg = str(err.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)


def test_missing_weights_are_one_line(tiny, tmp_path, monkeypatch):
    ims = images(2, 32)
    with pytest.raises(VGenError) as e:
        clip_score(ims, PROMPTS[:2], weights=tmp_path / "nope")
    assert_one_line(e, str(tmp_path / "nope"), "does not exist", f"download {B32.repo}", "--local-dir")
    monkeypatch.setenv("VGEN_CLIP_WEIGHTS", str(tmp_path / "nope"))
    with pytest.raises(VGenError) as e:
        clip_score(ims, PROMPTS[:2], model="ViT-L/14")
    assert_one_line(e, "$VGEN_CLIP_WEIGHTS", "does not exist", f"download {MODELS['ViT-L/14'].repo}")
    monkeypatch.delenv("VGEN_CLIP_WEIGHTS")
    partial = tmp_path / "partial"
    partial.mkdir()
    for f in tiny.iterdir():
        if f.name != "model.safetensors":
            (partial / f.name).symlink_to(f)
    with pytest.raises(VGenError) as e:
        clip_score(ims, PROMPTS[:2], weights=partial)
    assert_one_line(e, str(partial), "has no model.safetensors", "download", "model.safetensors")
    from safetensors.torch import load_file, save_file
    sd = load_file(tiny / "model.safetensors")
    sd.pop("text_projection.weight")
    save_file(sd, partial / "model.safetensors")
    with pytest.raises(VGenError) as e:  # a missing tensor would stay random: refused
        clip_score(ims, PROMPTS[:2], weights=partial)
    assert_one_line(e, str(partial), "text_projection.weight", "download")
    (partial / "vocab.json").unlink()
    (partial / "model.safetensors").unlink()
    (partial / "config.json").unlink()
    with pytest.raises(VGenError) as e:
        clip_weights_folder(partial)
    assert_one_line(e, "has no config.json and no model.safetensors and no tokenizer.json (or vocab.json and "
                       "merges.txt)")
    with pytest.raises(VGenError) as e:
        clip_weights_folder(tiny / "config.json")
    assert_one_line(e, "is a file")
    with pytest.raises(VGenError) as e:
        clip_score(ims, PROMPTS[:2], model="ViT-H/14", weights=tiny)
    assert_one_line(e, "unknown CLIP model 'ViT-H/14'", "ViT-B/32, ViT-L/14")


def test_bad_inputs_are_one_line(tiny, monkeypatch):
    import vgen.eval.clip as clip
    monkeypatch.setattr(clip, "load_clip", lambda *a, **k: pytest.fail("loaded the model before checking"))
    ims = images(3, 32)
    cases = [
        (dict(images=ims, prompts=PROMPTS[:2]), ["3 images but 2 prompts"]),
        (dict(images=ims, prompts=[]), ["prompts is empty"]),
        (dict(images=ims, prompts="a cat"), ["list of strings"]),
        (dict(images=ims, prompts=["a", "", "c"]), ["prompts[1] is empty"]),
        (dict(images=ims, prompts=["a", 3, "c"]), ["prompts[1] is int"]),
        (dict(images=ims.float(), prompts=PROMPTS[:3]), ["expected uint8 images", "torch.float32"]),
        (dict(images=ims[:, :1], prompts=PROMPTS[:3]), ["3 colour channels"]),
        (dict(images=ims, prompts=PROMPTS[:3], batch_size=0), ["batch_size"]),
        (dict(images=ims, prompts=PROMPTS[:3], device="gpu"), ["device='gpu'"]),
    ]
    for kw, words in cases:
        with pytest.raises(VGenError) as e:
            clip_score(weights=tiny, **kw)
        assert_one_line(e, *words)


# ---- prompt files ---------------------------------------------------------------------------------------------
def test_read_prompts_forms(tmp_path):
    want = ["a cat, sitting", "the dog", "a \"quoted\" car"]
    txt = tmp_path / "p.txt"
    txt.write_bytes("a cat, sitting\r\n  the dog \r\na \"quoted\" car".encode())  # CRLF, no final newline
    assert read_prompts(txt) == want
    jl = tmp_path / "p.jsonl"
    jl.write_text("".join(json.dumps({"id": i, "caption": p, "text": "x"}) + "\n" for i, p in enumerate(want)))
    assert read_prompts(jl) == want  # caption before prompt / text
    assert read_prompts(jl, "text") == ["x"] * 3
    with open(tmp_path / "p.csv", "w", newline="", encoding="utf-8-sig") as f:
        w = csv.writer(f)
        w.writerow(["file", "prompt"])
        w.writerows([[f"{i:06d}.png", p] for i, p in enumerate(want)])
    assert read_prompts(tmp_path / "p.csv") == want
    js = tmp_path / "p.json"
    js.write_text(json.dumps(want))
    assert read_prompts(js) == want
    js.write_text(json.dumps([{"text": p} for p in want]))
    assert read_prompts(js) == want


def test_read_prompts_errors_are_one_line(tmp_path):
    def err(name, content, *words, column=None):
        p = tmp_path / name
        if content is not None:
            p.write_text(content)
        with pytest.raises(VGenError) as e:
            read_prompts(p, column)
        assert_one_line(e, *words)

    err("blank.txt", "a cat\n\nthe dog\n", "blank.txt: line 2 is blank")
    err("space.txt", "a cat\nthe dog\n   \n", "space.txt: line 3 is blank")
    err("missing.txt", None, "missing.txt does not exist")
    err("p.yaml", "- a\n", "unknown prompt file type '.yaml'", ".jsonl")
    err("empty.txt", "", "empty.txt holds no prompts")
    err("col.txt", "a\n", "no columns", "prompt_column=x", column="x")
    err("nocol.csv", "file,label\n0.png,3\n", "nocol.csv: the header (line 1) has none of the columns 'caption', "
        "'prompt', 'text'", "'file', 'label'", "prompt_column=")
    err("named.csv", "file,caption\n0.png,a cat\n", "has no column 'prompt'", "'file', 'caption'", column="prompt")
    err("short.csv", "file,caption\n0.png,a cat\n1.png\n", "short.csv: line 3 has 1 fields and no value in column "
        "'caption'")
    err("blank.csv", "caption\na cat\n\nthe dog\n", "blank.csv: line 3 is blank")
    err("nocol.jsonl", '{"caption": "a"}\n{"text": "b"}\n', "nocol.jsonl: line 2 has no column 'caption'")
    err("nokey.jsonl", '{"label": 1}\n', "nokey.jsonl: line 1 has none of the columns", "'label'")
    err("bad.jsonl", '{"caption": "a"}\n{caption: b}\n', "bad.jsonl: line 2 is not JSON")
    err("blank.jsonl", '{"caption": "a"}\n\n{"caption": "b"}\n', "blank.jsonl: line 2 is blank")
    err("num.jsonl", '{"caption": 3}\n', "line 1: column 'caption' is int")
    err("empty.jsonl", '{"caption": " "}\n', "line 1: column 'caption' is empty")
    err("dict.json", '{"a": 1}', "dict.json holds a JSON dict", "list")
    err("items.json", '["a", 3]', "items.json[1] is a JSON int")
    (tmp_path / "folder").mkdir()
    err("folder", None, "is a folder", ".txt")


# ---- the command ----------------------------------------------------------------------------------------------
def run_cli(argv, capsys) -> tuple[int, str, str]:
    from vgen.cli import main
    try:
        main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err.strip()


def test_vgen_eval_clip(tiny, tmp_path, capsys):
    from vgen.io import save_png
    ims = images(len(PROMPTS), 32, seed=8)
    samples = tmp_path / "samples"
    for i, im in enumerate(ims):
        save_png(samples / f"{i:06d}.png", im)
    save_png(samples / "grid.png", ims[0])  # skipped, as every vgen eval command skips it
    (tmp_path / "prompts.txt").write_text("".join(p + "\n" for p in PROMPTS))
    code, out, err = run_cli(["eval", "clip", f"samples={samples}", f"prompts={tmp_path / 'prompts.txt'}",
                              f"clip_weights={tiny}", "progress=false", "batch_size=3"], capsys)
    assert code == 0, err
    res = json.loads((samples / "clip.json").read_text())
    want = clip_score(ims, PROMPTS, weights=tiny)
    assert res["n"] == len(PROMPTS) and abs(res["mean"] - want["mean"]) < 1e-4
    assert res["samples"] == str(samples) and res["prompts"] == str(tmp_path / "prompts.txt")
    assert f"{res['mean']:.4f}" in out and str(samples / "clip.json") in out
    # a csv with a named column, out= elsewhere
    with open(tmp_path / "p.csv", "w", newline="") as f:
        csv.writer(f).writerows([["file", "my caption"]] + [[i, p] for i, p in enumerate(PROMPTS)])
    code, out, err = run_cli(["eval", "clip", f"samples={samples}", f"prompts={tmp_path / 'p.csv'}",
                              "prompt_column=my caption", f"clip_weights={tiny}", f"out={tmp_path / 'o.json'}",
                              "progress=false"], capsys)
    assert code == 0, err
    assert np.allclose(json.loads((tmp_path / "o.json").read_text())["scores"], res["scores"], atol=1e-4, rtol=0)


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_vgen_eval_clip_errors(tiny, tmp_path, capsys):
    from vgen.io import save_png
    samples = tmp_path / "samples"
    for i, im in enumerate(images(3, 32)):
        save_png(samples / f"{i:06d}.png", im)
    (tmp_path / "two.txt").write_text("a cat\nthe dog\n")
    (tmp_path / "blank.txt").write_text("a cat\n\nthe dog\n")
    base = ["eval", "clip", f"samples={samples}", f"clip_weights={tiny}", "progress=false"]
    cases = [
        ([f"prompts={tmp_path / 'two.txt'}"], [f"{samples} holds 3 images but {tmp_path / 'two.txt'} 2 prompts"]),
        ([f"prompts={tmp_path / 'blank.txt'}"], ["line 2 is blank"]),
        ([], ["prompts=<"]),
        ([f"prompts={tmp_path / 'two.txt'}", f"clip_weights={tmp_path / 'nope'}"], ["does not exist"]),
        ([f"prompts={tmp_path / 'two.txt'}", "clip_model=ViT-H/14"], ["unknown CLIP model"]),
    ]
    for extra, words in cases:
        code, out, err = run_cli(base + extra, capsys)
        assert code == 2, (extra, err)
        assert len(err.splitlines()) == 1 and err.startswith("vgen eval: error: "), err
        for w in words:
            assert w in err, (w, err)
    assert not (samples / "clip.json").exists()
