"""FVD, offline: the I3D path (cd-fvd's network on random weights), the 16-frame rule, the Fréchet distance,
clip inputs (arrays, folders of MP4 / GIF, registered references), FVD-photo on a random video classifier,
reference-feature caching, weight-file errors, the `vgen eval fvd` command and the video-classifier recipe."""
import json
import pathlib

import numpy as np
import pytest
import torch

from vgen.errors import VGenError


def fvd_module():
    """The module vgen.eval.fvd (the attribute ``vgen.eval.fvd`` is the function, as ``vgen.eval.fid`` is)."""
    import importlib
    return importlib.import_module("vgen.eval.fvd")


def tiny(n, seed, frames=4, size=16):
    from vgen.data import clips
    return clips("test", n, seed=seed, frames=frames, size=size).videos


def random_classifier(seed, path):
    """A randomly initialised r3d_18 video classifier (4 frames of 16 px: fast) in the zoo's file format."""
    from vgen.eval.video_extractors import VideoClassifier, save_video_classifier
    torch.manual_seed(seed)
    return save_video_classifier(VideoClassifier(frames=4, image_size=16), path)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return random_classifier(0, tmp_path_factory.mktemp("vcls") / "classifier.safetensors")


@pytest.fixture(scope="module")
def i3d(tmp_path_factory):
    from vgen.eval.fvd import random_i3d_weights
    return random_i3d_weights(tmp_path_factory.mktemp("i3d") / "i3d.safetensors")


def write_clips(folder, videos, gif=True, strip=True):
    """A folder laid out like `vgen sample` writes for a video model: 000000.mp4, .gif, .strip.png per clip."""
    from vgen.io import frame_strip, save_gif, save_mp4, save_png
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i, v in enumerate(videos):
        save_mp4(folder / f"{i:06d}.mp4", v)
        if gif:
            save_gif(folder / f"{i:06d}.gif", v)
        if strip:
            save_png(folder / f"{i:06d}.strip.png", frame_strip(v))
    return folder


@pytest.fixture
def no_features(monkeypatch):
    """Fail the test if any features are extracted (errors must come first)."""
    F = fvd_module()

    def boom(*a, **k):
        raise AssertionError("features were extracted")
    monkeypatch.setattr(F, "extract_features", boom)


