"""Files: atomic writes (a temporary name in the same folder, then a rename: a killed job never leaves a
half-written file under the final name), image / video / safetensors readers and writers, and prompt files
(:func:`read_prompts`)."""
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


def read_json(path: str | os.PathLike, what: str, fix: str, kind: type = dict):
    """A JSON file vgen wrote (a record, a calibration): its object, or a one-line ``VGenError`` naming the file,
    what it should be and ``fix`` when it is unreadable, not JSON or not a ``kind``."""
    from vgen.errors import VGenError
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise VGenError(f"{what} {p} not found: {fix}") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise VGenError(f"{what} {p} is not readable JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__}): "
                        f"{fix}") from None
    if not isinstance(data, kind):
        raise VGenError(f"{what} {p} holds a {type(data).__name__}, not a JSON {kind.__name__}: {fix}")
    return data


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


# ---- prompts --------------------------------------------------------------------------------------------------
PROMPT_COLUMNS = ("caption", "prompt", "text")  # tried in this order when no column is named
PROMPT_FORMS = ".txt (one prompt per line), .jsonl (one object per line), .csv (a header row), .json (a list)"


def read_prompts(path: str | os.PathLike, column: str | None = None) -> list[str]:
    """The text prompts of a file, in file order (prompt i goes with sample i).

    - ``.txt``: one prompt per line; a blank line is an error (it would shift every prompt after it).
    - ``.jsonl``: one JSON object per line, the prompt in ``column`` (a line may also be a bare JSON string).
    - ``.csv``: a header row naming the columns, then one prompt per row, in ``column``.
    - ``.json``: a list of strings, or of objects with ``column``.

    ``column`` None: the first of ``caption``, ``prompt``, ``text`` the file has (the first record's keys, or the
    header). Prompts are stripped of surrounding whitespace; an empty one is an error. Every error is one line
    naming the file, the line (or list index) and the fix."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise VGenError(f"prompts: {p} is a folder: give a prompt file, {PROMPT_FORMS}")
    if not p.is_file():
        raise VGenError(f"prompts: {p} does not exist: give a prompt file, {PROMPT_FORMS}")
    suffix = p.suffix.lower()
    if suffix not in (".txt", ".jsonl", ".csv", ".json"):
        raise VGenError(f"prompts: {p}: unknown prompt file type {p.suffix or '(no suffix)'!r}: use {PROMPT_FORMS}")
    if suffix == ".txt" and column is not None:
        raise VGenError(f"prompts: {p} is a .txt file (one prompt per line, no columns): drop prompt_column={column}")
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark (spreadsheet exports) is dropped
    except UnicodeDecodeError as e:
        raise VGenError(f"prompts: {p} is not UTF-8 text ({e.reason} at byte {e.start}): save it as UTF-8") from None
    except OSError as e:
        raise VGenError(f"prompts: cannot read {p} ({e.strerror or e})") from None
    reader = {".txt": _prompts_txt, ".jsonl": _prompts_jsonl, ".csv": _prompts_csv, ".json": _prompts_json}[suffix]
    prompts = reader(p, text, column)
    if not prompts:
        raise VGenError(f"prompts: {p} holds no prompts")
    return prompts


def _lines(text: str) -> list[str]:
    """The lines as an editor numbers them (``\\n`` or ``\\r\\n``; the newline ending the file ends the last line)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def _prompt_text(value, where: str, column: str | None) -> str:
    what = f"column {column!r}" if column else "the prompt"
    if not isinstance(value, str):
        raise VGenError(f"prompts: {where}: {what} is {type(value).__name__} {json.dumps(value)[:40]}, not text")
    if not value.strip():
        raise VGenError(f"prompts: {where}: {what} is empty: every sample needs its prompt")
    return value.strip()


def _pick_column(keys, column: str | None, where: str) -> str:
    keys = list(keys)
    have = ", ".join(repr(k) for k in keys[:8]) + (", ..." if len(keys) > 8 else "") or "none"
    if column is not None:
        if column not in keys:
            raise VGenError(f"prompts: {where} has no column {column!r} (it has {have}): name the prompt's column "
                            "with prompt_column=")
        return column
    for c in PROMPT_COLUMNS:
        if c in keys:
            return c
    raise VGenError(f"prompts: {where} has none of the columns {', '.join(map(repr, PROMPT_COLUMNS))} (it has "
                    f"{have}): name the prompt's column with prompt_column=")


def _prompts_txt(p: Path, text: str, column) -> list[str]:
    out = []
    for n, line in enumerate(_lines(text), 1):
        if not line.strip():
            raise VGenError(f"prompts: {p}: line {n} is blank: a .txt prompt file holds one prompt on every line "
                            "(remove the line, or write its prompt)")
        out.append(line.strip())
    return out


def _prompts_jsonl(p: Path, text: str, column: str | None) -> list[str]:
    out, col = [], None
    for n, line in enumerate(_lines(text), 1):
        where = f"{p}: line {n}"
        if not line.strip():
            raise VGenError(f"prompts: {where} is blank: a .jsonl prompt file holds one JSON object on every line")
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise VGenError(f"prompts: {where} is not JSON ({e.msg} at column {e.colno})") from None
        if isinstance(rec, str) and column is None:
            out.append(_prompt_text(rec, where, None))
            continue
        if not isinstance(rec, dict):
            raise VGenError(f"prompts: {where} is a JSON {type(rec).__name__}, not an object with the prompt's column")
        if col is None:
            col = _pick_column(rec.keys(), column, where)
        elif col not in rec:
            raise VGenError(f"prompts: {where} has no column {col!r} (the lines before it have it): every line "
                            "needs the prompt's column")
        out.append(_prompt_text(rec[col], where, col))
    return out


def _prompts_csv(p: Path, text: str, column: str | None) -> list[str]:
    import csv
    import io
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if not header or not any(h.strip() for h in header):
            raise VGenError(f"prompts: {p}: line 1 is not a header row: a .csv prompt file starts with the column "
                            f"names (e.g. caption)")
        col = _pick_column([h.strip() for h in header], column, f"{p}: the header (line 1)")
        i = [h.strip() for h in header].index(col)
        out = []
        for row in reader:
            where = f"{p}: line {reader.line_num}"
            if not row:
                raise VGenError(f"prompts: {where} is blank: a .csv prompt file holds one prompt on every row")
            if i >= len(row):
                raise VGenError(f"prompts: {where} has {len(row)} fields and no value in column {col!r}")
            out.append(_prompt_text(row[i], where, col))
    except csv.Error as e:
        raise VGenError(f"prompts: {p}: line {reader.line_num} is not valid CSV ({e})") from None
    return out


def _prompts_json(p: Path, text: str, column: str | None) -> list[str]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise VGenError(f"prompts: {p}: line {e.lineno} is not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(data, list):
        raise VGenError(f"prompts: {p} holds a JSON {type(data).__name__}: a .json prompt file holds a list of "
                        "prompts (strings, or objects with the prompt's column)")
    out, col = [], None
    for k, rec in enumerate(data):
        where = f"{p}[{k}]"
        if isinstance(rec, str) and column is None:
            out.append(_prompt_text(rec, where, None))
            continue
        if not isinstance(rec, dict):
            raise VGenError(f"prompts: {where} is a JSON {type(rec).__name__}: give a string or an object with the "
                            "prompt's column")
        if col is None:
            col = _pick_column(rec.keys(), column, where)
        elif col not in rec:
            raise VGenError(f"prompts: {where} has no column {col!r}: every entry needs the prompt's column")
        out.append(_prompt_text(rec[col], where, col))
    return out
