"""Video: the clip dataset, video GPT / NAR models, samplers on (t, h, w) grids, video files, `vgen sample`."""
import math

import pytest
import torch

from vgen.errors import VGenError

GRID = (3, 4, 4)  # (t, h, w) tokens; the tiny VQ downsamples by 2: clips of 3 frames of 8x8 pixels


@pytest.fixture
def tiny_video_gpt():
    from vgen.models import build
    torch.manual_seed(0)
    m = build("video-gpt", dim=64, n_layer=2, n_head=2, vocab_size=32, num_classes=4, latent_shape=GRID)
    torch.nn.init.normal_(m.output.weight, std=0.3)
    return m.eval()


@pytest.fixture
def tiny_video_nar():
    from vgen.models import build
    torch.manual_seed(1)
    m = build("nar-video", dim=64, n_layer=1, n_head=2, vocab_size=32, num_classes=4, latent_shape=GRID,
              max_seq_len=math.prod(GRID))
    for _, _, out in m.heads:
        torch.nn.init.normal_(getattr(m, out).weight, std=0.3)
    return m.eval()


@pytest.fixture
def video_pipeline(tmp_path, tiny_video_gpt, tiny_vq):
    from vgen.pipeline import save_pipeline
    return save_pipeline(tmp_path / "vidpipe", tiny_video_gpt, tiny_vq, model_kind="video-gpt",
                         class_names=["a", "b", "c", "d"], sampling={"cfg_scale": 2.0, "top_k": 8})


# ---- data ----------------------------------------------------------------------------------------------------
def test_clips_shapes_determinism_and_motions():
    from vgen.data import MOTIONS, clips
    a = clips("train", 12, seed=3, frames=5, size=16)
    assert a.videos.shape == (12, 5, 3, 16, 16) and a.videos.dtype == torch.uint8
    assert a.labels.tolist() == [i % 16 for i in range(12)]
    assert set(a.motions) <= set(MOTIONS)
    assert torch.equal(clips("train", 12, seed=3, frames=5, size=16).videos, a.videos)
    assert not torch.equal(clips("train", 12, seed=4, frames=5, size=16).videos, a.videos)
    still = clips("test", 4, seed=0, frames=4, size=16, motions=("still",)).videos
    assert all(torch.equal(v[0], v[t]) for v in still for t in range(4))
    moving = clips("test", 8, seed=0, frames=4, size=16, motions=("pan", "zoom-in", "zoom-out")).videos
    assert all(not torch.equal(v[0], v[-1]) for v in moving)  # every moving clip changes from first to last frame


def test_clip_test_split_comes_from_held_out_regions(monkeypatch):
    """Clips are cut from the photos' train / test regions only: a photo whose test region is all white and
    train region all black gives white test clips and black training clips."""
    import importlib

    import numpy as np
    vc = importlib.import_module("vgen.data.clips")  # the module (the package exports the function clips)
    photo = np.zeros((200, 400, 3), np.uint8)
    photo[:, 300:] = 255  # the right-most quarter: the test region
    monkeypatch.setattr(vc, "load_photographs", lambda: (photo,) * 16)
    assert (vc.clips("train", 6, 0, frames=4, size=16).videos == 0).all()
    assert (vc.clips("test", 6, 0, frames=4, size=16, max_side=64).videos == 255).all()


def test_clips_bad_arguments():
    from vgen.data import clips
    with pytest.raises(VGenError, match="unknown split"):
        clips("val", 2)
    with pytest.raises(VGenError, match="unknown motion 'spin'"):
        clips("train", 2, motions=("spin",))
    with pytest.raises(VGenError, match="class id 99"):
        clips("train", 2, classes=[99])


# ---- files ---------------------------------------------------------------------------------------------------
def test_video_files_round_trip(tmp_path):
    from vgen.data import clips
    from vgen.io import frame_strip, read_video, save_gif, save_mp4
    v = clips("test", 1, 0, frames=6, size=32).videos[0]
    save_mp4(tmp_path / "a.mp4", v)
    save_gif(tmp_path / "a.gif", v)
    for path, min_psnr in ((tmp_path / "a.mp4", 30.0), (tmp_path / "a.gif", 30.0)):
        back = read_video(path)
        assert back.shape == v.shape and back.dtype == torch.uint8
        mse = ((back.float() - v.float()) ** 2).mean().item()
        assert 10 * math.log10(255 ** 2 / max(mse, 1e-9)) > min_psnr, path
    assert frame_strip(v).shape == (3, 32 + 4, 6 * 34 + 2)
    assert not list(tmp_path.glob(".*.tmp"))
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    with pytest.raises(VGenError, match="bad.mp4 is not a readable video"):
        read_video(tmp_path / "bad.mp4")
    with pytest.raises(ValueError, match="even frame sides"):
        save_mp4(tmp_path / "odd.mp4", torch.zeros(2, 3, 9, 9, dtype=torch.uint8))


