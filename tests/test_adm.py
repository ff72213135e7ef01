"""The ADM suite (FID, sFID, IS, Precision, Recall, KID), offline: each formula against an independent
implementation, the Inception port's spatial features (layer, shape, NHWC order), ADM .npz batches (streamed,
precomputed statistics used when present), the warnings, and `vgen eval suite=adm`."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from vgen.errors import VGenError, VGenWarning

ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}
pytestmark = pytest.mark.filterwarnings("ignore::vgen.errors.VGenWarning")  # asserted with pytest.warns where due


def real(n, seed=1, split="test"):
    from vgen.data import photos
    return photos(split, n, seed=seed).images


def noisy(x, sigma, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (x.float() + sigma * torch.randn(x.shape, generator=g)).clamp(0, 255).round().to(torch.uint8)


def random_stats(d, n, seed, shift=0.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) @ rng.standard_normal((d, d)) * 0.3 + shift
    return x.mean(0), np.cov(x, rowvar=False)


# ------------------------------------------------------------------------------------------------- Fréchet distance
@pytest.mark.parametrize("d,n", [(16, 200), (64, 40)])  # full rank, and singular (fewer samples than dimensions)
def test_frechet_distance_agrees_with_torch_fidelity_and_clean_fid(d, n):
    from cleanfid.fid import frechet_distance as cf
    from torch_fidelity.metric_fid import fid_statistics_to_metric

    from vgen.eval.frechet import frechet_distance
    mu1, s1 = random_stats(d, n, 0)
    mu2, s2 = random_stats(d, n, 1, shift=0.5)
    ours = frechet_distance(mu1, s1, mu2, s2)
    tf = fid_statistics_to_metric({"mu": mu1, "sigma": s1}, {"mu": mu2, "sigma": s2}, False)
    tf = tf["frechet_inception_distance"]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = cf(mu1, s1, mu2, s2)
    assert isinstance(ours, float) and ours > 0
    assert ours == pytest.approx(tf, rel=1e-6, abs=1e-6)
    assert ours == pytest.approx(c, rel=1e-6, abs=1e-6)
    assert f"{ours:.4f}" == f"{tf:.4f}" == f"{c:.4f}"


def test_frechet_distance_closed_forms_and_errors():
    from vgen.eval.frechet import frechet_distance
    mu, s = random_stats(8, 100, 3)
    assert abs(frechet_distance(mu, s, mu, s)) < 1e-9
    # 1-d: (m1 - m2)^2 + (sd1 - sd2)^2
    assert frechet_distance([1.0], [[4.0]], [3.0], [[9.0]]) == pytest.approx(4.0 + 1.0)
    # diagonal covariances: sum of (sqrt a - sqrt b)^2
    a, b = np.array([1.0, 4.0, 9.0]), np.array([4.0, 4.0, 1.0])
    want = ((np.sqrt(a) - np.sqrt(b)) ** 2).sum()
    assert frechet_distance(np.zeros(3), np.diag(a), np.zeros(3), np.diag(b)) == pytest.approx(want)
    with pytest.raises(VGenError, match="same extractor"):
        frechet_distance(mu, s, mu[:4], s[:4, :4])
    with pytest.raises(VGenError, match="NaN"):
        frechet_distance(mu * np.nan, s, mu, s)


# --------------------------------------------------------------------------------------------- Precision / Recall
def _manifold_pr_numpy(real, fake, k=3):
    """The ADM evaluator's definition, written out: squared distances, radius = k-th nearest other point."""
    def sq(a, b):
        return ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    r_real = np.sort(sq(real, real), axis=1)[:, k]
    r_fake = np.sort(sq(fake, fake), axis=1)[:, k]
    precision = (sq(fake, real) <= r_real[None]).any(1).mean()
    recall = (sq(real, fake) <= r_fake[None]).any(1).mean()
    return precision, recall


