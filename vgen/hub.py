"""Hugging Face Hub references, resolved through ``huggingface_hub`` (which honours ``HF_HUB_OFFLINE``,
``HF_HOME`` and ``HF_HUB_CACHE``): a file or folder already in the local HF cache loads by name, offline.

    hf://owner/repo/path/in/repo      a file (checkpoints) or a folder (pipelines); "hf://owner/repo" is the root
    ("owner/repo", filename="f.pt")   the same file, given apart (only when no local path "owner/repo" exists)

The environment is read at each call (not only when ``huggingface_hub`` is imported), so setting
``HF_HUB_OFFLINE=1`` or ``HF_HUB_CACHE`` in a running process takes effect. Failures raise a one-line
``VGenError`` naming the repo, the file and the fix. ``huggingface_hub`` is imported only when a Hub
reference is actually resolved."""
from __future__ import annotations

import os
import re
from pathlib import Path

from vgen.errors import VGenError

HF_SCHEME = "hf://"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TRUE = {"1", "ON", "YES", "TRUE"}


def is_hub_ref(src, filename: str | None = None) -> bool:
    """True for an ``"hf://owner/repo[/path]"`` string; with ``filename`` given, also for a plain ``"owner/repo"``
    that names no local path (a local path always wins)."""
    if not isinstance(src, (str, os.PathLike)):
        return False
    s = os.fspath(src)
    if not isinstance(s, str):
        return False
    if s.startswith(HF_SCHEME):
        return True
    return filename is not None and _looks_like_repo_id(s) and not Path(s).expanduser().exists()


def parse_hub_ref(ref: str) -> tuple[str, str]:
    """``"hf://owner/repo/sub/path"`` -> ``("owner/repo", "sub/path")``; the path is ``""`` for the repo root."""
    s = os.fspath(ref)
    if not s.startswith(HF_SCHEME):
        raise VGenError(f"{s!r} is not a Hugging Face Hub reference: write hf://owner/repo[/path]")
    parts = [p for p in s[len(HF_SCHEME):].split("/") if p]
    repo_id = "/".join(parts[:2])
    if len(parts) < 2 or not _looks_like_repo_id(repo_id):
        raise VGenError(f"{s!r} does not name a Hugging Face Hub repo: write hf://owner/repo[/path]")
    return repo_id, "/".join(parts[2:])


def hub_file(repo_id: str, filename: str, revision: str | None = None) -> Path:
    """Local path of ``filename`` in Hub repo ``repo_id`` (from the HF cache; downloaded unless offline).

    The path is the snapshot entry (``.../snapshots/<commit>/<filename>``), which keeps the file's name and
    suffix (the blob it links to has none)."""
    hf = _import_hub()
    try:
        path = hf.hf_hub_download(repo_id, filename, revision=revision, cache_dir=_cache_dir(),
                                  local_files_only=_offline())
    except _hub_errors() as e:
        raise VGenError(_explain(e, repo_id, filename, revision, folder=False)) from None
    return Path(path)


def hub_folder(repo_id: str, subfolder: str = "", revision: str | None = None, local_only: bool = False) -> Path:
    """Local folder of Hub repo ``repo_id`` (its snapshot in the HF cache), or of ``subfolder`` inside it;
    downloaded unless offline (only ``subfolder``'s files when one is given). ``local_only``: never download,
    whatever ``HF_HUB_OFFLINE`` says (the snapshot must be cached already; which of its files are there is the
    caller's to check)."""
    hf = _import_hub()
    sub = subfolder.strip("/")
    try:
        snap = hf.snapshot_download(repo_id, revision=revision, cache_dir=_cache_dir(),
                                    local_files_only=local_only or _offline(),
                                    allow_patterns=[f"{sub}/*"] if sub else None)
    except _hub_errors() as e:
        raise VGenError(_explain(e, repo_id, sub, revision, folder=True, local_only=local_only)) from None
    folder = Path(snap) / sub if sub else Path(snap)
    if not folder.is_dir():
        raise VGenError(f"{_label(repo_id, revision)}: folder {sub!r} is not in the cached snapshot {snap}: "
                        f"{_download_hint(repo_id, sub, revision, folder=True)}, or pass a local folder")
    return folder


def resolve_checkpoint(src, filename: str | None = None, revision: str | None = None):
    """What ``load_official`` reads: a Hub reference -> local file path; anything else unchanged.

    ``"hf://owner/repo/file"`` (``filename``, if also given, is joined to the path); ``"owner/repo"`` with
    ``filename`` when no local path of that name exists; a local folder with ``filename`` -> the file in it.
    A state dict or a plain local path is returned as is."""
    if not isinstance(src, (str, os.PathLike)):
        if filename is not None or revision is not None:
            raise VGenError("filename= and revision= name a file in a Hugging Face Hub repo: pass src as "
                            "'owner/repo' or 'hf://owner/repo/file', not a state dict")
        return src
    s = os.fspath(src)
    if s.startswith(HF_SCHEME):
        repo_id, path = parse_hub_ref(s)
        if filename is not None:
            path = f"{path}/{filename.strip('/')}" if path else filename.strip("/")
        if not path:
            raise VGenError(f"{s!r} names a repo, not a file: write hf://{repo_id}/<file> or pass filename=")
        return hub_file(repo_id, path, revision)
    local = Path(s).expanduser()
    if local.exists():  # a local path always wins
        if revision is not None:
            raise VGenError(f"{s} is a local path and revision= applies only to Hugging Face Hub repos: drop "
                            f"revision= or write hf://{s.strip('/')}" + (f"/{filename}" if filename else ""))
        if filename is None:
            return src
        if local.is_dir():
            return local / filename
        raise VGenError(f"{s} is a local file: filename= applies only to a Hub repo or a folder; drop filename=")
    if filename is not None:
        if not _looks_like_repo_id(s):
            raise VGenError(f"{s!r} is neither a local path nor a Hugging Face Hub repo id (owner/name)")
        return hub_file(s, filename, revision)
    if revision is not None:
        raise VGenError(f"revision= needs a Hugging Face Hub reference: pass ('owner/repo', filename=...) or "
                        f"'hf://owner/repo/file', not {s!r}")
    return src


