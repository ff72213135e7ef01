"""FID / KID / IS on real libraries: torch-fidelity (primary) and clean-fid (second opinion).

    vgen.eval.fid(samples, "photos-test")                                   # FID-photo, torch-fidelity
    vgen.eval.fid("out/", "photos-test", extractor="inception", backend="clean-fid",
                  inception_weights="weights-inception-2015-12-05-6726825d.pth")

``samples`` / ``reference``: a uint8 (N, 3, H, W) tensor or array, a folder of images (PNG/JPEG, ``grid.png``
excluded), an ADM-style ``.npz`` (``arr_0``, uint8 NHWC), or a registered reference name (``photos-test``,
``photos-train``). Reference features are computed once and cached on disk (``$VGEN_CACHE`` or
``~/.cache/vgen``), keyed by the data, the extractor and the digest of its weights.
"""
from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from vgen.errors import VGenError
from vgen.eval.extractors import EXTRACTORS, ZOO_CLASSIFIER, file_digest, inception_weights_path
from vgen.eval.sources import ImageSource, load_images
from vgen.io import cache_dir

BACKENDS = ("torch-fidelity", "clean-fid")
def export_npz(images, path: str | os.PathLike, batch_size: int = 256) -> Path:
    """Write images as the ADM evaluator's sample batch: ``arr_0``, uint8 (N, H, W, 3), streamed and atomically;
    for a ``vgen sample`` folder also ``arr_1`` (class labels, as guided-diffusion's sampler writes them) and
    ``seeds`` (each sample's seed), which ``vgen eval suite=adm`` checks."""
    from vgen.eval.npz import write_npz
    src = ImageSource(images, "images")
    first = next(src.batches(1))
    shape = (len(src), first.shape[2], first.shape[3], 3)
    arrays = {"arr_0": (shape, np.uint8, (b.permute(0, 2, 3, 1).numpy() for b in src.batches(batch_size)))}
    ls = src.labels_seeds()
    if ls is not None:
        arrays["arr_1"] = np.asarray(ls[0], np.int64)
        arrays["seeds"] = np.asarray(ls[1], np.int64)
    return write_npz(path, arrays)


class _UInt8Dataset(torch.utils.data.Dataset):
    def __init__(self, images: torch.Tensor):
        self.images = images

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i]


def _weights(extractor: str, inception_weights, classifier) -> Path:
    if extractor == "inception":
        return inception_weights_path(inception_weights)
    p = Path(classifier) if classifier else ZOO_CLASSIFIER
    if not p.is_file():
        raise VGenError(f"photo classifier weights not found at {p}: train them with `vgen train recipe=photo`")
    return p


def fid(samples, reference="photos-test", extractor: str = "photo", backend: str = "torch-fidelity", *,
        isc: bool = True, kid_subset_size: int = 1000, inception_weights=None, classifier=None,
        batch_size: int = 64, device="cpu", seed: int = 0, cache: str | os.PathLike | None = None,
        progress: bool = False) -> dict:
    """FID, KID (mean, std over subsets) and IS (where the extractor has class logits: both do) of
    ``samples`` against ``reference``. Returns a dict of plain floats and ints."""
    if extractor not in EXTRACTORS:
        raise VGenError(f"unknown extractor {extractor!r}: use one of {', '.join(EXTRACTORS)}")
    if backend not in BACKENDS:
        raise VGenError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if batch_size < 1:
        raise VGenError(f"batch_size must be >= 1, got {batch_size}")
    weights = _weights(extractor, inception_weights, classifier)  # fail before touching any data
    x, _ = load_images(samples, "samples")
    y, ref_key = load_images(reference, "reference")
    for name, t in (("samples", x), ("reference", y)):
        if len(t) < 2:
            raise VGenError(f"{name}: FID needs at least 2 images, got {len(t)}")
    device = torch.device(device)
    key = f"{ref_key}-{extractor}-{file_digest(weights, 12)}"
    m = min(kid_subset_size, len(x), len(y))
    common = dict(extractor=extractor, weights=weights, batch_size=batch_size, device=device, seed=seed,
                  progress=progress)
    if backend == "torch-fidelity":
        out = _torch_fidelity(x, y, key, m, isc=isc, cache=cache_dir(cache) / "torch-fidelity", **common)
    else:
        out = _clean_fid(x, y, key, m, cache=cache_dir(cache) / "clean-fid", **common)
        if isc:
            out.update(_torch_fidelity(x, None, None, m, isc=True, cache=None, **common))
    out.update({"num_samples": len(x), "num_reference": len(y), "extractor": extractor, "backend": backend,
                "reference": reference if isinstance(reference, str) else ref_key, "kid_subset_size": m,
                "weights": str(weights)})
    return out