def test_precision_recall_matches_prdc_and_the_adm_definition():
    import prdc

    from vgen.eval.adm import precision_recall
    rng = np.random.default_rng(0)
    real = rng.standard_normal((300, 32)).astype(np.float32)
    for fake, expect in ((rng.standard_normal((250, 32)) * 0.6, "precise"),          # inside, narrower
                         (rng.standard_normal((250, 32)) * 1.6, "diverse"),          # wider than real
                         (rng.standard_normal((250, 32)) + 1.0, "shifted")):
        fake = fake.astype(np.float32)
        p, r = precision_recall(real, fake)
        ref = prdc.compute_prdc(real_features=real, fake_features=fake, nearest_k=3)
        adm = _manifold_pr_numpy(real.astype(np.float64), fake.astype(np.float64))
        assert p == pytest.approx(ref["precision"], abs=1e-9) and r == pytest.approx(ref["recall"], abs=1e-9)
        assert (p, r) == pytest.approx(adm, abs=1e-9)
        if expect == "precise":
            assert p > 0.9 and r < 0.6
        if expect == "diverse":
            assert p < 0.6 and r > 0.9
    # identical sets: every point lies in its own ball
    assert precision_recall(real, real) == (1.0, 1.0)


def test_inception_score_is_the_evaluators():
    from torch_fidelity.metric_isc import isc_features_to_metric

    from vgen.eval.adm import inception_score
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((300, 10)) * 3
    mean, splits = inception_score(logits)
    assert len(splits) == 1
    t = torch.as_tensor(logits, dtype=torch.float64)
    assert mean == pytest.approx(isc_features_to_metric(t, splits=1, shuffle=False)["inception_score_mean"], rel=1e-9)
    mean, splits = inception_score(logits, split_size=100)  # consecutive splits, the mean of their scores
    assert len(splits) == 3
    assert mean == pytest.approx(isc_features_to_metric(t, splits=3, shuffle=False)["inception_score_mean"], rel=1e-9)
    assert inception_score(np.zeros((50, 10)))[0] == pytest.approx(1.0)  # uniform predictions: 1
    confident = np.eye(10)[np.arange(100) % 10] * 50                     # sure and balanced: the class count
    assert inception_score(confident)[0] == pytest.approx(10.0, rel=1e-6)