def download_command(repo_id: str, files=(), revision: str | None = None, local_dir=None) -> str:
    """The command that fetches ``files`` (all of the repo when none) of ``repo_id`` with the installed
    huggingface_hub CLI (``hf`` since 0.34, ``huggingface-cli`` before), into the HF cache or ``local_dir``."""
    parts = [_cli(), "download", repo_id, *files]
    if revision:
        parts += ["--revision", revision]
    if local_dir is not None:
        parts += ["--local-dir", os.fspath(local_dir)]
    return " ".join(parts)


# --- internals ---------------------------------------------------------------------------------------------

def _looks_like_repo_id(s: str) -> bool:
    return bool(_REPO_ID.match(s)) and ".." not in s and not s.endswith(".")


def _import_hub():
    try:
        import huggingface_hub
    except ImportError:
        raise VGenError("Hugging Face Hub references need the huggingface_hub package: pip install "
                        "'huggingface_hub>=0.24', or pass a local path") from None
    return huggingface_hub


def _hub_errors() -> tuple[type[BaseException], ...]:
    """The library's lookup/download errors (``huggingface_hub.errors`` since 0.23; ``.utils`` before)."""
    import huggingface_hub.utils as utils
    try:
        import huggingface_hub.errors as errors
    except ImportError:
        errors = None
    names = ("LocalEntryNotFoundError", "EntryNotFoundError", "RepositoryNotFoundError", "RevisionNotFoundError",
             "GatedRepoError", "OfflineModeIsEnabled", "HfHubHTTPError", "HFValidationError")
    found = [getattr(errors, n, None) or getattr(utils, n, None) for n in names]
    return tuple(c for c in found if isinstance(c, type))


def _env_true(name: str) -> bool:
    return (os.environ.get(name) or "").strip().upper() in _TRUE


def _offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub itself reads it once, at import), or as it was at import."""
    if _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE"):
        return True
    from huggingface_hub import constants
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _cache_dir() -> str | None:
    """The hub cache named by the environment now (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub); None: the
    library's default."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return os.path.expandvars(os.path.expanduser(os.environ[name]))
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expandvars(os.path.expanduser(os.environ["HF_HOME"])), "hub")
    return None


def _cli() -> str:
    """The download command of the installed huggingface_hub: ``hf`` since 0.34, ``huggingface-cli`` before."""
    import huggingface_hub
    m = re.match(r"(\d+)\.(\d+)", getattr(huggingface_hub, "__version__", ""))
    return "hf" if m is None or (int(m.group(1)), int(m.group(2))) >= (0, 34) else "huggingface-cli"


def _label(repo_id: str, revision: str | None) -> str:
    return f"{repo_id}@{revision}" if revision else repo_id


def _download_hint(repo_id: str, path: str, revision: str | None, folder: bool) -> str:
    what = (f" --include '{path}/*'" if path else "") if folder else f" {path}"
    rev = f" --revision {revision}" if revision else ""
    return f"download it once with `{_cli()} download {repo_id}{what}{rev}`"


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _explain(e: BaseException, repo_id: str, path: str, revision: str | None, folder: bool,
             local_only: bool = False) -> str:
    """One line: the repo (and revision), the file or folder, what went wrong, the fix."""
    kinds = {c.__name__ for c in type(e).__mro__}  # by name: the classes moved between huggingface_hub versions
    what = (f"folder {path!r}" if path else "the repo snapshot") if folder else path
    where = _label(repo_id, revision)
    local = "pass a local folder" if folder else "pass a local path"
    if "HFValidationError" in kinds:
        return f"{repo_id!r} (file {path!r}) is not a valid Hugging Face Hub reference: {_first_line(e)}"
    if "RevisionNotFoundError" in kinds:
        return (f"{repo_id}: revision {revision!r} does not exist on the Hub, so {what} cannot be fetched: "
                f"use an existing branch, tag or commit, or {local}")
    if "RepositoryNotFoundError" in kinds:  # GatedRepoError included
        login = "hf auth login" if _cli() == "hf" else "huggingface-cli login"
        return (f"{where}: cannot fetch {what}: the repo does not exist on the Hub or is private/gated "
                f"(log in with `{login}`), or {local}")
    if kinds & {"LocalEntryNotFoundError", "OfflineModeIsEnabled"}:  # IncompleteSnapshotError included
        why = ("read from the cache only" if local_only else "HF_HUB_OFFLINE=1" if _offline()
               else "and the Hub could not be reached")
        if "IncompleteSnapshotError" in kinds:
            why += "; the cached snapshot is incomplete"
        return (f"{where}: {what} is not in the local Hugging Face cache ({why}): "
                f"{_download_hint(repo_id, path, revision, folder)}, or {local}")
    if "EntryNotFoundError" in kinds:  # remote: the repo has no such file
        return f"{where}: {what} does not exist in the repo: check the name, or {local}"
    return (f"{where}: could not fetch {what} from the Hugging Face Hub ({type(e).__name__}: {_first_line(e)}): "
            f"{_download_hint(repo_id, path, revision, folder)}, or {local}")
