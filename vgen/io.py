"""Atomic file writes: a temporary name in the same folder, then a rename. A killed job never leaves a
half-written file under the final name."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch


_UMASK = os.umask(0)  # read once at import (os.umask can only be read by setting it)
os.umask(_UMASK)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def save_png(path: str | os.PathLike, image: torch.Tensor) -> None:
    """uint8 (3, H, W) tensor -> PNG, atomically."""
    import io

    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).contiguous().cpu().numpy()).save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())


def save_safetensors(state_dict: dict, path: str | os.PathLike, metadata: dict | None = None) -> None:
    from safetensors.torch import save
    tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    atomic_write_bytes(path, save(tensors, metadata=metadata))


def read_pngs(files) -> torch.Tensor:
    """Image files of one size -> uint8 (N, 3, H, W)."""
    import numpy as np
    from PIL import Image
    arrs = []
    for f in files:
        with Image.open(f) as im:
            arrs.append(np.asarray(im.convert("RGB")))
    return torch.from_numpy(np.stack(arrs)).permute(0, 3, 1, 2).contiguous()


def make_grid(images: torch.Tensor, nrow: int = 8, pad: int = 2) -> torch.Tensor:
    """uint8 (N, 3, H, W) -> one uint8 (3, H', W') grid with white padding."""
    n, c, h, w = images.shape
    nrow = max(1, min(nrow, n))
    ncol = (n + nrow - 1) // nrow
    grid = torch.full((c, ncol * (h + pad) + pad, nrow * (w + pad) + pad), 255, dtype=torch.uint8)
    for i in range(n):
        r, q = divmod(i, nrow)
        y, x = pad + r * (h + pad), pad + q * (w + pad)
        grid[:, y:y + h, x:x + w] = images[i]
    return grid