# ------------------------------------------------------------------------------------------------------- features
@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_inception_spatial_features_are_mixed_6d_branch1x1_first_7_channels_nhwc(inception):
    from vgen.eval.adm import features
    from vgen.eval.extractors import build_inception
    x = torch.cat([real(2), noisy(real(1, seed=5), 40)])
    f = features(x, "inception", weights=inception)
    assert f["pool"].shape == (3, 2048) and f["spatial"].shape == (3, 17 * 17 * 7) and f["logits"].shape == (3, 1008)
    assert all(v.dtype == np.float32 for v in f.values())
    # independently: the port's layers up to Mixed_6c, then Mixed_6d's 1x1 branch (conv, BN, ReLU)
    net = build_inception(inception, ("2048", "logits_unbiased"))
    with torch.no_grad():
        pool, logits = net(x)
        from torch_fidelity.interpolate_compat_tensorflow import interpolate_bilinear_2d_like_tensorflow1x
        h = interpolate_bilinear_2d_like_tensorflow1x(x.float(), size=(299, 299), align_corners=False)
        h = (h - 128) / 128
        for name in ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "MaxPool_1", "Conv2d_3b_1x1",
                     "Conv2d_4a_3x3", "MaxPool_2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b",
                     "Mixed_6c"):
            h = getattr(net, name)(h)
        b = net.Mixed_6d.branch1x1
        m = torch.relu(b.bn(b.conv(h)))
    assert m.shape == (3, 192, 17, 17) and (m >= 0).all()
    torch.testing.assert_close(torch.from_numpy(f["pool"]), pool)
    torch.testing.assert_close(torch.from_numpy(f["logits"]), logits)
    sp = torch.from_numpy(f["spatial"])
    for i, hh, ww, c in ((0, 0, 0, 0), (1, 3, 11, 6), (2, 16, 16, 2), (0, 9, 2, 5)):  # NHWC: (h * 17 + w) * 7 + c
        assert sp[i, (hh * 17 + ww) * 7 + c] == pytest.approx(float(m[i, c, hh, ww]), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(sp, m[:, :7].permute(0, 2, 3, 1).reshape(3, -1))


def test_photo_suite_features_and_reference_stats(classifier):
    from vgen.eval.adm import features, reference_stats
    x = real(6)
    f = features(x, "photo", weights=classifier)
    assert set(f) == {"pool", "spatial", "logits"}
    assert f["spatial"].shape == (6, 7 * 8 * 8) and f["pool"].shape[0] == 6 and f["logits"].shape == (6, 16)
    s = reference_stats(x, "photo", weights=classifier)
    assert set(s) == {"mu", "sigma", "mu_s", "sigma_s"} and s["sigma_s"].shape == (448, 448)
    assert s["mu"].dtype == np.float64
    np.testing.assert_allclose(s["mu"], f["pool"].astype(np.float64).mean(0))
    np.testing.assert_allclose(s["sigma"], np.cov(f["pool"].astype(np.float64), rowvar=False))


# ---------------------------------------------------------------------------------------------------------- npz
def test_npz_arrays_stream_in_batches_and_round_trip(tmp_path):
    from vgen.eval.npz import NpzArray, read_stats, write_npz
    x = np.random.default_rng(0).integers(0, 256, (13, 8, 6, 3), dtype=np.uint8)
    p = write_npz(tmp_path / "a.npz", {"arr_0": (x.shape, np.uint8, iter([x[:5], x[5:]])),
                                       "arr_1": np.arange(13)})
    with np.load(p) as z:  # numpy reads it
        np.testing.assert_array_equal(z["arr_0"], x)
    a = NpzArray(p)
    parts = list(a.batches(4))
    assert [len(b) for b in parts] == [4, 4, 4, 1]
    np.testing.assert_array_equal(np.concatenate(parts), x)
    np.savez_compressed(tmp_path / "c.npz", arr_0=x)  # deflated members stream too
    np.testing.assert_array_equal(np.concatenate(list(NpzArray(tmp_path / "c.npz").batches(3))), x)
    assert read_stats(p) is None
    np.savez(tmp_path / "half.npz", arr_0=x, mu=np.zeros(3), sigma=np.eye(3))
    with pytest.raises(VGenError, match="lacks mu_s, sigma_s"):
        read_stats(tmp_path / "half.npz")
    (tmp_path / "cut.npz").write_bytes(p.read_bytes()[:-400])
    with pytest.raises(VGenError, match="not a readable .npz|truncated"):
        list(NpzArray(tmp_path / "cut.npz").batches(4))
    with pytest.raises(VGenError, match="no 'arr_9' array"):
        NpzArray(tmp_path / "a.npz", "arr_9")
    with pytest.raises(VGenError, match="wrote 5 rows, expected 13"):
        write_npz(tmp_path / "bad.npz", {"arr_0": (x.shape, np.uint8, iter([x[:5]]))})
    assert not (tmp_path / "bad.npz").exists() and not list(tmp_path.glob(".bad.npz.*"))


def test_reference_npz_statistics_are_used_when_present(tmp_path, classifier, cache):
    """FID / sFID come from the npz's mu / sigma / mu_s / sigma_s, Precision / Recall / KID from its images."""
    import warnings

    from vgen.eval import evaluate, reference_stats
    from vgen.eval.adm import features, precision_recall
    from vgen.eval.frechet import frechet_distance
    samples, imgs, other = real(24, seed=2), real(32, seed=3), noisy(real(32, seed=4), 30)
    kw = dict(extractor="photo", weights=classifier, cache=cache)
    plain = tmp_path / "plain.npz"
    np.savez(plain, arr_0=imgs.permute(0, 2, 3, 1).numpy())
    st = reference_stats(other, "photo", weights=classifier)  # statistics of *other* images than arr_0
    withstats = tmp_path / "stats.npz"
    np.savez(withstats, arr_0=imgs.permute(0, 2, 3, 1).numpy(), **st)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VGenWarning)
        a = evaluate(samples, plain, **kw)
        b = evaluate(samples, withstats, **kw)
        c = evaluate(samples, imgs, **kw)
    assert a["fid"] == pytest.approx(c["fid"]) and a["precision"] == c["precision"]  # npz == the same images
    f = features(samples, "photo", weights=classifier)
    s = reference_stats(samples, "photo", weights=classifier)
    assert b["fid"] == pytest.approx(frechet_distance(s["mu"], s["sigma"], st["mu"], st["sigma"]))
    assert b["sfid"] == pytest.approx(frechet_distance(s["mu_s"], s["sigma_s"], st["mu_s"], st["sigma_s"]))
    assert b["fid"] != pytest.approx(a["fid"])
    assert (b["precision"], b["recall"]) == (a["precision"], a["recall"])
    ref_pool = features(imgs, "photo", weights=classifier)["pool"]
    assert (a["precision"], a["recall"]) == precision_recall(ref_pool, f["pool"])
    assert "precomputed" in b["reference_stats"] and "computed from 32" in a["reference_stats"]
    # statistics only (no arr_0): FID / sFID, and the rest left out with a warning
    only = tmp_path / "only.npz"
    np.savez(only, **st)
    with pytest.warns(VGenWarning, match="no images"):
        d = evaluate(samples, only, **kw)
    assert d["fid"] == pytest.approx(b["fid"]) and d["precision"] is None and d["kid"] is None
    # statistics of another extractor's size: one line, before any sample feature
    np.savez(tmp_path / "inc.npz", mu=np.zeros(2048), sigma=np.eye(2048), mu_s=np.zeros(2023), sigma_s=np.eye(2023))
    from vgen.eval.adm import PhotoSuite

    class Counting(PhotoSuite):  # a SuiteExtractor that counts the images it sees
        seen = 0

        def __call__(self, images):
            Counting.seen += len(images)
            return super().__call__(images)
    with pytest.raises(VGenError, match="reference statistics mu have 2048 values but extractor 'photo' gives"):
        evaluate(samples, tmp_path / "inc.npz", extractor=Counting(classifier), cache=cache)
    assert Counting.seen == 1  # one probe image: refused before the features of either set


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_suite_agrees_with_vgen_fid_and_warns(tmp_path, classifier, cache):
    import vgen.eval as ev
    x = real(20, seed=2)
    with pytest.warns(VGenWarning, match="20 samples: FID is biased"):
        r = ev.evaluate(x, "photos-test", extractor="photo", classifier=classifier, cache=cache)
    for k in ("fid", "sfid", "is", "precision", "recall", "kid"):
        assert k in r and np.isfinite(r[k])
    old = ev.fid(x, "photos-test", classifier=classifier, cache=cache)  # torch-fidelity's FID / KID
    assert r["fid"] == pytest.approx(old["fid"], rel=1e-5)
    assert r["kid"] == pytest.approx(old["kid_mean"], rel=1e-5, abs=1e-7)
    assert r["weights_sha256"] and r["num_samples"] == 20 and r["frechet"].startswith("vgen.eval.frechet")
    # seeds repeated across classes (one seed list for every class) are named
    p = tmp_path / "s.npz"
    np.savez(p, arr_0=x.permute(0, 2, 3, 1).numpy(), arr_1=np.repeat(np.arange(4), 5), seeds=np.tile(np.arange(5), 4))
    with pytest.warns(VGenWarning, match="seed 0 was used for class 0 and class 1"):
        ev.evaluate(p, "photos-test", classifier=classifier, cache=cache)
    from vgen.eval.adm import seeds_repeated_across_classes
    assert seeds_repeated_across_classes([0, 1, 2, 0], [0, 1, 2, 3]) is None  # seed from the global index
    for bad, msg in ((dict(suite="tf"), "unknown suite"), (dict(extractor="clip"), "unknown extractor"),
                     (dict(classifier="/nope.safetensors"), "vgen train recipe=photo")):
        with pytest.raises(VGenError, match=msg):
            ev.evaluate(x, "photos-test", **{"classifier": classifier, **bad})
    with pytest.raises(VGenError, match="more than 3 images"):
        ev.evaluate(x[:3], "photos-test", classifier=classifier)


