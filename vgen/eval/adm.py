"""The ADM evaluation suite in PyTorch: FID, sFID, Inception Score, Precision, Recall (and KID), the table of the
LlamaGen / VAR / MAR / NAR papers, computed the way OpenAI's ADM evaluator (guided-diffusion
``evaluations/evaluator.py``, TensorFlow) computes it, from the same reference batches.

    vgen.eval.evaluate("samples/", "VIRTUAL_imagenet256_labeled.npz", extractor="inception",
                       inception_weights="weights-inception-2015-12-05-6726825d.pth")
    vgen.eval.evaluate(images, "photos-test")            # the photo-domain suite (zoo classifier), offline
    vgen.eval.features(images, extractor=...)           # {"pool", "spatial", "logits"}: what the suite uses
    vgen.eval.reference_stats(images, extractor=...)    # {"mu", "sigma", "mu_s", "sigma_s"}: an ADM npz's stats

Features (docs/metrics.md has the whole story):

* ``inception``: torch-fidelity's port of the TensorFlow Inception graph the ADM evaluator loads (the
  2015-12-05 ``classify_image_graph_def.pb``). ``pool`` = pool_3 (2048); ``spatial`` = the graph's
  ``mixed_6/conv`` (the 1x1 branch of the fourth 17x17 block: the port's ``Mixed_6d.branch1x1``, after its
  batch norm and ReLU), first 7 channels, flattened in NHWC order (17 x 17 x 7 = 2023); ``logits`` = pool_3
  times the softmax weights without the bias (the evaluator's ``softmax/logits/MatMul``; torch-fidelity's
  ``logits_unbiased``).
* ``photo``: the zoo's photo classifier (no download): ``pool`` = its 512-d penultimate features, ``spatial``
  = the first 7 channels of its stage-2 output (8 x 8 at 64 px), NHWC (448), ``logits`` = its 16 class logits.

Metrics: FID and sFID are Fréchet distances (``vgen.eval.frechet``) of ``pool`` / ``spatial`` statistics; IS is
the evaluator's (softmax of ``logits``, consecutive splits of 5,000, the mean); Precision / Recall are
Kynkäänniemi et al.'s with k = 3 on ``pool`` (torch-fidelity's ``prc``); KID is torch-fidelity's on ``pool``.
"""
from __future__ import annotations

import hashlib
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from vgen.errors import VGenError, VGenWarning
from vgen.eval.sources import ImageSource

SUITES = ("adm",)
SUITE_EXTRACTORS = ("photo", "inception")
IS_SPLIT = 5000          # the evaluator's split size for the Inception Score
PR_K = 3                 # nearest neighbours for the Precision / Recall radii
FID_MIN_SAMPLES = 10000  # below this FID is biased upwards enough to mislead (warned)
SPATIAL_CHANNELS = 7     # the evaluator keeps mixed_6/conv[..., :7]


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def seeds_repeated_across_classes(labels: list[int], seeds: list[int]) -> tuple[int, int, int] | None:
    """(seed, class a, class b) for a seed drawn for two classes, or None."""
    first: dict[int, int] = {}
    for c, s in zip(labels, seeds):
        if s in first and first[s] != c:
            return s, first[s], c
        first.setdefault(s, c)
    return None


# ------------------------------------------------------------------------------------------------- extractors
class SuiteExtractor(Protocol):
    """What the suite needs from a network: ``__call__(uint8 (B, 3, H, W)) -> {"pool", "spatial", "logits"}``
    (float32 (B, D) each), its ``name``, its ``weights`` file and a line on its ``spatial`` layer."""
    name: str
    weights: Path
    spatial_layer: str

    def __call__(self, images: torch.Tensor) -> dict[str, torch.Tensor]: ...


def _nhwc_first_channels(x: torch.Tensor, c: int = SPATIAL_CHANNELS) -> torch.Tensor:
    return x[:, :c].permute(0, 2, 3, 1).reshape(len(x), -1).to(torch.float32)


class _Hooked:
    """Keeps the output of one submodule of the last forward pass."""

    def __init__(self, module: torch.nn.Module):
        self.out = None
        module.register_forward_hook(self._keep)

    def _keep(self, module, args, out):
        self.out = out


