"""Plugin discovery: the modules a package declares under one of vgen's entry-point groups (``vgen.loaders``,
``vgen.kinds``; vgen's own pyproject.toml declares its built-in ones there too), imported once per process on the
first lookup that needs them, so that importing vgen imports none of them."""
from __future__ import annotations

_LOADED: set[str] = set()


def load_group(group: str) -> None:
    """Import every module declared under entry-point ``group`` (the first call per group; later calls return)."""
    if group in _LOADED:
        return
    _LOADED.add(group)  # before importing: a module of the group that looks the group up does not recurse
    from importlib.metadata import entry_points
    for ep in entry_points(group=group):
        ep.load()