@pytest.mark.slow
def test_eval_suite_cli_writes_json_and_markdown(tmp_path, classifier, cache, monkeypatch):
    """The suite in a real process; the npz export in process (the main() the command runs: a process costs seconds
    of imports; `vgen eval npz` is the same command in test_eval's CLI test)."""
    from vgen.cli import main
    from vgen.io import save_png
    d = tmp_path / "s"
    for i, im in enumerate(real(8)):
        save_png(d / f"{i:06d}.png", im)
    (d / "stats.json").write_text(json.dumps({"labels": [i % 4 for i in range(8)], "seed": 0}))
    env = {**ENV, "VGEN_CACHE": str(cache)}
    r = subprocess.run([sys.executable, "-m", "vgen", "eval", "suite=adm", f"samples={d}", "reference=photos-test",
                        f"classifier={classifier}", "progress=false"], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads((d / "adm.json").read_text())
    for k in ("fid", "sfid", "is", "precision", "recall", "kid", "weights_sha256", "vgen", "frechet"):
        assert k in res
    md = (d / "adm.md").read_text()
    assert "| sFID |" in md and "| Precision |" in md and "sha256" in md
    assert "| FID |" in r.stdout
    warn = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warn) == 1 and "8 samples: FID is biased" in warn[0]  # one line; seeds here follow the index
    monkeypatch.chdir(tmp_path)
    main(["eval", "npz", f"samples={d}", f"out={tmp_path / 'a.npz'}"])
    with np.load(tmp_path / "a.npz") as z:  # a vgen sample folder exports labels and seeds with the images
        assert z["arr_0"].shape == (8, 64, 64, 3) and list(z["arr_1"]) == [0, 1, 2, 3] * 2
        assert list(z["seeds"]) == list(range(8))