class InceptionSuite:
    """torch-fidelity's Inception port with the ADM evaluator's three outputs (see the module docstring)."""
    name = "inception"
    spatial_layer = ("mixed_6/conv (port: Mixed_6d.branch1x1, after BN + ReLU), channels [:7], NHWC, 17x17x7 = "
                     "2023")

    def __init__(self, weights=None, device="cpu"):
        from vgen.eval.extractors import build_inception, inception_weights_path
        self.weights = inception_weights_path(weights)
        self.device = torch.device(device)
        self.net = build_inception(self.weights, ("2048", "logits_unbiased")).to(self.device)
        self._spatial = _Hooked(self.net.Mixed_6d.branch1x1)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        pool, logits = self.net(images.to(self.device))
        return {"pool": pool.float(), "spatial": _nhwc_first_channels(self._spatial.out), "logits": logits.float()}


class PhotoSuite:
    """The zoo's photo classifier with the suite's three outputs (see the module docstring)."""
    name = "photo"
    spatial_layer = "photo classifier stage 2 (layer2, 8x8 at 64 px), channels [:7], NHWC, 8x8x7 = 448"

    def __init__(self, weights=None, device="cpu"):
        from vgen.eval.extractors import ZOO_CLASSIFIER, load_photo_classifier
        self.weights = Path(weights) if weights else ZOO_CLASSIFIER
        self.device = torch.device(device)
        self.net = load_photo_classifier(self.weights, self.device)
        self._spatial = _Hooked(self.net.net.layer2)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        pool, logits = self.net(images.to(self.device))
        return {"pool": pool.float(), "spatial": _nhwc_first_channels(self._spatial.out), "logits": logits.float()}


def suite_extractor(extractor: str = "photo", weights=None, device="cpu") -> SuiteExtractor:
    if isinstance(extractor, str):
        if extractor not in SUITE_EXTRACTORS:
            raise VGenError(f"unknown extractor {extractor!r} for the ADM suite: use one of "
                            f"{', '.join(SUITE_EXTRACTORS)}")
        return {"photo": PhotoSuite, "inception": InceptionSuite}[extractor](weights, device)
    return extractor  # an object following SuiteExtractor


def _check_weights(extractor, weights) -> None:
    """Fail on missing weights before any data is read."""
    if extractor == "inception":
        from vgen.eval.extractors import inception_weights_path
        inception_weights_path(weights)
    elif extractor == "photo":
        from vgen.eval.extractors import ZOO_CLASSIFIER
        p = Path(weights) if weights else ZOO_CLASSIFIER
        if not p.is_file():
            raise VGenError(f"photo classifier weights not found at {p}: train them with `vgen train recipe=photo`")


def _features(src: ImageSource, fx, batch_size: int, progress: bool) -> dict[str, np.ndarray]:
    """Every output of ``fx`` over ``src``, concatenated (float32 numpy)."""
    from tqdm import tqdm
    parts: dict[str, list] = {}
    total = (len(src) + batch_size - 1) // batch_size
    for b in tqdm(src.batches(batch_size), total=total, disable=not progress, desc=f"{fx.name} features ({src.what})"):
        for k, v in fx(b).items():
            parts.setdefault(k, []).append(v.cpu().numpy())
    return {k: np.concatenate(v) for k, v in parts.items()}


def _cached_features(src: ImageSource, fx, batch_size, cache, progress) -> dict[str, np.ndarray]:
    """Features of reference images, cached on disk under the data, the extractor and its weights."""
    from vgen.eval.extractors import file_digest
    from vgen.io import atomic_write_bytes, cache_dir
    path = cache_dir(cache) / "adm" / f"{src.key()}-{fx.name}-{file_digest(fx.weights, 12)}.npz"
    if path.exists():
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    feats = _features(src, fx, batch_size, progress)
    buf = io.BytesIO()
    np.savez(buf, **feats)
    atomic_write_bytes(path, buf.getvalue())
    return feats


def features(images, extractor="photo", *, weights=None, inception_weights=None, classifier=None,
             batch_size: int = 64, device="cpu", progress: bool = False) -> dict[str, np.ndarray]:
    """The suite's features of ``images`` (any source ``evaluate`` takes): ``pool`` (N, D), ``spatial`` (N, D_s)
    and ``logits`` (N, C), float32 arrays."""
    weights = weights or inception_weights or classifier
    if isinstance(extractor, str):
        _check_weights(extractor, weights)
    src = ImageSource(images, "images")
    return _features(src, suite_extractor(extractor, weights, device), batch_size, progress)