# ---- models --------------------------------------------------------------------------------------------------
def test_video_gpt_3d_rope_and_teacher_forcing_match_the_cache(tiny_video_gpt):
    """3-D RoPE: every (t, h, w) gets its own rotation; the cached path reproduces teacher forcing."""
    from vgen.models.video_gpt import axis_pairs
    m = tiny_video_gpt
    assert m.token_shape == GRID and m.seq_len == 48
    assert sum(axis_pairs(m.config.head_dim)) == m.config.head_dim // 2
    table = m.freqs_cis[m.cond_len:]
    assert len({tuple(r.flatten().tolist()) for r in table}) == 48
    x = torch.randint(0, 32, (2, 48))
    y = torch.tensor([1, 2])
    with torch.no_grad():
        ref = m(x, y)
        cache = m.new_cache(2)
        first = m.prefill(y, cache)
        rest = m.decode(x[:, :-1], torch.arange(1, 48), cache)
    torch.testing.assert_close(torch.cat([first[:, None], rest], 1), ref, atol=1e-4, rtol=0)


def test_filled_prefix_attention_changes_nothing_but_the_cost(tiny_video_gpt):
    """Reading only the filled slots gives the same logits as reading the whole static cache."""
    m = tiny_video_gpt
    x = torch.randint(0, 32, (2, 20))
    y = torch.tensor([0, 3])
    with torch.no_grad():
        full = m.new_cache(2)
        m.prefill(y, full)
        a = m.decode(x, torch.arange(1, 21), full)[:, -1]
        short = m.new_cache(2)
        short.limit(1)
        m.prefill(y, short)
        short.limit(21)
        b = m.decode(x, torch.arange(1, 21), short)[:, -1]
        assert short.k[0][:, :, :21].abs().sum() > 0
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    from vgen.kernels.kv_cache import KVCache
    big = KVCache(1, 1, 1, 1000, 2)  # compiled steps: lengths in four buckets of 250 slots
    assert [big.bucket(n) for n in (1, 250, 251, 999)] == [250, 250, 500, 1000] and short.bucket(21) == 49


@pytest.mark.parametrize("name", ["ar", "sjd", "nar"])
def test_samplers_on_video_grids_are_batch_invariant(tiny_video_gpt, tiny_video_nar, name):
    from vgen.samplers import sample
    m = tiny_video_nar if name == "nar" else tiny_video_gpt
    opts = dict(cfg_scale=2.0, top_k=8) if name != "sjd" else dict(cfg_scale=2.0, top_k=8, init="temporal", window=6)
    one, _ = sample(m, [0, 1, 2], name, seed=7, batch_size=1, **opts)
    all3, st = sample(m, [0, 1, 2], name, seed=7, **opts)
    assert torch.equal(one, all3) and one.shape == (3, 48)
    if name == "nar":
        assert st["forward_passes"] == sum(GRID) - 2  # t + h + w - 2


def test_video_pipeline_generates_videos_and_refuses_images(video_pipeline):
    from vgen import load_pipeline
    pipe = load_pipeline(str(video_pipeline))
    assert pipe.model.token_shape == GRID
    gen = pipe.generate([0, 1], seed=0)
    assert gen.videos.shape == (2, 3, 3, 8, 8) and gen.videos.dtype == torch.uint8
    assert gen.stats["forward_passes"] == 48 and gen.stats["seconds"] > 0
    # frame k of clip i is the tokenizer's image of token frame k
    frame1 = pipe.decode(gen.tokens[:1]).squeeze(0)[1]
    from vgen.data import to_uint8
    with torch.inference_mode():
        want = to_uint8(pipe.tokenizer.decode(gen.tokens[0].view(GRID)[1:2]))[0]
    assert torch.equal(frame1, want)
    with pytest.raises(VGenError, match="holds videos"):
        gen.images
    spec = pipe.generate([0], sampler="sjd", init="temporal", window=8, seed=0)
    assert spec.videos.shape == (1, 3, 3, 8, 8)


