"""FVD: Fréchet Video Distance, with the StyleGAN-V I3D protocol (cd-fvd's network) or the offline FVD-photo.

    vgen.eval.fvd(videos, "clips-test")                                   # FVD-photo (zoo video classifier)
    vgen.eval.fvd("samples/", "clips-test", extractor="i3d", i3d_weights="i3d_pretrained_400.pt")

``samples`` / ``reference``: a uint8 (N, T, 3, H, W) (or (N, T, H, W, 3)) tensor or array, a folder of clips
(``*.mp4``, or ``*.gif`` when it holds no MP4: a ``vgen sample`` folder of a video model works as it is), an
``.npz`` with ``arr_0`` holding such an array, or a registered reference name (``clips-test``, ``clips-train``).
All clips of a set share one size and length; the extractors resize and fit the length inside (the I3D sees 16
frames: shorter clips repeat each frame, frame k of 16 being frame ``k * T // 16``; longer clips keep their
first 16). Reference features are computed once and cached on disk (``$VGEN_CACHE`` or ``~/.cache/vgen``, under
``fvd/``), keyed by the data, the extractor and the digest of its weights.
"""
from __future__ import annotations

import functools
import hashlib
import io
import os
import zipfile
from pathlib import Path

import numpy as np
import torch

from vgen import validate
from vgen.errors import VGenError
from vgen.eval.extractors import file_digest
from vgen.eval.video_extractors import (
    I3D_FRAMES,
    VideoClassifier,
    fit_frames,
    i3d_logits,
    i3d_weights_path,
    load_i3d,
    load_video_classifier,
    random_i3d_weights,
    state_digest,
    video_classifier_features,
    video_classifier_path,
)
from vgen.io import cache_dir

EXTRACTORS = ("photo", "i3d")
VIDEO_SUFFIXES = (".mp4", ".gif")  # a folder's MP4s; its GIFs only when it has no MP4
# Registered references: name -> clips() arguments (held-out test region / training region, 8 frames, 32 px).
REFERENCES = {
    "clips-test": dict(split="test", n=512, seed=0, frames=8, size=32),
    "clips-train": dict(split="train", n=512, seed=0, frames=8, size=32),
}

__all__ = ["EXTRACTORS", "REFERENCES", "fvd", "load_videos", "list_videos", "frechet_distance", "extract_features",
           "fit_frames", "random_i3d_weights"]


def list_videos(folder: Path) -> list[Path]:
    """The clips of a folder: its ``.mp4`` files, or its ``.gif`` files when there is no MP4 (sorted; hidden
    files skipped)."""
    for suffix in VIDEO_SUFFIXES:
        files = sorted(p for p in folder.iterdir()
                       if p.suffix.lower() == suffix and p.is_file() and not p.name.startswith("."))
        if files:
            return files
    return []


def load_videos(source, what: str = "samples") -> tuple[torch.Tensor, str]:
    """-> (uint8 (N, T, 3, H, W) tensor, a key naming the data for caches)."""
    if isinstance(source, str) and source in REFERENCES:
        a = REFERENCES[source]
        return _registered(source), f"{source}-n{a['n']}-s{a['seed']}-{a['frames']}f-{a['size']}px"
    if isinstance(source, (str, os.PathLike)):
        p = Path(source).expanduser()
        if p.is_dir():
            files = list_videos(p)
            if not files:
                raise VGenError(f"{what}: no clips ({', '.join(VIDEO_SUFFIXES)}) in folder {p}: write them with "
                                "`vgen sample` of a video model or vgen.io.save_mp4")
            videos = _read_files(files, what)
        elif p.is_file() and p.suffix == ".npz":
            try:
                with np.load(p) as z:
                    if "arr_0" not in z:
                        raise VGenError(f"{what}: {p} has no 'arr_0' array: save the clips as arr_0, uint8 "
                                        "(N, T, H, W, 3)")
                    arr = z["arr_0"]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
                raise VGenError(f"{what}: {p} is not a readable .npz ({str(e).splitlines()[0]}): write it again "
                                "with numpy.savez(path, arr_0=clips)") from None
            videos = _from_array(arr, what)
        else:
            kind = "does not exist" if not p.exists() else "is not a folder of clips (.mp4 / .gif) or an .npz"
            raise VGenError(f"{what}: {str(source)!r} {kind}: give a folder of clips, an .npz with arr_0, or a "
                            f"registered reference ({', '.join(REFERENCES)})")
    else:
        videos = _from_array(source, what)
    return videos, "data-" + hashlib.sha1(videos.numpy().tobytes()).hexdigest()[:16]


@functools.lru_cache(maxsize=2)
def _registered(name: str) -> torch.Tensor:
    from vgen.data import clips
    return clips(**REFERENCES[name]).videos


def _read_files(files: list[Path], what: str) -> torch.Tensor:
    from vgen.io import read_video
    videos, shapes = [], {}
    for f in files:
        v = read_video(f)  # one-line VGenError for an unreadable file
        shapes.setdefault(tuple(v.shape), f.name)
        if len(shapes) > 1:
            (s0, f0), (s1, f1) = list(shapes.items())[:2]
            raise VGenError(f"{what}: clips in {f.parent} differ in shape ({f0}: {s0[0]} frames of {s0[2]}x{s0[3]}, "
                            f"{f1}: {s1[0]} frames of {s1[2]}x{s1[3]}): give one length and size per set")
        videos.append(v)
    return torch.stack(videos)


