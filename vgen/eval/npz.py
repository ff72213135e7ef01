"""ADM-style ``.npz`` batches, streamed.

An ADM reference or sample batch holds ``arr_0`` (uint8 images, N x H x W x 3) and, in the reference batches
OpenAI published (e.g. ``VIRTUAL_imagenet256_labeled.npz``), precomputed Inception statistics ``mu`` / ``sigma``
(pool_3) and ``mu_s`` / ``sigma_s`` (spatial). 10,000 images at 256 px are 2 GB and a 50,000-sample batch 10 GB,
so ``arr_0`` is read in batches straight from the zip member (stored or deflated), never whole.
"""
from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np

from vgen.errors import VGenError

STATS_KEYS = ("mu", "sigma", "mu_s", "sigma_s")


def _zip(path: Path, what: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise VGenError(f"{what}: {path} is not a readable .npz ({str(e).splitlines()[0]}): write it again "
                        "with `vgen eval npz` or np.savez") from None


def npz_keys(path: str | os.PathLike, what: str = "npz") -> list[str]:
    with _zip(Path(path), what) as z:
        return [n[:-4] for n in z.namelist() if n.endswith(".npy")]


class NpzArray:
    """One array of an ``.npz`` file: ``shape``, ``dtype`` and ``batches(n)`` (C-order arrays only)."""

    def __init__(self, path: str | os.PathLike, key: str = "arr_0", what: str = "npz"):
        self.path, self.key, self.what = Path(path), key, what
        with _zip(self.path, what) as z:
            if f"{key}.npy" not in z.namelist():
                hint = " (the ADM evaluator's layout puts the images in arr_0)" if key == "arr_0" else ""
                raise VGenError(f"{what}: {self.path} has no {key!r} array{hint}")
            with z.open(f"{key}.npy") as f:
                self.shape, self.dtype, self._offset = self._header(f)

    def _header(self, f):
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
        except ValueError as e:
            raise VGenError(f"{self.what}: {self.path}:{self.key} is not a readable .npy array ({e})") from None
        if fortran or dtype.hasobject:
            raise VGenError(f"{self.what}: {self.path}:{self.key} is stored in Fortran order or holds Python "
                            "objects: save a C-ordered numeric array (np.ascontiguousarray)")
        return tuple(shape), dtype, f.tell()

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def batches(self, n: int) -> Iterator[np.ndarray]:
        row = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        with _zip(self.path, self.what) as z, z.open(f"{self.key}.npy") as f:
            f.read(self._offset)
            for start in range(0, len(self), n):
                k = min(n, len(self) - start)
                buf = bytearray()
                while len(buf) < k * row:
                    chunk = f.read(k * row - len(buf))
                    if not chunk:
                        raise VGenError(f"{self.what}: {self.path}:{self.key} ends after {start + len(buf) // row} "
                                        f"of {len(self)} rows: the file is truncated, write it again")
                    buf += chunk
                yield np.frombuffer(buf, dtype=self.dtype).reshape((k, *self.shape[1:]))  # writable: no copy

    def read(self) -> np.ndarray:
        """The whole array (for small ones: statistics, labels)."""
        with _zip(self.path, self.what) as z, z.open(f"{self.key}.npy") as f:
            return np.lib.format.read_array(f)


def read_stats(path: str | os.PathLike, what: str = "reference") -> dict | None:
    """The precomputed ``mu``, ``sigma``, ``mu_s``, ``sigma_s`` of an ADM batch (float64), or None when it has
    none. Half a set is an error: the file is not what the ADM evaluator writes."""
    keys = set(npz_keys(path, what))
    have = [k for k in STATS_KEYS if k in keys]
    if not have:
        return None
    if len(have) != len(STATS_KEYS):
        missing = ", ".join(k for k in STATS_KEYS if k not in keys)
        raise VGenError(f"{what}: {path} has precomputed statistics but lacks {missing}: an ADM batch holds all "
                        "four (mu, sigma, mu_s, sigma_s) or none")
    out = {k: NpzArray(path, k, what).read().astype(np.float64) for k in STATS_KEYS}
    for m, s in (("mu", "sigma"), ("mu_s", "sigma_s")):
        d = out[m].shape
        if len(d) != 1 or out[s].shape != (d[0], d[0]):
            raise VGenError(f"{what}: {path}: {m} {out[m].shape} and {s} {out[s].shape} are not a mean and its "
                            "covariance")
    return out


def write_npz(path: str | os.PathLike, arrays: dict) -> Path:
    """Write an ``.npz`` (stored, zip64) atomically, streaming: each value is an array, or a tuple
    ``(shape, dtype, iterator of row batches)`` written as it comes (a 50,000-image batch never sits in memory
    whole). A killed writer leaves no file at ``path``."""
    from vgen.io import atomic_write_with

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
            for key, value in arrays.items():
                if isinstance(value, tuple):
                    shape, dtype, parts = value
                else:
                    a = np.ascontiguousarray(value)
                    shape, dtype, parts = a.shape, a.dtype, [a]
                dtype = np.dtype(dtype)
                with z.open(f"{key}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array_header_2_0(
                        f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                            "shape": tuple(int(s) for s in shape)})
                    rows = 0
                    for part in parts:
                        part = np.ascontiguousarray(part, dtype=dtype)
                        f.write(part.tobytes())
                        rows += len(part) if part.ndim else 1
                    if shape and rows != shape[0]:
                        raise VGenError(f"npz {key}: wrote {rows} rows, expected {shape[0]}")
        os.chmod(tmp, 0o644)
    return atomic_write_with(path, write)