# ------------------------------------------------------------------------------------------ the 16-frame rule
def test_fit_frames_repeats_short_clips_and_keeps_the_first_of_long_ones():
    from vgen.eval.fvd import fit_frames

    def clip(t):  # frame k is filled with the value k
        return torch.arange(t, dtype=torch.uint8).view(1, t, 1, 1, 1).expand(2, t, 3, 4, 4).contiguous()
    assert fit_frames(clip(8), 16)[0, :, 0, 0, 0].tolist() == [k // 2 for k in range(16)]  # every frame twice
    assert fit_frames(clip(5), 16)[1, :, 2, 3, 3].tolist() == [k * 5 // 16 for k in range(16)]
    assert fit_frames(clip(20), 16)[0, :, 0, 0, 0].tolist() == list(range(16))  # the first 16
    assert fit_frames(clip(16), 16).shape == (2, 16, 3, 4, 4)


def test_video_classifier_fits_length_and_size_inside(classifier):
    from vgen.eval.video_extractors import load_video_classifier
    m = load_video_classifier(classifier)
    x = m.preprocess(tiny(2, seed=1, frames=8, size=32))
    assert x.shape == (2, 3, 4, 16, 16) and -1 <= x.min() and x.max() <= 1
    with torch.no_grad():
        feats, cls, mot = m(tiny(2, seed=1, frames=3, size=20))
    assert feats.shape == (2, 512) and cls.shape == (2, 16) and mot.shape == (2, 4)


# ------------------------------------------------------------------------------------------ Fréchet distance
def test_frechet_distance_is_zero_for_identical_sets_and_grows_with_a_shift():
    from vgen.eval.fvd import frechet_distance
    a = np.random.default_rng(0).normal(size=(256, 8))
    assert abs(frechet_distance(a, a)) < 1e-8
    assert frechet_distance(a, a + 1.0) == pytest.approx(8.0, rel=1e-6)  # equal covariances: |mean shift|^2
    assert frechet_distance(a, 2 * a) > 1.0
    few = np.random.default_rng(1).normal(size=(3, 64))  # fewer sets than dimensions: singular, still finite
    assert abs(frechet_distance(few, few)) < 1e-3 and frechet_distance(few, few + 0.5) > 1.0


# ------------------------------------------------------------------------------------------ inputs
def test_folder_of_mp4_round_trip(tmp_path):
    from vgen.eval.fvd import load_videos
    v = tiny(3, seed=1, frames=8, size=32)
    d = write_clips(tmp_path / "samples", v)
    x, key = load_videos(d)
    assert x.shape == v.shape and x.dtype == torch.uint8 and key.startswith("data-")
    assert (x.float() - v.float()).abs().mean() < 4  # H.264 (crf 12, yuv420p): close, not exact
    g = write_clips(tmp_path / "gifs", v)
    for f in g.glob("*.mp4"):
        f.unlink()
    y, _ = load_videos(g)  # no MP4: the GIFs are read
    assert y.shape == v.shape and (y.float() - v.float()).abs().mean() < 4


def test_arrays_in_either_layout_and_bad_arrays():
    from vgen.eval.fvd import load_videos
    v = tiny(2, seed=3)
    x, key = load_videos(v.permute(0, 1, 3, 4, 2).numpy())  # (N, T, H, W, 3)
    assert torch.equal(x, v) and key == load_videos(v)[1]
    with pytest.raises(VGenError, match="expected uint8 clips"):
        load_videos(v.float())
    with pytest.raises(VGenError, match="5-d batch of clips"):
        load_videos(v[0])


def test_registered_references():
    from vgen.eval.fvd import REFERENCES, load_videos
    x, key = load_videos("clips-test", "reference")
    assert x.shape == (512, 8, 3, 32, 32) and key == "clips-test-n512-s0-8f-32px"
    assert set(REFERENCES) == {"clips-test", "clips-train"}
    with pytest.raises(VGenError, match="'nope' does not exist.*clips-test, clips-train"):
        load_videos("nope", "reference")


# ------------------------------------------------------------------------------------------ I3D weights
def test_i3d_weights_missing_or_wrong_are_one_line_errors(tmp_path, monkeypatch, i3d, classifier, no_features):
    from safetensors.torch import load_file, save_file

    from vgen.eval.fvd import fvd
    from vgen.eval.video_extractors import load_i3d
    v = tiny(2, seed=1)
    monkeypatch.delenv("VGEN_I3D_WEIGHTS", raising=False)
    errors = []
    with pytest.raises(VGenError, match=r"songweige/TATS/raw/main/tats/fvd/i3d_pretrained_400\.pt.*"
                                        r"i3d_weights=/path/to/i3d_pretrained_400\.pt.*VGEN_I3D_WEIGHTS") as e:
        fvd(v, v, extractor="i3d")
    errors.append(e)
    with pytest.raises(VGenError, match="does not exist") as e:
        fvd(v, v, extractor="i3d", i3d_weights=tmp_path / "nope.pt")
    errors.append(e)
    with pytest.raises(VGenError, match=f"{classifier.name} is not an I3D state dict.*missing keys") as e:
        fvd(v, v, extractor="i3d", i3d_weights=classifier)  # a real network, not this one
    errors.append(e)
    sd = load_file(str(i3d))
    sd["logits.conv3d.weight"], sd["logits.conv3d.bias"] = torch.zeros(10, 1024, 1, 1, 1), torch.zeros(10)
    save_file(sd, str(tmp_path / "i3d10.safetensors"))
    with pytest.raises(VGenError, match="is not an I3D state dict.*2 of other shapes") as e:
        fvd(v, v, extractor="i3d", i3d_weights=tmp_path / "i3d10.safetensors")
    errors.append(e)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(VGenError, match="junk.pt is not an I3D state dict") as e:
        fvd(v, v, extractor="i3d", i3d_weights=tmp_path / "junk.pt")
    errors.append(e)
    torch.save({"w": torch.zeros(1), "p": pathlib.Path("x")}, tmp_path / "code.pt")  # not weights-only
    with pytest.raises(VGenError, match="code.pt is not an I3D state dict") as e:
        load_i3d(tmp_path / "code.pt")
    errors.append(e)
    assert all(len(str(x.value).splitlines()) == 1 for x in errors)
    torch.save(load_file(str(i3d)), tmp_path / "i3d.pt")  # a plain .pt state dict loads (weights_only)
    assert not load_i3d(tmp_path / "i3d.pt").training


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The `disp` argument:DeprecationWarning")  # cd-fvd's own sqrtm call
def test_i3d_fvd_end_to_end_offline_matches_cd_fvd(cache, i3d, monkeypatch):
    """The whole I3D path on random weights: 8-frame clips are shown to the I3D as 16 (each frame twice); its
    logits equal cd-fvd's get_i3d_logits on those 16-frame clips, and the distance equals cd-fvd's."""
    from cdfvd.fvd import cdfvd as CdFvd
    from cdfvd.fvd import get_i3d_logits
    from cdfvd.utils.metric_utils import FeatureStats

    from vgen.eval.fvd import fit_frames, fvd
    from vgen.eval.video_extractors import i3d_logits, load_i3d
    a, ref = tiny(2, seed=1, frames=8, size=32), tiny(3, seed=2, frames=8, size=32)
    monkeypatch.setenv("VGEN_I3D_WEIGHTS", str(i3d))
    r = fvd(a, ref, extractor="i3d")
    assert r["frames"] == 16 and r["sample_frames"] == 8 and r["features"] == 400 and r["extractor"] == "i3d"
    assert np.isfinite(r["fvd"]) and r["fvd"] > 0 and r["num_samples"] == 2 and r["num_reference"] == 3

    net = load_i3d(i3d)
    ours = i3d_logits(net, a)
    theirs = get_i3d_logits(FeatureStats(capture_all=True, capture_mean_cov=True), net,
                            fit_frames(a, 16).permute(0, 1, 3, 4, 2).numpy(), device="cpu")
    np.testing.assert_allclose(ours, theirs.get_all(), rtol=1e-5, atol=1e-5)
    (cached,) = list((cache / "fvd").glob("*-i3d-*.npy"))
    real = FeatureStats(capture_mean_cov=True)
    real.append(np.load(cached))
    assert CdFvd.compute_fvd_from_stats(None, theirs, real) == pytest.approx(r["fvd"], rel=1e-5)

    same = fvd(ref, ref, extractor="i3d")["fvd"]  # reference features from the cache
    assert abs(same) < 1e-3 * r["fvd"]


# ------------------------------------------------------------------------------------------ FVD-photo
def test_photo_fvd_identical_sets_zero_different_sets_positive(cache, classifier):
    from vgen.eval.fvd import fvd
    from vgen.eval.video_extractors import load_video_classifier
    a, b = tiny(6, seed=1), tiny(6, seed=2)
    noise = torch.randint(0, 256, a.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    same = fvd(a, a, video_classifier=classifier)
    other = fvd(b, a, video_classifier=classifier)
    bad = fvd(noise, a, video_classifier=classifier)
    assert abs(same["fvd"]) < 1e-4 and other["fvd"] > 1e-3 and bad["fvd"] > 1e-3
    assert same["frames"] == 4 and same["features"] == 512 and same["extractor"] == "photo"
    assert same["num_samples"] == 6 and same["weights"] == str(classifier)
    model = load_video_classifier(classifier)  # the model object gives the same number as its file
    assert fvd(b, a, video_classifier=model)["fvd"] == pytest.approx(other["fvd"], rel=1e-9)


def test_missing_video_classifier_says_how_to_train_it(tmp_path, no_features):
    from vgen.eval.fvd import fvd
    with pytest.raises(VGenError, match=r"train them with `vgen train recipe=video-classifier`"):
        fvd(tiny(2, seed=1), tiny(2, seed=2), video_classifier=tmp_path / "nope.safetensors")


def test_reference_features_are_cached_per_data_extractor_and_weights(cache, classifier, tmp_path, monkeypatch):
    F = fvd_module()
    calls = []
    orig = F.extract_features

    def counting(videos, *a, **k):
        calls.append(len(videos))
        return orig(videos, *a, **k)
    monkeypatch.setattr(F, "extract_features", counting)
    ref, x = tiny(5, seed=7), tiny(4, seed=8)
    r1 = F.fvd(x, ref, video_classifier=classifier)
    assert calls == [5, 4]
    files = {p: p.stat().st_mtime_ns for p in (cache / "fvd").iterdir()}
    r2 = F.fvd(x, ref, video_classifier=classifier)
    assert calls == [5, 4, 4] and r2["fvd"] == r1["fvd"]  # the reference is not recomputed
    assert {p: p.stat().st_mtime_ns for p in (cache / "fvd").iterdir()} == files
    other = random_classifier(5, tmp_path / "other.safetensors")
    F.fvd(x, ref, video_classifier=other)
    assert calls == [5, 4, 4, 5, 4] and len(list((cache / "fvd").iterdir())) == len(files) + 1  # new weights


@pytest.mark.slow
def test_photo_fvd_against_the_registered_reference(cache, classifier):
    """Samples of another size and length than the reference (16 px, 4 frames against 32 px, 8 frames)."""
    from vgen.eval.fvd import fvd
    r = fvd(tiny(8, seed=1), "clips-test", video_classifier=classifier)
    assert r["num_reference"] == 512 and r["reference"] == "clips-test" and np.isfinite(r["fvd"])


# ------------------------------------------------------------------------------------------ the command
def test_cli_fvd_writes_json(cache, classifier, tmp_path, capsys):
    from vgen.cli import main
    d = write_clips(tmp_path / "samples", tiny(3, seed=1))
    ref = write_clips(tmp_path / "ref", tiny(3, seed=2), gif=False, strip=False)
    main(["eval", "fvd", f"samples={d}", f"reference={ref}", f"video_classifier={classifier}", "progress=false"])
    res = json.loads((d / "fvd.json").read_text())
    assert res["num_samples"] == 3 and res["num_reference"] == 3 and res["extractor"] == "photo"
    assert res["samples"] == str(d) and np.isfinite(res["fvd"])
    assert "FVD-photo" in capsys.readouterr().out


@pytest.mark.parametrize("case,msg", [
    ("missing", "does not exist"),
    ("empty", "no clips (.mp4, .gif) in folder"),
    ("sizes", "differ in shape"),
    ("float", "expected uint8 clips"),
    ("extractor", "unknown FVD extractor 'inception'"),
    ("no-i3d", "i3d_pretrained_400.pt"),
    ("not-i3d", "is not an I3D state dict"),
    ("no-classifier", "vgen train recipe=video-classifier"),
    ("device", "device='nope' is not a torch device"),
])
def test_cli_bad_input_one_line_error(case, msg, classifier, tmp_path, capsys, monkeypatch, no_features):
    """In process (the same main() the command runs): exit code 2, the message, one line, nothing written,
    no features extracted."""
    from vgen.cli import main
    monkeypatch.delenv("VGEN_I3D_WEIGHTS", raising=False)
    good = write_clips(tmp_path / "good", tiny(2, seed=1), gif=False, strip=False)
    samples, extra = good, [f"video_classifier={classifier}"]
    if case == "missing":
        samples = tmp_path / "nowhere"
    elif case == "empty":
        samples = tmp_path / "empty"
        samples.mkdir()
        (samples / "000000.png").write_bytes(b"")
    elif case == "sizes":
        samples = write_clips(tmp_path / "mixed", tiny(1, seed=1), gif=False, strip=False)
        from vgen.io import save_mp4
        save_mp4(samples / "000001.mp4", tiny(1, seed=2, size=32)[0])
    elif case == "float":
        samples = tmp_path / "clips.npz"
        np.savez(samples, arr_0=tiny(2, seed=1).float().numpy())
    elif case == "extractor":
        extra.append("extractor=inception")
    elif case == "no-i3d":
        extra.append("extractor=i3d")
    elif case == "not-i3d":
        extra += ["extractor=i3d", f"i3d_weights={classifier}"]
    elif case == "no-classifier":
        extra = [f"video_classifier={tmp_path / 'nope.safetensors'}"]
    elif case == "device":
        extra.append("device=nope")
    with pytest.raises(SystemExit) as e:
        main(["eval", "fvd", f"samples={samples}", f"reference={good}", *extra, f"out={tmp_path / 'fvd.json'}",
              "progress=false"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert msg in err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "fvd.json").exists()


# ------------------------------------------------------------------------------------------ the recipe
@pytest.mark.slow
def test_video_classifier_recipe_runs_resumes_and_loads(tmp_path):
    from vgen.eval.video_extractors import load_video_classifier
    from vgen.train.video_classifier import VideoClassifierTrainConfig, train_video_classifier
    cfg = VideoClassifierTrainConfig(out=str(tmp_path / "vcls"), frames=4, image_size=16, steps=2, batch_size=4,
                                     save_every=1, eval_n=8, log_eval_n=8, warmup=1)
    m = train_video_classifier(cfg)
    assert 0 <= m["test_accuracy"] <= 1 and 0 <= m["test_motion_accuracy"] <= 1
    assert len(m["per_class_accuracy"]) == 16 and set(m["per_motion_accuracy"]) == {"still", "pan", "zoom-in",
                                                                                     "zoom-out"}
    cfg.steps = 3  # resumes from step 2
    train_video_classifier(cfg)
    log = [json.loads(line) for line in (tmp_path / "vcls" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r.get("final")] == [2, 3]
    assert [r["step"] for r in log if "test_motion_accuracy" in r and not r.get("final")] == [1, 2, 3]
    clf = load_video_classifier(tmp_path / "vcls" / "classifier.safetensors")
    feats, cls, mot = clf(torch.zeros(2, 4, 3, 16, 16, dtype=torch.uint8))
    assert feats.shape == (2, 256) and cls.shape == (2, 16) and mot.shape == (2, 4) and clf.frames == 4
    assert clf.stages == 3 and clf.differences and clf.net.stem[0].in_channels == 6  # the recipe's defaults
    assert clf.order and clf.order_head(feats).shape == (2, 2)  # ordered vs shuffled frames, on by default
    assert 0 <= m["test_order_accuracy"] <= 1 and all("test_order_accuracy" in r for r in log if "test_accuracy" in r)
    with pytest.raises(VGenError, match="shuffle_fraction must be in"):
        train_video_classifier(VideoClassifierTrainConfig(out=str(tmp_path / "bad"), shuffle_fraction=1.0))
    assert not (tmp_path / "bad").exists()  # refused before the run folder exists
    cfg = VideoClassifierTrainConfig(out=str(tmp_path / "plain"), frames=4, image_size=16, steps=1, batch_size=4,
                                     eval_n=8, log_eval_n=0, warmup=1, order_weight=0.0)
    m = train_video_classifier(cfg)  # order_weight=0: the first shipped classifier's objective, no order head
    plain = load_video_classifier(tmp_path / "plain" / "classifier.safetensors")
    assert not plain.order and not hasattr(plain, "order_head") and "test_order_accuracy" not in m


def test_shuffle_frames_targets_and_determinism():
    from vgen.train.video_classifier import shuffle_frames
    v = torch.arange(6 * 5).view(6, 5, 1, 1, 1).expand(6, 5, 3, 2, 2).to(torch.uint8).contiguous()
    motions = torch.tensor([0, 1, 2, 3, 1, 0])  # still, pan, zoom-in, zoom-out, pan, still
    a, ta = shuffle_frames(v, motions, 0.99, torch.Generator().manual_seed(3))
    b, tb = shuffle_frames(v, motions, 0.99, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and torch.equal(ta, tb)  # pure in the generator
    for i in range(6):
        frames = a[i, :, 0, 0, 0]
        assert sorted(frames.tolist()) == v[i, :, 0, 0, 0].tolist()  # a permutation of the clip's own frames
        assert not torch.equal(frames, v[i, :, 0, 0, 0])  # never the identity
    assert ta.tolist() == [0, 1, 1, 1, 1, 0]  # a shuffled still shot looks ordered: target 0
    c, tc = shuffle_frames(v, motions, 0.0, torch.Generator().manual_seed(3))
    assert torch.equal(c, v) and not tc.any()


# ------------------------------------------------------------------------------------ the shipped classifier
@pytest.mark.slow
def test_zoo_video_classifier_sees_content_motion_and_frame_order():
    """FVD-photo with the shipped classifier ranks held-out real clips best; the same clips with their frames
    shuffled or frozen, every frame a real crop, score clearly worse; its order head tells shuffled from ordered
    moving clips well above chance. 96 clips per set against 96 other held-out clips (the full check:
    docs/scripts/fvd_checks.py). Each set's features are extracted once, for its FVD (what fvd() computes from them:
    frechet_distance of extract_features; fvd() itself is checked above) and for the order head."""
    from vgen.data import MOTIONS, clips
    from vgen.eval.fvd import extract_features, frechet_distance
    from vgen.eval.video_extractors import ZOO_VIDEO_CLASSIFIER, load_video_classifier
    from vgen.train.video_classifier import motion_ids, shuffle_frames
    if not ZOO_VIDEO_CLASSIFIER.is_file():
        pytest.skip("zoo video classifier not installed")
    clf = load_video_classifier()
    ref, real = clips("test", 96, seed=0).videos, clips("test", 96, seed=1)
    g = torch.Generator().manual_seed(0)
    moving = motion_ids(real.motions) != MOTIONS.index("still")
    shuffled = real.videos.clone()
    shuffled[moving] = shuffle_frames(real.videos[moving], motion_ids(real.motions)[moving], 1.0, g)[0]
    frozen = real.videos[:, :1].expand_as(real.videos).contiguous()
    feats = {name: extract_features(v, "photo", clf)
             for name, v in (("ref", ref), ("real", real.videos), ("shuffled", shuffled), ("frozen", frozen))}
    score = {name: frechet_distance(feats[name], feats["ref"]) for name in ("real", "shuffled", "frozen")}
    assert score["shuffled"] > 2 * score["real"] and score["frozen"] > 2 * score["real"], score
    with torch.no_grad():
        f = torch.from_numpy(np.concatenate([feats["real"][moving.numpy()], feats["shuffled"][moving.numpy()]]))
        order = clf.order_head(f).argmax(-1)
    k = int(moving.sum())
    acc = ((order[:k] == 0).float().mean() + (order[k:] == 1).float().mean()) / 2
    assert acc > 0.65, float(acc)  # held out (512 clips): 0.76 balanced; 0.80 on these 96