def test_sample_writes_mp4_gif_strip_and_resumes(video_pipeline, tmp_path, capsys):
    from vgen.cli import main
    out = tmp_path / "clips"
    args = ["sample", f"model.path={video_pipeline}", "num_samples=3", "batch_size=2", f"outdir={out}",
            "progress=false"]
    main(args)
    for i in range(3):
        for suffix in (".mp4", ".gif", ".strip.png"):
            assert (out / f"{i:06d}{suffix}").exists(), suffix
    assert (out / "grid.png").exists() and (out / "stats.json").exists()
    assert "wrote 3 clips" in capsys.readouterr().out
    (out / "000001.mp4").unlink()  # a killed job: resume draws only the missing clip, same bytes as before
    before = (out / "000002.mp4").read_bytes()
    main(args)
    assert "(2 already on disk)" in capsys.readouterr().out
    assert (out / "000001.mp4").exists() and (out / "000002.mp4").read_bytes() == before


# ---- frame-conditioned generation ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ar", "sjd", "nar"])
def test_prefix_is_continued_exactly_as_teacher_forcing_says(tiny_video_gpt, tiny_video_nar, name):
    """Greedy continuation of given tokens (one frame, two frames, a partial frame) equals the argmax of the
    model's teacher-forced logits after them; the given tokens come back unchanged; fewer passes with more
    frames given (NAR: the known diagonals go in one pass)."""
    from vgen.samplers import sample
    m = tiny_video_nar if name == "nar" else tiny_video_gpt
    opts = dict(cfg_scale=2.0, top_k=1, **(dict(init="temporal", window=6) if name == "sjd" else {}))
    y = torch.tensor([0, 1])
    passes = []
    for P in (16, 20, 32):
        pre = torch.randint(0, 32, (2, P), generator=torch.Generator().manual_seed(P))
        tok, st = sample(m, y, name, seed=0, prefix=pre, batch_size=1, **opts)
        assert torch.equal(tok[:, :P], pre)
        with torch.no_grad():
            lc, lu = m(tok, y), m(tok, m.null_cond(y))
        assert torch.equal((lu + 2.0 * (lc - lu)).argmax(-1)[:, P:], tok[:, P:]), P
        assert st["tokens"] == 2 * (48 - P)
        passes.append(st["forward_passes"])
    if name == "nar":
        assert passes == [2 * 9, 2 * 8, 2 * 8]  # per sample: t+h+w-2 with one frame given; the first two diagonals known: one less
    if name == "ar":
        assert passes == [2 * (48 - 16 + 1), 2 * (48 - 20 + 1), 2 * (48 - 32 + 1)]


