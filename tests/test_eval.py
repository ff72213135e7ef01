"""FID / KID / IS through torch-fidelity and clean-fid, offline: both extractors, both backends, caching,
inputs, errors, the ADM .npz export and the `vgen eval` command."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from vgen.errors import VGenError

ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def real(n, seed=1):
    from vgen.data import photos
    return photos("test", n, seed=seed).images


def noise(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 64, 64), generator=g, dtype=torch.uint8)


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_photo_fid_both_backends_agree_and_rank_noise_worse(cache, classifier):
    import vgen.eval as ev
    res = {}
    for backend in ev.BACKENDS:
        good = ev.fid(real(48), "photos-test", backend=backend, classifier=classifier)
        bad = ev.fid(noise(48), "photos-test", backend=backend, classifier=classifier)
        assert good["fid"] < bad["fid"] and good["kid_mean"] < bad["kid_mean"]
        assert good["num_samples"] == 48 and good["num_reference"] == 1000 and good["kid_subset_size"] == 48
        assert good["isc_mean"] >= 1.0 and good["kid_std"] >= 0
        res[backend] = (good, bad)
    # same features (the classifier resizes inside), two implementations of the statistics
    for i in (0, 1):
        a, b = res["torch-fidelity"][i]["fid"], res["clean-fid"][i]["fid"]
        assert abs(a - b) <= 1e-3 * max(1.0, a)


def test_reference_statistics_are_cached_per_extractor_weights(cache, classifier, tmp_path):
    import vgen.eval as ev
    from vgen.eval.extractors import PhotoClassifier, save_photo_classifier
    ref = real(20, seed=9)
    r1 = ev.fid(real(10), ref, classifier=classifier)
    files = {p: p.stat().st_mtime_ns for p in (cache / "torch-fidelity").iterdir()}
    assert any("features" in p.name for p in files)
    r2 = ev.fid(real(10), ref, classifier=classifier)
    assert r2["fid"] == r1["fid"]
    assert {p: p.stat().st_mtime_ns for p in (cache / "torch-fidelity").iterdir()} == files  # reused
    torch.manual_seed(5)
    other = save_photo_classifier(PhotoClassifier("test_resnet"), tmp_path / "other.safetensors")
    ev.fid(real(10), ref, classifier=other)
    assert len(list((cache / "torch-fidelity").iterdir())) > len(files)  # new weights -> new cache entry


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch-fidelity", "clean-fid"])
def test_inception_path_runs_offline_with_local_weights(cache, inception, backend, monkeypatch):
    """Each backend's Inception path offline: real photos nearer the reference than noise. clean-fid computes its
    FID with SciPy's sqrtm (about 13 s per 2048-d matrix here), so it gets one call: the noise; its ordering against
    real photos is torch-fidelity's call's, and test_photo_fid_both_backends_agree_and_rank_noise_worse checks that
    the two backends agree. torch-fidelity's second call takes its weights from $VGEN_INCEPTION_WEIGHTS, with the
    Inception score off."""
    import vgen.eval as ev
    ref = real(8, seed=4)
    bad = ev.fid(noise(8), ref, extractor="inception", backend=backend, inception_weights=inception)
    assert np.isfinite(bad["fid"]) and bad["fid"] > 0 and bad["extractor"] == "inception"
    if backend == "torch-fidelity":
        assert "isc_mean" in bad
        monkeypatch.setenv("VGEN_INCEPTION_WEIGHTS", str(inception))
        good = ev.fid(real(8, seed=5), ref, extractor="inception", backend=backend, isc=False)
        assert np.isfinite(good["fid"]) and good["fid"] < bad["fid"] and "isc_mean" not in good


def test_inception_without_weights_says_what_to_download(monkeypatch, tmp_path):
    import vgen.eval as ev
    monkeypatch.delenv("VGEN_INCEPTION_WEIGHTS", raising=False)
    with pytest.raises(VGenError, match="weights-inception-2015-12-05-6726825d.pth.*VGEN_INCEPTION_WEIGHTS"):
        ev.fid(real(4), "photos-test", extractor="inception")
    with pytest.raises(VGenError, match="does not exist"):
        ev.fid(real(4), "photos-test", extractor="inception", inception_weights=tmp_path / "nope.pth")


def test_inception_weights_load_without_unpickling_code(tmp_path, inception):
    """A .pth is read with weights_only=True: a pickled object that is not a tensor is refused."""
    import collections

    from safetensors.torch import load_file

    from vgen.eval.extractors import build_inception
    sd = load_file(str(inception))
    good = tmp_path / "w.pth"
    torch.save(sd, good)
    assert build_inception(good)(real(1))[0].shape == (1, 2048)
    bad = tmp_path / "bad.pth"
    torch.save({"x": collections.Counter("abc")}, bad)
    with pytest.raises(VGenError, match="weights_only=True|not a plain state dict"):
        build_inception(bad)


def test_bad_arguments_fail_before_any_work(classifier):
    import vgen.eval as ev
    with pytest.raises(VGenError, match="unknown extractor"):
        ev.fid(real(4), "photos-test", extractor="clip")
    with pytest.raises(VGenError, match="unknown backend"):
        ev.fid(real(4), "photos-test", backend="tf")
    with pytest.raises(VGenError, match="at least 2 images"):
        ev.fid(real(1), "photos-test", classifier=classifier)
    with pytest.raises(VGenError, match="uint8"):
        ev.fid(real(4).float(), "photos-test", classifier=classifier)
    with pytest.raises(VGenError, match="registered reference"):
        ev.fid(real(4), "imagenet-val", classifier=classifier)
    with pytest.raises(VGenError, match="vgen train recipe=photo"):
        ev.fid(real(4), "photos-test", classifier="/nonexistent/c.safetensors")


def test_image_inputs_folder_npz_array(tmp_path):
    from vgen.eval import export_npz, load_images
    from vgen.io import save_png
    x = real(5)
    for i, im in enumerate(x):
        save_png(tmp_path / f"{i:06d}.png", im)
    save_png(tmp_path / "grid.png", torch.zeros(3, 10, 30, dtype=torch.uint8))  # vgen sample's grid: skipped
    got, key = load_images(tmp_path)
    assert torch.equal(got, x)
    assert load_images(x)[1] == key  # the cache key names the data, not where it came from
    npz = export_npz(tmp_path, tmp_path / "s.npz")
    with np.load(npz) as z:
        assert z["arr_0"].dtype == np.uint8 and z["arr_0"].shape == (5, 64, 64, 3)
    assert torch.equal(load_images(npz)[0], x)
    assert torch.equal(load_images(x.permute(0, 2, 3, 1).numpy())[0], x)  # NHWC arrays too
    save_png(tmp_path / "odd.png", torch.zeros(3, 32, 32, dtype=torch.uint8))
    with pytest.raises(VGenError, match="differ in size"):
        load_images(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(VGenError, match="no images"):
        load_images(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "000000.png").write_bytes(b"not an image")  # a file named .png that is not one
    with pytest.raises(VGenError, match="000000.png is not a readable image"):
        load_images(bad)
    (tmp_path / "cut.npz").write_bytes(npz.read_bytes()[:50])  # a truncated .npz
    with pytest.raises(VGenError, match="not a readable .npz"):
        load_images(tmp_path / "cut.npz")


@pytest.mark.slow
def test_eval_cli_writes_metrics_and_npz(tmp_path, classifier, cache, capsys, monkeypatch):
    from vgen.cli import main
    from vgen.io import save_png
    d = tmp_path / "s"
    for i, im in enumerate(real(6)):
        save_png(d / f"{i:06d}.png", im)
    env = {**ENV, "VGEN_CACHE": str(cache)}
    r = subprocess.run([sys.executable, "-m", "vgen", "eval", "fid", f"samples={d}", "reference=photos-test",
                        f"classifier={classifier}", "backend=clean-fid", "progress=false"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads((d / "metrics.json").read_text())
    assert m["backend"] == "clean-fid" and m["num_samples"] == 6 and np.isfinite(m["fid"])
    assert "FID-photo" in r.stdout
    # the rest in process (the process boundary is covered above; a subprocess costs ~2 s of imports)
    monkeypatch.chdir(tmp_path)
    main(["eval", "npz", f"samples={d}", f"out={tmp_path / 'a.npz'}"])
    with np.load(tmp_path / "a.npz") as z:
        assert z["arr_0"].shape == (6, 64, 64, 3)
    capsys.readouterr()
    for args, msg in ((["eval", "fid"], "samples="), (["eval", "fidd", f"samples={d}"], "unknown eval metric"),
                      (["eval", "fid", f"samples={d}", "backend=x"], "unknown backend")):
        with pytest.raises(SystemExit) as e:
            main(args)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and msg in err and "Traceback" not in err and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_zoo_photo_classifier_separates_classes_and_sees_degradation(cache):
    """The shipped classifier: held-out accuracy, and FID-photo ranks real crops above blurred / noisy ones."""
    import torch.nn.functional as F

    import vgen.eval as ev
    from vgen.data import photos
    from vgen.eval.extractors import ZOO_CLASSIFIER, load_photo_classifier
    from vgen.train.photo import evaluate
    if not ZOO_CLASSIFIER.exists():
        pytest.skip("zoo classifier not trained yet")
    m = evaluate(load_photo_classifier(), n=256, seed=3)
    assert m["test_accuracy"] >= 0.9
    x = photos("test", 128, seed=11).images
    blur = F.avg_pool2d(F.pad(x.float(), (1, 1, 1, 1), mode="replicate"), 3, 1).round().to(torch.uint8)
    g = torch.Generator().manual_seed(0)
    noisy = (x.float() + 25 * torch.randn(x.shape, generator=g)).clamp(0, 255).round().to(torch.uint8)
    f = {k: ev.fid(v, "photos-test", isc=False)["fid"] for k, v in (("real", x), ("blur", blur), ("noisy", noisy))}
    assert f["real"] < f["blur"] and f["real"] < f["noisy"], f