def test_eval_suite_cli_refuses_bad_input_in_one_line(tmp_path, capsys, monkeypatch, classifier):
    from vgen.cli import main
    from vgen.io import save_png
    d = tmp_path / "s"
    for i, im in enumerate(real(4)):
        save_png(d / f"{i:06d}.png", im)
    monkeypatch.delenv("VGEN_INCEPTION_WEIGHTS", raising=False)
    for args, msg in ((["suite=x", f"samples={d}"], "unknown suite"), (["suite=adm"], "samples="),
                      (["suite=adm", f"samples={d}", "extractor=inception"], "cannot be downloaded"),
                      (["suite=adm", f"samples={d}", "reference=nope"], "registered reference"),
                      (["fvd", "suite=adm", f"samples={d}"], "drop 'fvd'")):
        with pytest.raises(SystemExit) as e:
            main(["eval", *args, f"classifier={classifier}"])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and msg in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in d.iterdir()) == [f"{i:06d}.png" for i in range(4)]  # nothing written


# --------------------------------------------------------------------------------------------------- FD-DINOv2
def seeded_dinov2_state(spec):
    """Deterministic DINOv2 weights from (key, shape) pairs: what tests/fixtures/dinov2_conformance.json was
    recorded with (torch-fidelity's own extractor on the official DINOv2 code, in a scratch folder)."""
    out = {}
    for i, (k, shape) in enumerate(spec):
        g = torch.Generator().manual_seed(1000 + i)
        t = torch.randn(shape, generator=g) * 0.02
        if k.endswith("norm1.weight") or k.endswith("norm2.weight") or k == "norm.weight":
            t = 1 + 5 * t
        elif k.endswith(".gamma"):
            t = 0.1 + t
        out[k] = t
    return out


@pytest.fixture(scope="module")
def dinov2_s(tmp_path_factory):
    from pathlib import Path
    fixture = json.loads((Path(__file__).parent / "fixtures" / "dinov2_conformance.json").read_text())
    p = tmp_path_factory.mktemp("dinov2") / "dinov2_vits14_pretrain.pth"
    torch.save(seeded_dinov2_state(fixture["spec"]), p)  # the official file's layout (a plain state dict)
    return p, torch.tensor(fixture["features"])


def test_dinov2_features_match_torch_fidelity_on_the_official_code(dinov2_s):
    from vgen.data import photos
    from vgen.eval.dinov2 import DINOv2Features
    path, want = dinov2_s
    got = DINOv2Features(path, "dinov2-vit-s-14")(photos("test", 4, seed=7, size=64).images)
    assert got.shape == (4, 384)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.slow
def test_fd_dinov2_in_the_suite_and_its_errors(dinov2_s, classifier, cache, tmp_path, monkeypatch):
    import vgen.eval as ev
    path, _ = dinov2_s
    kw = dict(classifier=classifier, cache=cache, dinov2_weights=path, dinov2_model="dinov2-vit-s-14")
    ref = real(24, seed=0)  # a small reference: DINOv2 at 224 px costs 0.1 s an image here
    good = ev.evaluate(real(16, seed=2), ref, **kw)
    bad = ev.evaluate(noisy(real(16, seed=2), 60), ref, **kw)
    assert 0 < good["fd_dinov2"] < bad["fd_dinov2"]
    assert good["dinov2"]["features"] == 384 and good["dinov2"]["weights_sha256"]
    assert ev.evaluate(real(16, seed=2), "photos-test", classifier=classifier, cache=cache)["fd_dinov2"] is None
    monkeypatch.delenv("VGEN_DINOV2_WEIGHTS", raising=False)
    with pytest.raises(VGenError, match="dinov2_vitl14_pretrain.pth.*dinov2_weights="):
        ev.evaluate(real(8), "photos-test", classifier=classifier, fd_dinov2=True)
    with pytest.raises(VGenError, match="does not exist"):
        ev.evaluate(real(8), "photos-test", classifier=classifier, dinov2_weights=tmp_path / "nope.pth")
    with pytest.raises(VGenError, match="does not fit dinov2-vit-b-14"):
        ev.evaluate(real(8), "photos-test", classifier=classifier, dinov2_weights=path, dinov2_model="dinov2-vit-b-14")


