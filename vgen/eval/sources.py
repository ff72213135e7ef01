"""The images an evaluation scores, read and checked: a registered reference name (``photos-test``), a folder of
images, an ADM ``.npz``, or a uint8 tensor / array. :func:`load_images` loads them whole (FID, KID, IS);
:class:`ImageSource` streams them in batches (the ADM suite)."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from vgen.errors import VGenError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
# Registered references: name -> photos() arguments (held-out test region / training crops, 64 px).
REFERENCES = {
    "photos-test": dict(split="test", n=1000, seed=0, size=64),
    "photos-train": dict(split="train", n=1000, seed=0, size=64),
    # photos-t2i's data: captioned test crops (colour and brightness treatments included, vgen.data.captions)
    "captioned-test": dict(split="test", n=1000, seed=0, size=64, captioned=True),
}


VIDEO_SUFFIXES = (".mp4", ".gif")


def list_images(folder: Path, what: str = "samples") -> list[Path]:
    """The images of a folder (``grid.png`` and hidden files skipped). A folder of clips (``vgen sample`` of a
    video model: MP4 / GIF / strip PNGs) is refused: its strips are not samples of an image model."""
    clips = [p for p in folder.iterdir() if p.suffix.lower() in VIDEO_SUFFIXES and not p.name.startswith(".")]
    if clips:
        raise VGenError(f"{what}: {folder} holds video clips ({clips[0].name}, ...): score them with `vgen eval fvd "
                        f"samples={folder}` (FVD); FID / the ADM suite score images")
    files = sorted(p for p in folder.iterdir()
                   if p.suffix.lower() in IMAGE_SUFFIXES and p.name != "grid.png" and not p.name.startswith("."))
    return files


def load_images(source, what: str = "samples") -> tuple[torch.Tensor, str]:
    """-> (uint8 (N, 3, H, W) tensor, a key naming the data for caches)."""
    if source is None:
        raise VGenError(f"{what}: say which images: a folder of images, an .npz file, a uint8 tensor or a registered "
                        f"reference ({', '.join(REFERENCES)})")
    if isinstance(source, str) and source in REFERENCES:
        a = REFERENCES[source]
        return _registered(source), f"{source}-n{a['n']}-s{a['seed']}-{a['size']}px"
    if isinstance(source, (str, os.PathLike)):
        p = Path(source).expanduser()
        if p.is_dir():
            files = list_images(p, what)
            if not files:
                raise VGenError(f"{what}: no images ({', '.join(IMAGE_SUFFIXES)}) in folder {p}")
            images = _read_files(files, what)
        elif p.is_file() and p.suffix == ".npz":
            try:
                with np.load(p) as z:
                    if "arr_0" not in z:
                        raise VGenError(f"{what}: {p} has no 'arr_0' array (the ADM evaluator's layout)")
                    arr = z["arr_0"]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # not a zip, truncated, pickled objects
                raise VGenError(f"{what}: {p} is not a readable .npz ({str(e).splitlines()[0]}): write it again "
                                "with `vgen eval npz`") from None
            images = _from_array(arr, what, nhwc=True)
        else:
            names = ", ".join(REFERENCES)
            raise VGenError(f"{what}: {str(source)!r} is neither a folder of images, an .npz file, nor a "
                            f"registered reference ({names})")
    else:
        images = _from_array(source, what, nhwc=False)
    return images, "data-" + hashlib.sha1(images.numpy().tobytes()).hexdigest()[:16]


@functools.lru_cache(maxsize=2)
def _registered(name: str) -> torch.Tensor:
    from vgen.data import photos
    a = REFERENCES[name]
    if a.get("captioned"):
        from vgen.data.captions import captioned_photos
        return captioned_photos(a["split"], a["n"], seed=a["seed"], size=a["size"]).images
    return photos(a["split"], a["n"], seed=a["seed"], size=a["size"]).images


def _read_files(files: list[Path], what: str) -> torch.Tensor:
    from vgen.io import read_pngs
    check_image_files(files, what)
    return read_pngs(files)


def check_image_files(files: list[Path], what: str) -> None:
    """Every file a readable image and all of one size: a one-line error naming the file otherwise."""
    from PIL import Image, UnidentifiedImageError
    sizes = set()
    for f in files:
        try:
            with Image.open(f) as im:
                im.verify()
                sizes.add(im.size)
        except (UnidentifiedImageError, OSError, SyntaxError) as e:
            raise VGenError(f"{what}: {f} is not a readable image ({str(e).splitlines()[0]}): remove or replace "
                            "it") from None
    if len(sizes) > 1:
        raise VGenError(f"{what}: images in {files[0].parent} differ in size ({sorted(sizes)[:3]}...): "
                        "resize them to one size first")


def _from_array(x, what: str, nhwc: bool) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x)) if not torch.is_tensor(x) else x.detach().cpu()
    if t.dtype != torch.uint8:
        raise VGenError(f"{what}: expected uint8 images (0..255), got dtype {t.dtype}; convert with "
                        "vgen.data.to_uint8")
    if t.dim() == 5:
        raise VGenError(f"{what}: a 5-d array {tuple(t.shape)} holds video clips: score them with `vgen eval fvd` "
                        "(vgen.eval.fvd); FID / the ADM suite score images (N, 3, H, W)")
    if t.dim() != 4:
        raise VGenError(f"{what}: expected a 4-d batch of images, got shape {tuple(t.shape)}")
    if nhwc or (t.shape[1] != 3 and t.shape[-1] == 3):
        t = t.permute(0, 3, 1, 2)
    if t.shape[1] != 3:
        raise VGenError(f"{what}: expected 3 colour channels, got shape {tuple(t.shape)}")
    return t.contiguous()


class ImageSource:
    """Images to score, read in batches of uint8 (B, 3, H, W): a registered reference name (``photos-test``), a
    folder of images, an ADM ``.npz`` (``arr_0`` uint8 NHWC, streamed), or a uint8 tensor / array (NCHW or NHWC).
    Everything is checked on construction (count, shape, dtype), before any feature is computed."""

    def __init__(self, source, what: str = "samples"):
        self.what, self.source = what, source
        self._files = self._images = self._npz = None
        self.stats = None
        if isinstance(source, str) and source in REFERENCES:
            self._images, self._key = load_images(source, what)
            self.kind, self.name = "registered", source
        elif isinstance(source, (str, os.PathLike)):
            p = Path(source).expanduser()
            self.name = str(p)
            if p.is_dir():
                self.kind = "folder"
                self._files = list_images(p, what)
                if not self._files:
                    raise VGenError(f"{what}: no images (.png, .jpg, ...) in folder {p}")
                check_image_files(self._files, what)
            elif p.is_file() and p.suffix == ".npz":
                from vgen.eval.npz import NpzArray, npz_keys, read_stats
                self.kind = "npz"
                self.stats = read_stats(p, what)
                if "arr_0" in npz_keys(p, what) or self.stats is None:
                    self._npz = NpzArray(p, "arr_0", what)
                    s = self._npz.shape
                    if len(s) == 5:
                        raise VGenError(f"{what}: {p}: arr_0 {s} holds video clips: score them with `vgen eval fvd`")
                    if self._npz.dtype != np.uint8 or len(s) != 4 or s[-1] != 3:
                        raise VGenError(f"{what}: {p}: arr_0 is {self._npz.dtype} {s}; the ADM layout is uint8 "
                                        "(N, H, W, 3)")
            else:
                names = ", ".join(REFERENCES)
                raise VGenError(f"{what}: {str(source)!r} is neither a folder of images, an .npz file, nor a "
                                f"registered reference ({names})")
        else:
            self._images, _ = load_images(source, what)
            self.kind, self.name = "array", f"array{tuple(self._images.shape)}"

    def __len__(self) -> int:
        if self._files is not None:
            return len(self._files)
        if self._npz is not None:
            return len(self._npz)
        return 0 if self._images is None else len(self._images)

    @property
    def has_images(self) -> bool:
        return len(self) > 0

    def batches(self, n: int) -> Iterator[torch.Tensor]:
        if self._files is not None:
            from vgen.io import read_pngs
            for i in range(0, len(self._files), n):
                yield read_pngs(self._files[i:i + n])
        elif self._npz is not None:
            for b in self._npz.batches(n):
                yield torch.from_numpy(b).permute(0, 3, 1, 2).contiguous()
        elif self._images is not None:
            for i in range(0, len(self._images), n):
                yield self._images[i:i + n]

    def key(self) -> str:
        """Names the data for caches: the registered name, else a digest of the bytes."""
        if self.kind == "registered":
            return self._key
        h = hashlib.sha1()
        if self._files is not None:
            for f in self._files:
                h.update(f.name.encode())
                h.update(f.read_bytes())
        elif self.kind == "npz":
            from vgen.eval.extractors import file_digest
            return "data-" + file_digest(self.source)
        else:
            h.update(self._images.numpy().tobytes())
        return "data-" + h.hexdigest()[:16]

    def labels_seeds(self) -> tuple[list[int], list[int]] | None:
        """Per-image class labels and seeds where the data records them: a ``vgen sample`` folder (its
        ``stats.json``: sample i has seed ``seed + i``) or an npz with ``arr_1`` (labels) and ``seeds``."""
        if self.kind == "folder":
            st = Path(self.source) / "stats.json"
            try:
                d = json.loads(st.read_text())
                labels, seed = d["labels"], int(d["seed"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
            idx = [int(f.stem) for f in self._files if f.stem.isdigit()]
            if len(idx) != len(self._files) or max(idx, default=-1) >= len(labels):
                return None
            return [int(labels[i]) for i in idx], [seed + i for i in idx]
        if self.kind == "npz":
            from vgen.eval.npz import NpzArray, npz_keys
            keys = npz_keys(self.source, self.what)
            if "arr_1" in keys and "seeds" in keys:
                labels = NpzArray(self.source, "arr_1", self.what).read().reshape(-1).tolist()
                seeds = NpzArray(self.source, "seeds", self.what).read().reshape(-1).tolist()
                if len(labels) == len(seeds) == len(self):
                    return [int(x) for x in labels], [int(x) for x in seeds]
        return None
