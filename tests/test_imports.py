"""vgen's import graph: no module imports itself back through others (no cycles), and no module imports a module of
a higher layer (docs/architecture.md, "Layers"). Read from the source with ``ast``: absolute and relative imports,
at module level or inside functions (a lazy import is still a dependency) or under ``TYPE_CHECKING``."""
import ast
from pathlib import Path

VGEN = Path(__file__).resolve().parents[1] / "vgen"

# Lowest first; a module may import its own layer's modules and lower layers' (the longest matching prefix names a
# module's layer). docs/architecture.md explains each layer.
LAYERS = [
    ("vgen.errors", "vgen.version", "vgen.plugins"),
    ("vgen.io", "vgen.stats", "vgen.validate", "vgen.hub", "vgen.distributed", "vgen.data", "vgen.threads"),
    ("vgen.kernels",),
    ("vgen.interfaces", "vgen.conditions", "vgen.cards"),
    ("vgen.models.loading",),
    ("vgen.models",),
    ("vgen.tokenizers",),
    ("vgen.kinds",),
    ("vgen.samplers",),
    ("vgen.pipeline", "vgen.hf_pipeline"),
    ("vgen.eval", "vgen.jobs"),
    ("vgen.train",),
    ("vgen.configs", "vgen.commands", "vgen.cli", "vgen.demo", "vgen.__main__", "vgen"),
]


def modules(root: Path = VGEN) -> dict[str, Path]:
    """Dotted name -> file of every module under ``root`` (a package is named by its folder)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def imports_of(name: str, path: Path, known: set[str]) -> dict[str, int]:
    """The vgen modules ``name`` imports -> the first line importing each. ``from a.b import c`` names the module
    ``a.b.c`` where that is one, else ``a.b``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        for t in targets:
            if (t == "vgen" or t.startswith("vgen.")) and t != name:
                out[t] = min(out.get(t, node.lineno), node.lineno)
    return out


def import_graph(root: Path = VGEN) -> dict[str, dict[str, int]]:
    mods = modules(root)
    return {m: imports_of(m, p, set(mods)) for m, p in mods.items()}


def find_cycle(graph: dict[str, dict]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None (depth-first search, nodes in sorted order)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(n):
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def layer(module: str) -> int:
    best, level = "", None
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, level = prefix, i
    if level is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to docs/architecture.md)")
    return level


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a": 1}}) == ["a", "a"]
    assert find_cycle({"a": {"b": 1, "c": 1}, "b": {"c": 1}, "c": {}}) is None


def test_the_graph_sees_lazy_relative_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "vgen"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from vgen.sub import high\n")
    (pkg / "sub" / "__init__.py").write_text("from . import high\n")
    (pkg / "sub" / "high.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from ..low import f\n")
    g = import_graph(pkg)
    assert g["vgen.low"] == {"vgen.sub.high": 2}
    assert g["vgen.sub"] == {"vgen.sub.high": 1}
    assert g["vgen.sub.high"] == {"vgen.low": 3}
    assert find_cycle(g) == ["vgen.low", "vgen.sub.high", "vgen.low"]


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    return [f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)}), line {line}"
            for m, targets in graph.items() for t, line in targets.items() if layer(t) > layer(m)]


def test_an_upward_import_is_found():
    graph = {"vgen.interfaces": {"vgen.samplers.base": 258, "vgen.errors": 3}, "vgen.samplers.base": {}}
    assert upward_imports(graph) == ["vgen.interfaces (layer 3) imports vgen.samplers.base (layer 8), line 258"]


def test_nothing_is_imported_from_a_higher_layer():
    up = upward_imports(import_graph())
    assert not up, "\n".join(up)

