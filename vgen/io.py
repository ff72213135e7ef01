"""Atomic file writes: a temporary name in the same folder, then a rename. A killed job never leaves a
half-written file under the final name."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path

import torch

from vgen.errors import VGenError


def atomic_write_with(path: str | os.PathLike, write: Callable[[Path], None], exclusive: bool = False) -> Path:
    """Run ``write(tmp)`` on a new empty file next to ``path`` (``.<name>.<random>.tmp``, the usual permissions),
    then move it to ``path`` (``exclusive``: hard-link it there instead, raising FileExistsError if ``path``
    exists: a lock file appears with its content or not at all). The temporary file is removed on any way out, a
    Ctrl-C included wherever it lands: its name is fixed before it is created and the same ``try`` covers creating
    it (``tempfile.mkstemp`` returns the name only after creating the file, which left a window where an interrupt
    orphaned it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        while tmp is None:
            tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
            try:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies
            except FileExistsError:  # someone else's (48 random bits: practically never): another name
                tmp = None
        write(tmp)
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # moved already when all went well (or linked: then this removes the spare name)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    atomic_write_with(path, write)


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    """vgen's cache folder (created): ``path``, else ``$VGEN_CACHE``, else ``~/.cache/vgen``."""
    p = Path(path or os.environ.get("VGEN_CACHE") or Path.home() / ".cache" / "vgen").expanduser()
    p.mkdir(parents=True, exist_ok=True)
    return p


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def save_png(path: str | os.PathLike, image: torch.Tensor) -> None:
    """uint8 (3, H, W) tensor -> PNG, atomically."""
    import io

    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).contiguous().cpu().numpy()).save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())


def read_safetensors(path, fix: str) -> tuple[dict, dict]:
    """(tensors, raw metadata) of a safetensors file, or a one-line error ending in ``fix`` (how to make a good one)
    when it cannot be read (truncated, corrupt, not safetensors)."""
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(str(path), "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
    except (SafetensorError, OSError) as e:
        raise VGenError(f"{path} is not a readable safetensors file ({str(e).splitlines()[0]}): {fix}") from None


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


# ---- video ----------------------------------------------------------------------------------------------------
def _check_video(video: torch.Tensor) -> torch.Tensor:
    if video.dim() != 4 or video.shape[1] != 3 or video.dtype != torch.uint8:
        raise ValueError(f"a video is uint8 (T, 3, H, W), got {tuple(video.shape)} {video.dtype}")
    return video.cpu()


def encode_mp4(video: torch.Tensor, fps: int = 8, crf: int = 12) -> bytes:
    """uint8 (T, 3, H, W) -> H.264 MP4 bytes (PyAV; yuv420p, so even sides; ``crf`` 0 = lossless luma)."""
    import io

    import av
    video = _check_video(video)
    t, _, h, w = video.shape
    if h % 2 or w % 2:
        raise ValueError(f"H.264 needs even frame sides, got {h}x{w}")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as box:
        stream = box.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.options = {"crf": str(crf)}
        for frame in video.permute(0, 2, 3, 1).numpy():
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return buf.getvalue()


def save_mp4(path: str | os.PathLike, video: torch.Tensor, fps: int = 8) -> None:
    """uint8 (T, 3, H, W) -> MP4 (H.264), atomically."""
    atomic_write_bytes(path, encode_mp4(video, fps))


def read_video(path: str | os.PathLike) -> torch.Tensor:
    """A video file (MP4, GIF, anything FFmpeg reads) -> uint8 (T, 3, H, W)."""
    import av
    import numpy as np
    try:
        with av.open(str(path)) as box:
            frames = [f.to_ndarray(format="rgb24") for f in box.decode(video=0)]
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise VGenError(f"{path} is not a readable video ({str(e).splitlines()[0]}): give an MP4 or GIF file") \
            from None
    if not frames:
        raise VGenError(f"{path} holds no video frames")
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()


def save_gif(path: str | os.PathLike, video: torch.Tensor, fps: int = 8) -> None:
    """uint8 (T, 3, H, W) -> looping GIF (Pillow, adaptive palette per frame), atomically."""
    import io

    from PIL import Image
    video = _check_video(video)
    frames = [Image.fromarray(f) for f in video.permute(0, 2, 3, 1).numpy()]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0)
    atomic_write_bytes(path, buf.getvalue())


def frame_strip(video: torch.Tensor, pad: int = 2) -> torch.Tensor:
    """uint8 (T, 3, H, W) -> one row of its frames (3, H', W')."""
    return make_grid(_check_video(video), nrow=video.shape[0], pad=pad)


def command_line() -> list[str]:
    """The overrides the running Hydra app was given (empty outside one)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # no Hydra app is running
        return []