def _from_array(x, what: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x)) if not torch.is_tensor(x) else x.detach().cpu()
    if t.dtype != torch.uint8:
        raise VGenError(f"{what}: expected uint8 clips (0..255), got dtype {t.dtype}; convert with "
                        "vgen.data.to_uint8")
    if t.dim() != 5:
        raise VGenError(f"{what}: expected a 5-d batch of clips (N, T, 3, H, W), got shape {tuple(t.shape)}")
    if t.shape[2] != 3 and t.shape[-1] == 3:
        t = t.permute(0, 1, 4, 2, 3)
    if t.shape[2] != 3:
        raise VGenError(f"{what}: expected 3 colour channels (N, T, 3, H, W), got shape {tuple(t.shape)}")
    return t.contiguous()


def frechet_distance(f1: np.ndarray, f2: np.ndarray) -> float:
    """Fréchet distance between the Gaussians fitted to two feature sets (N, D), on the statistics StyleGAN-V's FVD
    and cd-fvd use (float64 mean and population covariance, divided by N, not N - 1), with vgen's stable distance
    (:func:`vgen.eval.frechet.frechet_distance`, the one the ADM suite uses)."""
    from threadpoolctl import threadpool_limits

    from vgen.eval.frechet import frechet_distance as fd
    f1, f2 = np.asarray(f1, dtype=np.float64), np.asarray(f2, dtype=np.float64)
    # One BLAS thread: threaded OpenBLAS next to other busy processes spin-waits (a 512x512 sqrtm took 11 s on 2
    # shared cores instead of 0.3 s on one)
    with threadpool_limits(1, "blas"):
        return fd(f1.mean(axis=0), np.cov(f1, rowvar=False, bias=True), f2.mean(axis=0),
                  np.cov(f2, rowvar=False, bias=True))


def extract_features(videos: torch.Tensor, extractor: str, net, batch_size: int = 16, device="cpu",
                     progress: bool = False) -> np.ndarray:
    """FVD features of uint8 clips (N, T, 3, H, W) -> float32 (N, D): the 400 I3D logits or the video
    classifier's pooled features (``net.num_features``: 256-d for the zoo's)."""
    fn = i3d_logits if extractor == "i3d" else video_classifier_features
    return fn(net, videos, batch_size=batch_size, device=device, progress=progress)


def _weights(extractor: str, i3d_weights, video_classifier) -> tuple[object, str]:
    """-> (what to load: a path or a ready model, a digest for cache keys). Fails before any data is read."""
    if extractor == "i3d":
        p = i3d_weights_path(i3d_weights)
        return p, file_digest(p, 12)
    if isinstance(video_classifier, torch.nn.Module):
        if not isinstance(video_classifier, VideoClassifier):
            raise VGenError(f"video_classifier must be a VideoClassifier or a path to its safetensors, got "
                            f"{type(video_classifier).__name__}")
        return video_classifier, "module-" + state_digest(video_classifier)
    p = video_classifier_path(video_classifier)
    return p, file_digest(p, 12)


def fvd(samples, reference="clips-test", extractor: str = "photo", *, i3d_weights=None, video_classifier=None,
        batch_size: int = 16, device="cpu", cache: str | os.PathLike | None = None, progress: bool = False) -> dict:
    """FVD of ``samples`` against ``reference``; returns a dict of plain floats, ints and strings.

    ``extractor="i3d"``: the StyleGAN-V protocol as cd-fvd packages it (``InceptionI3d(400)``, weights from
    ``i3d_weights`` or ``$VGEN_I3D_WEIGHTS``, ``preprocess_i3d``, the 400 logits). The I3D sees exactly 16 frames:
    clips shorter than 16 are stretched by repeating frames (frame k of 16 is frame ``k * T // 16``, so 8 frames
    show twice each), longer clips keep their first 16. ``extractor="photo"`` (default): FVD-photo, the pooled
    features of the zoo's video classifier (256-d) (``video_classifier``: another file, or a ``VideoClassifier`` object,
    put in eval mode), which fits clips to its own length the same way. Reference features are cached.
    """
    if extractor not in EXTRACTORS:
        raise VGenError(f"unknown FVD extractor {extractor!r}: use one of {', '.join(EXTRACTORS)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise VGenError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    device = validate.device(device)
    weights, digest = _weights(extractor, i3d_weights, video_classifier)  # fail before touching any data
    x, _ = load_videos(samples, "samples")
    y, ref_key = load_videos(reference, "reference")
    for name, t in (("samples", x), ("reference", y)):
        if len(t) < 2:
            raise VGenError(f"{name}: FVD needs at least 2 clips, got {len(t)}")
    if extractor == "i3d":
        net, frames = load_i3d(weights, device), I3D_FRAMES
    else:
        if isinstance(weights, VideoClassifier):
            net = weights.to(device).eval()
        else:
            net = load_video_classifier(weights, device)
        frames = net.frames
    common = dict(extractor=extractor, net=net, batch_size=batch_size, device=device, progress=progress)
    cached = cache_dir(cache) / "fvd" / f"{ref_key}-{extractor}-{digest}.npy"
    if cached.exists():
        f2 = np.load(cached)
    else:
        from vgen.io import atomic_write_bytes
        f2 = extract_features(y, **common)
        buf = io.BytesIO()
        np.save(buf, f2)
        atomic_write_bytes(cached, buf.getvalue())
    f1 = extract_features(x, **common)
    return {"fvd": frechet_distance(f1, f2), "num_samples": len(x), "num_reference": len(y),
            "extractor": extractor, "frames": frames, "sample_frames": int(x.shape[1]),
            "reference_frames": int(y.shape[1]), "features": int(f1.shape[1]),
            "reference": reference if isinstance(reference, str) else ref_key,
            "weights": str(weights) if isinstance(weights, Path) else digest}