@pytest.mark.slow
def test_photos_protocol_end_to_end_orders_real_zoo_noise_on_every_metric(tmp_path, cache):
    """`vgen sample +experiment=photos_adm` (every class equally often, seed = global index), then the suite with
    the zoo's photo classifier: held-out real crops beat zoo samples, which beat noise, on every metric."""
    import vgen.eval as ev
    out = tmp_path / "zoo"
    from vgen.cli import main
    main(["sample", "+experiment=photos_adm", "samples_per_class=2", f"outdir={out}", "progress=false"])
    st = json.loads((out / "stats.json").read_text())
    assert st["num_samples"] == 32 and st["labels"] == [i % 16 for i in range(32)] and st["seed"] == 0
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", VGenWarning)
        zoo = ev.evaluate(out, "photos-test", cache=cache)
    assert not any("seed" in str(w.message) for w in caught)  # seeds follow the global index
    good = ev.evaluate(real(32, seed=1), "photos-test", cache=cache)
    g = torch.Generator().manual_seed(0)
    bad = ev.evaluate(torch.randint(0, 256, (32, 3, 64, 64), generator=g, dtype=torch.uint8), "photos-test",
                      cache=cache)
    for k in ("fid", "sfid", "kid"):
        assert good[k] < zoo[k] < bad[k], k
    for k in ("is", "precision", "recall"):
        assert good[k] > zoo[k] > bad[k], k


@pytest.mark.slow
def test_inception_suite_end_to_end_with_an_adm_reference_npz(tmp_path, inception, cache):
    """The whole Inception path offline (random weights of the standard shapes): an ADM-layout reference npz with
    its own mu / sigma / mu_s / sigma_s, a sample npz, the five numbers and KID."""
    from vgen.eval import evaluate, export_npz, reference_stats
    ref_imgs = real(10, seed=3)
    st = reference_stats(ref_imgs, "inception", weights=inception)
    assert st["mu"].shape == (2048,) and st["sigma_s"].shape == (2023, 2023)
    ref = tmp_path / "VIRTUAL_test_labeled.npz"
    np.savez(ref, arr_0=ref_imgs.permute(0, 2, 3, 1).numpy(), **st)
    samples = export_npz(real(8, seed=4), tmp_path / "samples.npz")
    r = evaluate(samples, ref, extractor="inception", inception_weights=inception, cache=cache, batch_size=4)
    for k in ("fid", "sfid", "is", "precision", "recall", "kid"):
        assert r[k] is not None and np.isfinite(r[k]), k
    assert r["features"] == {"pool": 2048, "spatial": 2023, "logits": 1008,
                             "spatial_layer": r["features"]["spatial_layer"]}
    assert "Mixed_6d.branch1x1" in r["features"]["spatial_layer"] and "precomputed" in r["reference_stats"]
    # that the npz's statistics give the FID / sFID of its images: test_reference_npz_statistics_are_used_when_present
    # (the same feature path, a small extractor: a second Inception evaluation here cost 10-18 s)


def test_video_clips_are_refused_by_the_image_metrics_with_the_fvd_command(tmp_path, classifier):
    import vgen.eval as ev
    from vgen.io import save_png
    d = tmp_path / "clips"  # what `vgen sample` writes for a video model
    d.mkdir()
    (d / "000000.mp4").write_bytes(b"\x00")
    (d / "000000.gif").write_bytes(b"\x00")
    save_png(d / "000000.strip.png", torch.zeros(3, 32, 280, dtype=torch.uint8))
    for call in (lambda: ev.fid(d, classifier=classifier), lambda: ev.evaluate(d, classifier=classifier),
                 lambda: ev.export_npz(d, tmp_path / "x.npz")):
        with pytest.raises(VGenError, match="holds video clips .*vgen eval fvd samples="):
            call()
    clips = torch.zeros(4, 8, 3, 32, 32, dtype=torch.uint8)
    with pytest.raises(VGenError, match="holds video clips: score them with `vgen eval fvd`"):
        ev.fid(clips, classifier=classifier)
    np.savez(tmp_path / "v.npz", arr_0=clips.permute(0, 1, 3, 4, 2).numpy())
    with pytest.raises(VGenError, match="holds video clips"):
        ev.evaluate(tmp_path / "v.npz", classifier=classifier)