def stats_of(feats: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from vgen.eval.frechet import gaussian_stats
    mu, sigma = gaussian_stats(feats["pool"])
    mu_s, sigma_s = gaussian_stats(feats["spatial"])
    return {"mu": mu, "sigma": sigma, "mu_s": mu_s, "sigma_s": sigma_s}


def reference_stats(images, extractor="photo", **kw) -> dict[str, np.ndarray]:
    """``mu``, ``sigma`` (pool) and ``mu_s``, ``sigma_s`` (spatial), float64: what an ADM reference npz holds."""
    return stats_of(features(images, extractor, **kw))


# ------------------------------------------------------------------------------------------------------ metrics
def inception_score(logits: np.ndarray, split_size: int = IS_SPLIT) -> tuple[float, list[float]]:
    """The ADM evaluator's IS: softmax of the logits, consecutive splits of ``split_size``, exp(mean KL(p(y|x) ||
    p(y))) per split; returns (mean over splits, per-split scores)."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    scores = []
    for i in range(0, len(p), split_size):
        part = p[i:i + split_size]
        logp = np.log(np.clip(part, 1e-300, None))
        kl = (part * (logp - np.log(part.mean(axis=0, keepdims=True)))).sum(axis=1).mean()
        scores.append(float(np.exp(kl)))
    return float(np.mean(scores)), scores


def precision_recall(real: np.ndarray, fake: np.ndarray, k: int = PR_K, batch_size: int = 2048) -> tuple[float, float]:
    """Kynkäänniemi et al. (k-NN manifolds) through torch-fidelity's ``prc``: precision = share of ``fake`` inside
    some real point's ball (radius: distance to its k-th nearest other real point), recall = share of ``real``
    inside some fake point's ball. Euclidean distances in float32, compared with <=."""
    from torch_fidelity.metric_prc import prc_features_to_metric
    r = prc_features_to_metric(torch.as_tensor(np.asarray(fake, np.float32)),
                               torch.as_tensor(np.asarray(real, np.float32)),
                               prc_neighborhood=k, prc_batch_size=batch_size, save_cpu_ram=True, verbose=False)
    # torch-fidelity averages in float32: give the exact share (count / N) back
    return round(r["precision"] * len(fake)) / len(fake), round(r["recall"] * len(real)) / len(real)


def kid(real: np.ndarray, fake: np.ndarray, subset_size: int = 1000, seed: int = 0) -> tuple[float, float]:
    """torch-fidelity's KID (cubic polynomial kernel, 100 subsets of ``min(subset_size, N, N_ref)``)."""
    from torch_fidelity.metric_kid import kid_features_to_metric
    m = min(subset_size, len(real), len(fake))
    r = kid_features_to_metric(torch.as_tensor(np.asarray(fake, np.float32)),
                               torch.as_tensor(np.asarray(real, np.float32)),
                               kid_subset_size=m, rng_seed=seed, verbose=False)
    return float(r["kernel_inception_distance_mean"]), float(r["kernel_inception_distance_std"])


# ---------------------------------------------------------------------------------------------------- the suite
@dataclass
class _Ref:
    feats: dict | None
    stats: dict
    how: str


def _reference(src: ImageSource, fx: SuiteExtractor, batch_size, cache, progress) -> _Ref:
    """Reference features and statistics (the npz's own when it has them, as the evaluator does)."""
    feats = _cached_features(src, fx, batch_size, cache, progress) if src.has_images else None
    if src.stats is not None:
        return _Ref(feats, src.stats, f"precomputed mu / sigma / mu_s / sigma_s in {src.name}")
    return _Ref(feats, stats_of(feats), f"computed from {len(src)} reference images")


class _DINOv2Pool:
    """FD-DINOv2's features in the suite's form (``pool`` only)."""

    def __init__(self, weights, model, device):
        from vgen.eval.dinov2 import DINOv2Features
        self._fx = DINOv2Features(weights, model, device)
        self.name, self.weights = self._fx.model, self._fx.weights

    def __call__(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"pool": self._fx(images)}


def _warn(msg: str, out: list) -> None:
    out.append(msg)
    warnings.warn(msg, VGenWarning, stacklevel=3)


def evaluate(samples, reference="photos-test", suite: str = "adm", extractor="photo", *, weights=None,
             inception_weights=None, classifier=None, batch_size: int = 64, device="cpu",
             kid_subset_size: int = 1000, seed: int = 0, cache=None, progress: bool = False,
             fd_dinov2: bool = False, dinov2_weights=None, dinov2_model: str | None = None) -> dict:
    """The ADM table of ``samples`` against ``reference`` -> {"fid", "sfid", "is", "precision", "recall", "kid",
    "fd_dinov2", ...} plus how each was computed. ``reference``: a registered name (``photos-test``), a folder, or
    an ADM ``.npz`` whose precomputed statistics, when present, give FID / sFID (its images still give Precision,
    Recall and KID). ``weights`` (or ``inception_weights`` / ``classifier``): the extractor's file.
    ``fd_dinov2`` (implied by ``dinov2_weights``): add FD-DINOv2 (torch-fidelity's DINOv2 features, from a local
    file; ``$VGEN_DINOV2_WEIGHTS`` also works), on the samples and the reference images."""
    from vgen.eval import dinov2 as dv
    if suite not in SUITES:
        raise VGenError(f"unknown suite {suite!r}: use one of {', '.join(SUITES)}")
    if batch_size < 1:
        raise VGenError(f"batch_size must be >= 1, got {batch_size}")
    weights = weights or inception_weights or classifier
    if isinstance(extractor, str):
        _check_weights(extractor, weights)  # before any data is read
    dinov2_model = dinov2_model or dv.DEFAULT
    fd_dinov2 = fd_dinov2 or dinov2_weights is not None
    if fd_dinov2:
        dinov2_weights = dv.weights_path(dinov2_weights, dinov2_model)
    x = ImageSource(samples, "samples")
    y = ImageSource(reference, "reference")
    if len(x) <= PR_K:
        raise VGenError(f"samples: the suite needs more than {PR_K} images (Precision / Recall use the {PR_K} nearest "
                        f"neighbours), got {len(x)}")
    if y.has_images and len(y) <= PR_K:
        raise VGenError(f"reference: the suite needs more than {PR_K} images, got {len(y)}")
    notes: list[str] = []
    if len(x) < FID_MIN_SAMPLES:
        _warn(f"{len(x)} samples: FID is biased upwards below {FID_MIN_SAMPLES:,} samples (the papers use 50,000); "
              "compare numbers only at the same sample count", notes)
    ls = x.labels_seeds()
    rep = ls and seeds_repeated_across_classes(*ls)
    if rep:
        _warn(f"seed {rep[0]} was used for class {rep[1]} and class {rep[2]}: seeds repeat across classes, which "
              "correlates the samples; derive each sample's seed from its global index (vgen sample does)", notes)
    fx = suite_extractor(extractor, weights, device)
    probe = fx(next(x.batches(1)))  # the extractor's feature sizes, to check precomputed statistics against
    for src in (y, x):
        for a, kind in (("mu", "pool"), ("mu_s", "spatial")):
            if src.stats is not None and src.stats[a].shape[0] != probe[kind].shape[1]:
                raise VGenError(f"{src.what} statistics {a} have {src.stats[a].shape[0]} values but extractor "
                                f"{fx.name!r} gives {probe[kind].shape[1]}: they were made with another extractor "
                                "(an ADM reference batch needs extractor=inception)")
    ref = _reference(y, fx, batch_size, cache, progress)
    f = _features(x, fx, batch_size, progress)
    s = x.stats if x.stats is not None else stats_of(f)
    from vgen.eval.frechet import IMPLEMENTATION, frechet_distance
    is_mean, is_splits = inception_score(f["logits"])
    out = {
        "fid": frechet_distance(s["mu"], s["sigma"], ref.stats["mu"], ref.stats["sigma"]),
        "sfid": frechet_distance(s["mu_s"], s["sigma_s"], ref.stats["mu_s"], ref.stats["sigma_s"]),
        "is": is_mean,
        "precision": None, "recall": None, "kid": None, "kid_std": None,
    }
    if ref.feats is not None:
        out["precision"], out["recall"] = precision_recall(ref.feats["pool"], f["pool"])
        out["kid"], out["kid_std"] = kid(ref.feats["pool"], f["pool"], kid_subset_size, seed)
    else:
        _warn(f"reference {y.name} holds statistics but no images (arr_0): Precision, Recall and KID need its "
              "images and are left out", notes)
    out["fd_dinov2"] = None
    if fd_dinov2:
        if ref.feats is None:
            _warn(f"reference {y.name} holds no images: FD-DINOv2 needs them and is left out", notes)
        else:
            from vgen.eval.frechet import gaussian_stats
            dfx = _DINOv2Pool(dinov2_weights, dinov2_model, device)
            d_ref = _cached_features(y, dfx, batch_size, cache, progress)["pool"]
            d_s = _features(x, dfx, batch_size, progress)["pool"]
            out["fd_dinov2"] = frechet_distance(*gaussian_stats(d_s), *gaussian_stats(d_ref))
            out["dinov2"] = {"model": dinov2_model, "weights": str(dfx.weights),
                             "weights_sha256": sha256_file(dfx.weights), "features": int(d_s.shape[1])}
    import torch_fidelity

    from vgen.version import __version__
    out.update({
        "suite": suite, "num_samples": len(x), "num_reference": len(y) if y.has_images else None,
        "samples": x.name, "reference": y.name, "reference_stats": ref.how,
        "extractor": fx.name, "weights": str(fx.weights), "weights_sha256": sha256_file(fx.weights),
        "features": {"pool": int(f["pool"].shape[1]), "spatial": int(f["spatial"].shape[1]),
                     "logits": int(f["logits"].shape[1]), "spatial_layer": fx.spatial_layer},
        "frechet": IMPLEMENTATION,
        "is_splits": is_splits, "is_split_size": IS_SPLIT,
        "precision_recall": f"torch-fidelity {torch_fidelity.__version__} prc: k={PR_K}, Euclidean float32, <=",
        "kid_subset_size": min(kid_subset_size, len(x), len(y)) if ref.feats is not None else None,
        "vgen": __version__, "torch_fidelity": torch_fidelity.__version__, "warnings": notes,
    })
    return out


def markdown(res: dict) -> str:
    """The run's table and provenance, as Markdown."""
    def num(v, fmt):
        return "n/a" if v is None else format(v, fmt)
    kid_txt = "n/a" if res["kid"] is None else f"{res['kid']:.5f} +- {res['kid_std']:.5f}"
    rows = [("FID", num(res["fid"], ".3f")), ("sFID", num(res["sfid"], ".3f")), ("IS", num(res["is"], ".3f")),
            ("Precision", num(res["precision"], ".4f")), ("Recall", num(res["recall"], ".4f")), ("KID", kid_txt)]
    if res.get("fd_dinov2") is not None:
        rows.append(("FD-DINOv2", num(res["fd_dinov2"], ".3f")))
    lines = ["| metric | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    lines += ["", f"- samples: {res['samples']} ({res['num_samples']} images)",
              f"- reference: {res['reference']} ({res['num_reference'] or 'no'} images; statistics "
              f"{res['reference_stats']})",
              f"- extractor: {res['extractor']} ({res['weights']}, sha256 {res['weights_sha256']})",
              f"- features: pool {res['features']['pool']}-d; spatial {res['features']['spatial_layer']}; "
              f"logits {res['features']['logits']}",
              f"- Fréchet distance: {res['frechet']}",
              f"- IS: splits of {res['is_split_size']} ({len(res['is_splits'])} here), mean",
              f"- Precision / Recall: {res['precision_recall']}",
              f"- vgen {res['vgen']}, torch-fidelity {res['torch_fidelity']}"]
    if res.get("dinov2"):
        d = res["dinov2"]
        lines.append(f"- FD-DINOv2: {d['model']} CLS features ({d['features']}-d; {d['weights']}, sha256 "
                     f"{d['weights_sha256']}), torch-fidelity's preprocessing, same Fréchet distance")
    lines += [f"- warning: {w}" for w in res["warnings"]]
    return "\n".join(lines) + "\n"