def _fe_name(extractor: str) -> str:
    return {"photo": "vgen-photo", "inception": "vgen-inception-v3"}[extractor]


def _torch_fidelity(x, y, key, m, *, isc, cache, extractor, weights, batch_size, device, seed, progress) -> dict:
    import torch_fidelity

    from vgen.eval.extractors import register_torch_fidelity
    register_torch_fidelity()
    kw = dict(input1=_UInt8Dataset(x), feature_extractor=_fe_name(extractor),
              feature_extractor_weights_path=str(weights), batch_size=batch_size, cuda=device.type == "cuda",
              verbose=progress, rng_seed=seed, save_cpu_ram=True)
    if y is not None:
        kw.update(input2=_UInt8Dataset(y), fid=True, kid=True, kid_subset_size=m, cache=True,
                  cache_root=str(cache), input2_cache_name=key)
    else:
        kw.update(cache=False)
    if isc:
        kw.update(isc=True, isc_splits=min(10, len(x)))
    r = torch_fidelity.calculate_metrics(**kw)
    out = {}
    if "frechet_inception_distance" in r:
        out["fid"] = float(r["frechet_inception_distance"])
        out["kid_mean"] = float(r["kernel_inception_distance_mean"])
        out["kid_std"] = float(r["kernel_inception_distance_std"])
    if "inception_score_mean" in r:
        out["isc_mean"] = float(r["inception_score_mean"])
        out["isc_std"] = float(r["inception_score_std"])
    return out


def _clean_fid(x, y, key, m, *, cache, extractor, weights, batch_size, device, seed, progress) -> dict:
    from cleanfid import fid as cfid

    from vgen.io import atomic_write_bytes
    model_fn, resize = _clean_fid_model(extractor, weights, device)

    def feats(images: torch.Tensor) -> np.ndarray:
        with tempfile.TemporaryDirectory(prefix="vgen-cleanfid-") as d:
            from PIL import Image
            files = []
            for i, im in enumerate(images):  # PNG: lossless, clean-fid reads files
                f = Path(d) / f"{i:06d}.png"
                Image.fromarray(im.permute(1, 2, 0).numpy()).save(f)
                files.append(f)
            return cfid.get_files_features(files, model=model_fn, num_workers=0, batch_size=batch_size,
                                           device=device, mode="clean", custom_fn_resize=resize,
                                           verbose=progress, description=f"clean-fid {extractor}")

    f1 = feats(x)
    cached = cache / f"{key}.npy"
    if cached.exists():
        f2 = np.load(cached)
    else:
        import io
        f2 = feats(y)
        buf = io.BytesIO()
        np.save(buf, f2)
        atomic_write_bytes(cached, buf.getvalue())
    state = np.random.get_state()  # clean-fid draws KID subsets from NumPy's global generator
    np.random.seed(seed)
    try:
        kids = [cfid.kernel_distance(f1, f2, num_subsets=1, max_subset_size=m) for _ in range(100)]
    finally:
        np.random.set_state(state)
    with warnings.catch_warnings():  # clean-fid passes sqrtm(disp=False), deprecated in SciPy 1.17
        warnings.filterwarnings("ignore", message=".*disp.*", category=DeprecationWarning)
        value = cfid.fid_from_feats(f1, f2)
    return {"fid": float(value), "kid_mean": float(np.mean(kids)), "kid_std": float(np.std(kids))}


def _clean_fid_model(extractor: str, weights: Path, device):
    """clean-fid custom feature extractor: (callable on float [0, 255] batches, custom resize or None)."""
    if extractor == "photo":
        from vgen.eval.extractors import load_photo_classifier
        net = load_photo_classifier(weights, device)

        def model_fn(b):
            return net(b)[0]
        # the classifier resizes inside (antialiased, to its own input size), exactly as on torch-fidelity
        return model_fn, lambda a: np.asarray(a, dtype=np.float32)
    from vgen.eval.extractors import build_inception, inception_pool3_from_float
    fx = build_inception(weights, ("2048",)).to(device)

    def model_fn(b):
        return inception_pool3_from_float(fx, b)
    return model_fn, None  # clean-fid's own "clean" resize to 299 (PIL bicubic, float)