def test_prompt_frames_from_pipeline_and_cli(video_pipeline, tmp_path, capsys):
    """A prompt clip's first frames are encoded and continued: the generated clips start with the prompt's
    tokens; bad prompts are one-line errors before any model work."""
    from vgen import load_pipeline
    from vgen.cli import main
    from vgen.io import save_mp4
    pipe = load_pipeline(str(video_pipeline))
    clip = (torch.rand(3, 3, 8, 8) * 255).to(torch.uint8)
    gen = pipe.generate([0, 1], prompt=clip, prompt_frames=2, seed=0)
    want = pipe.tokenizer.encode(clip[:2].float() / 127.5 - 1).reshape(-1)
    assert torch.equal(gen.tokens[:, :32], want.expand(2, -1))
    assert gen.stats["forward_passes"] == 48 - 32 + 1
    for bad, msg in [(dict(prompt_frames=3), "prompt_frames must be 1..2"),
                     (dict(prompt=clip[:1], prompt_frames=2), "the prompt has 1 frame"),
                     (dict(prompt=clip.float()), "a prompt is a uint8 clip")]:
        with pytest.raises(VGenError, match=msg):
            pipe.generate([0], **{"prompt": clip, **bad})
    save_mp4(tmp_path / "p.mp4", torch.zeros(3, 3, 16, 16, dtype=torch.uint8))
    with pytest.raises(SystemExit) as e:
        main(["sample", f"model.path={video_pipeline}", f"prompt={tmp_path / 'p.mp4'}", f"outdir={tmp_path / 'o'}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "but this model makes" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o" / "000000.mp4").exists()


def test_demo_races_samplers_on_clips_with_per_frame_step_maps(video_pipeline, tmp_path):
    """The demo on a video model: clips side by side (shown as GIFs), one step-map panel per frame."""
    from vgen.demo import LOCAL, Demo, shown, step_heatmap
    from vgen.io import read_video
    d = Demo(allowed_dirs=[str(video_pipeline.parent)])
    res = d.race(LOCAL, str(video_pipeline), 1, 0, ["sjd"], {"init": "temporal", "window": 8})
    assert [r["sampler"] for r in res] == ["ar", "sjd"]
    assert all(r["image"].shape == (3, 3, 8, 8) for r in res) and res[0]["forward_passes"] == 48
    heat = step_heatmap(res[1]["step_map"], res[1]["grid"], size=8)
    assert heat.shape == (8, 3 * 8 + 2 * 2, 3)  # three frames of 4x4 tokens (x2), white 2-px gaps
    assert (heat[:, 8:10] == 255).all()
    gif = shown(res[1]["image"], str(tmp_path), "x")
    assert read_video(gif).shape == (3, 3, 32, 32)  # upscaled 4x for the gallery


@pytest.mark.parametrize("name", ["ar", "sjd", "nar"])
def test_prefix_attention_gives_the_same_tokens_as_the_whole_cache(tiny_video_gpt, tiny_video_nar, name):
    from vgen.samplers import sample
    m = tiny_video_nar if name == "nar" else tiny_video_gpt
    opts = dict(cfg_scale=2.0, top_k=8, **(dict(init="temporal", window=6) if name == "sjd" else {}))
    a, _ = sample(m, [0, 1, 3], name, seed=2, **opts)
    b, _ = sample(m, [0, 1, 3], name, seed=2, prefix_attention=False, **opts)
    assert torch.equal(a, b)


@pytest.mark.slow
def test_bench_times_video_samplers_and_scores_fvd_photo(video_pipeline, tmp_path, monkeypatch):
    """vgen bench on a video model: speed rows for every setting and FVD-photo (here with a random small
    classifier in place of the zoo's) with its ratio to AR's."""
    import json

    import vgen.eval.video_extractors as vx
    from vgen.cli import main
    clf = vx.save_video_classifier(vx.VideoClassifier(frames=3, image_size=8, stages=2), tmp_path / "clf.safetensors")
    monkeypatch.setattr(vx, "ZOO_VIDEO_CLASSIFIER", clf)
    out = tmp_path / "bench"
    import numpy as np
    np.savez(tmp_path / "ref.npz", arr_0=(torch.rand(6, 3, 8, 8, 3) * 255).to(torch.uint8).numpy())
    main(["bench", f"models=[{video_pipeline}]", "samplers=[ar,'sjd:init=temporal,window=8']", "batch_sizes=[2]",
          "repeats=1", "compile=false", "num_samples=2", "baseline=false", "fvd_samples=4",
          f"fvd_reference={tmp_path / 'ref.npz'}", f"outdir={out}"])
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert {r["sampler"] for r in rows} == {"ar", "sjd:init=temporal,window=8"}
    for r in rows:
        assert r["fvd_photo"] >= 0 and r["fvd_samples"] == 4 and r["forward_passes"] > 0
    sjd = next(r for r in rows if r["sampler"].startswith("sjd"))
    ar = next(r for r in rows if r["sampler"] == "ar")
    assert sjd["fvd_photo_vs_ar"] == pytest.approx(sjd["fvd_photo"] / ar["fvd_photo"])
    assert "FVD-photo" in (out / "bench.md").read_text()


@pytest.mark.slow
def test_torchrun_shards_clip_jobs_to_the_bytes_of_one_process(video_pipeline, tmp_path):
    """The image path's guarantee holds for clips: two torchrun processes write the files one process writes (that
    one run in this process, main() as `python -m vgen` runs it, on one thread as each torchrun process)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from vgen.cli import main
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    args = ["sample", f"model.path={video_pipeline}", "num_samples=5", "seed=2", "progress=false"]
    main([*args, "batch_size=4", "threads=1", f"outdir={tmp_path / 'one'}"])
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    two = subprocess.run([torchrun, "--nproc_per_node=2", "--standalone", "-m", "vgen", *args, "batch_size=2",
                          f"outdir={tmp_path / 'two'}"], cwd=tmp_path, capture_output=True, text=True, env=env,
                         timeout=600)
    assert two.returncode == 0, two.stderr[-2000:]
    files = {p.name: p.read_bytes() for p in sorted((tmp_path / "one").glob("0*"))}
    assert len(files) == 15  # mp4, gif, strip per clip
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "two").glob("0*"))} == files
