"""Every ``vgen`` command of the README's and the getting-started page's ```bash blocks runs, parsed from the
Markdown, so a documented command cannot break unnoticed.

Each command is composed and validated with ``--cfg job`` (quick: the config groups, keys and types it names
exist); the ones ``composes_only`` lets run for real are also run (slow): ``vgen sample`` with a tiny
``num_samples`` into a temporary folder. Commands run in process through ``vgen.cli.main`` (what the ``vgen``
command runs), from the repository root so that the files they name resolve as in a checkout. A command that exits
non-zero fails its test with the page, line and text as written there. One test per command, its id the command.
"""
from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/getting-started.md")  # a missing page has no commands (it may not be written yet)
MAX_SAMPLES = 1  # a real `vgen sample` draws at most this many
DRAFT_WINDOW = 4  # the window a speculative sampler gets in a real run when its command leaves it at auto
HEAD_STEPS = 10  # the reverse steps a continuous head takes in a real run when its command leaves them at the model's
MASKED_PASSES = 8  # the passes MAR's own sampler makes in a real run when its command leaves num_iter at its 64
LONG_COMMANDS = {"bench": "benchmarks", "eval": "evaluates", "train": "trains", "demo": "serves the demo",
                 "scalekv": "calibrates"}
FILE_SUFFIXES = (".pth", ".pt", ".npz", ".mp4", ".gif", ".safetensors", ".json", ".png")


@dataclasses.dataclass(frozen=True)
class DocCommand:
    where: str  # "README.md:74"
    line: str  # the line as the page writes it
    argv: tuple  # the arguments after `vgen`

    @property
    def text(self) -> str:
        return shlex.join(("vgen", *self.argv))


def strip_comment(line: str) -> str:
    """The line without its trailing ``# comment`` (as bash reads it: a ``#`` outside quotes, starting a word)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def vgen_parts(line: str) -> list[list[str]]:
    """The vgen commands of one shell line: each ``&&``-chained part that is ``vgen ...``, or ``torchrun ... -m vgen
    ...`` (its vgen command); other programs (pip, pytest, ...) are left out."""
    parts, cur = [], []
    for tok in shlex.split(strip_comment(line)) + ["&&"]:
        if tok == "&&":
            parts.append(cur)
            cur = []
        else:
            cur.append(tok)
    out = []
    for p in parts:
        if p and p[0] == "vgen":
            out.append(p[1:])
        elif p and p[0] == "torchrun" and "-m" in p and p[p.index("-m") + 1:p.index("-m") + 2] == ["vgen"]:
            out.append(p[p.index("-m") + 2:])
    return out


def doc_commands(path: Path, name: str) -> list[DocCommand]:
    """Every vgen command in the ```bash fenced blocks of a Markdown page (none if the page does not exist); a line
    ending in a backslash continues on the next."""
    if not path.exists():
        return []
    out, fence, pending, first = [], False, "", 0
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        s = raw.strip()
        if s.startswith("```"):
            fence = not fence and s[3:].strip() in ("bash", "sh", "shell", "console")
            continue
        if not fence:
            continue
        first = first or n
        if s.endswith("\\"):
            pending += s[:-1].rstrip() + " "
            continue
        line, pending = pending + s, ""
        out += [DocCommand(f"{name}:{first}", line, tuple(argv)) for argv in vgen_parts(line)]
        first = 0
    return out


def all_commands() -> list[DocCommand]:
    """The documented commands, each once (the first page and line that writes it)."""
    seen, out = set(), []
    for name in DOCS:
        for c in doc_commands(REPO / name, name):
            if c.argv not in seen:
                seen.add(c.argv)
                out.append(c)
    return out


def _names_missing_file(value: str) -> bool:
    """A value naming a file or folder that is not in this checkout: a placeholder (``<pipeline>``,
    ``/path/to/...``, ``...``) or a path or checkpoint file that does not exist here."""
    if value.startswith("<") or value == "..." or "/path/" in value:
        return True
    if "/" in value or value.lower().endswith(FILE_SUFFIXES):
        return not (REPO / value).expanduser().exists()
    return False


def composes_only(argv) -> str | None:
    """The rule: why a documented command is only composed and validated (``--cfg job``), or None when it is run
    for real. Run for real: ``vgen --help`` and ``vgen sample`` (tiny, into a temporary folder: ``real_argv``).
    Composed only: commands that train, evaluate, benchmark, calibrate or serve the demo, a multirun (``-m``), a
    sample that compiles its decode step (``sampler.compile=true``: minutes of compilation on a CPU, which
    test_compile_auto covers), one on ``device=cuda`` (CI has no GPU), and a command naming a file that is not
    here (``/path/to/...``, ``<pipeline>``, a .pth / .pt / .npz / .mp4 ...)."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        return None
    if argv[0] != "sample":
        return f"it {LONG_COMMANDS.get(argv[0], 'is not vgen sample')}"
    if "-m" in argv or "--multirun" in argv:
        return "a multirun"
    if "sampler.compile=true" in (a.lower() for a in argv):
        return "it compiles"
    if any(a.startswith("device=cuda") for a in argv):
        return "it needs a GPU"
    missing = [a.partition("=")[2] for a in argv[1:] if _names_missing_file(a.partition("=")[2])]
    if missing:
        return f"{missing[0]} is not here"
    return None


def real_argv(argv, outdir: Path) -> list[str]:
    """A real run's arguments: the command's own, then ``num_samples`` capped at MAX_SAMPLES (the command's own
    value when smaller), ``outdir`` a temporary folder, no progress bar. A speculative sampler whose window the
    command leaves at ``auto`` gets ``sampler.window=DRAFT_WINDOW``: on first use ``window=auto`` times the widths
    on this machine (minutes), which the test does not need to check what the command runs. A continuous-token
    sampler left at the model's reverse steps gets ``HEAD_STEPS`` of them, and one left at its default number of
    passes (``num_iter``: MAR's 64) ``MASKED_PASSES``, for the same reason."""
    from vgen.samplers import sampler_classes
    given = dict(a.partition("=")[::2] for a in argv[1:] if "=" in a)
    n = min(int(given.get("num_samples", MAX_SAMPLES)), MAX_SAMPLES)
    out = [*argv, f"num_samples={n}", f"outdir={outdir}", "progress=false"]
    sampler = given.get("sampler")
    if sampler and "sampler.window" not in given:
        defaults = {f.name: f.default for cls in sampler_classes(sampler) for f in dataclasses.fields(cls.Options)}
        if defaults.get("window") == "auto":
            out.append(f"sampler.window={DRAFT_WINDOW}")
        takes_steps = all(any(f.name == "num_sampling_steps" for f in dataclasses.fields(cls.Options))
                          for cls in sampler_classes(sampler))  # "ar" is also the token models' sampler
        if takes_steps and defaults.get("num_sampling_steps") == 0 and "sampler.num_sampling_steps" not in given:
            out.append(f"sampler.num_sampling_steps={HEAD_STEPS}")  # a continuous head's reverse steps (MAR: 100)
        if "num_iter" in defaults and "sampler.num_iter" not in given:
            out.append(f"sampler.num_iter={min(MASKED_PASSES, defaults['num_iter'])}")  # MAR's passes: 64
    return out


def sweep_points(argv) -> list[list[str]]:
    """A multirun's (``-m``) commands, one per point of its sweep (``key=a,b`` gives one with ``key=a``, one with
    ``key=b``; several swept keys, every combination), without ``-m``: Hydra composes one config at a time with
    ``--cfg job``. Any other command: itself."""
    if "-m" not in argv and "--multirun" not in argv:
        return [list(argv)]
    points = [[]]
    for a in argv:
        if a in ("-m", "--multirun"):
            continue
        key, sep, value = a.partition("=")
        plain_sweep = sep and "," in value and not any(c in value for c in "[]{}()'\"")
        points = [p + [f"{key}={v}" if plain_sweep else a] for p in points
                  for v in (value.split(",") if plain_sweep else [value])]
    return points


def run_command(argv, capsys) -> tuple[int, str]:
    """Run ``vgen <argv>`` in process: its exit code and stderr."""
    from vgen.cli import main
    try:
        main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, capsys.readouterr().err.strip()


COMMANDS = all_commands()
RUNNABLE = [c for c in COMMANDS if composes_only(c.argv) is None]


def test_parser_reads_the_shell_lines_as_documented():
    assert strip_comment("vgen sample   # zoo model # again") == "vgen sample"
    assert strip_comment("vgen bench 'samplers=[ar,\"a#b\"]' x=#y # c") == "vgen bench 'samplers=[ar,\"a#b\"]' x=#y"
    assert vgen_parts("pip install -e . && vgen sample") == [["sample"]]
    assert vgen_parts("vgen train recipe=msvq && vgen train recipe=var  # two") == [["train", "recipe=msvq"],
                                                                                   ["train", "recipe=var"]]
    assert vgen_parts("torchrun --nproc_per_node=2 -m vgen sample num_samples=1000 outdir=big") == [
        ["sample", "num_samples=1000", "outdir=big"]]
    assert vgen_parts("vgen bench 'samplers=[ar,\"sjd:window=4\"]' b=[1]") == [
        ["bench", 'samplers=[ar,"sjd:window=4"]', "b=[1]"]]
    assert vgen_parts("pytest -q tests") == [] and vgen_parts("torchrun -m torch.x") == []


def test_parser_takes_bash_blocks_only_and_skips_missing_pages(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("vgen sample outside\n```text\nvgen sample text_block=1\n```\n```bash\npip install x\n"
                    "vgen sample a=1 \\\n  b=2   # joined\n```\n```python\nvgen = 1\n```\n")
    assert doc_commands(page, "page.md") == [
        DocCommand("page.md:7", "vgen sample a=1 b=2   # joined", ("sample", "a=1", "b=2"))]
    assert doc_commands(tmp_path / "absent.md", "absent.md") == []


def test_the_rule():
    assert composes_only(["sample", "model=photos-var"]) is None
    assert composes_only(["--help"]) is None
    assert composes_only(["sample", "model.path=/path/to/pipeline_folder"]) == "/path/to/pipeline_folder is not here"
    assert composes_only(["sample", "prompt=clip.mp4"]) == "clip.mp4 is not here"
    assert composes_only(["sample", "model.path=vgen/zoo/photos-gpt"]) is None  # a folder of this checkout
    assert composes_only(["sample", "-m", "sampler=ar,sjd"]) == "a multirun"
    assert composes_only(["sample", "sampler.compile=true", "num_samples=256"]) == "it compiles"
    assert composes_only(["bench"]) == "it benchmarks" and composes_only(["train", "recipe=vq"]) == "it trains"
    assert real_argv(["sample", "sampler=sjd", "num_samples=256"], Path("o"))[3:] == [
        f"num_samples={MAX_SAMPLES}", "outdir=o", "progress=false", f"sampler.window={DRAFT_WINDOW}"]
    assert real_argv(["sample", "num_samples=1", "sampler=zipar"], Path("o"))[3:] == [
        "num_samples=1", "outdir=o", "progress=false"]  # zipar's window is not auto
    assert real_argv(["sample", "sampler=sjd", "sampler.window=8"], Path("o"))[-1] == "progress=false"
    assert real_argv(["sample", "model=photos-mar", "sampler=mar"], Path("o"))[-2:] == [
        f"sampler.num_sampling_steps={HEAD_STEPS}", f"sampler.num_iter={MASKED_PASSES}"]
    assert [a for a in real_argv(["sample", "sampler=mar", "sampler.num_iter=4"], Path("o"))
            if a.startswith("sampler.num_iter")] == ["sampler.num_iter=4"]  # the command's own value kept
    assert sweep_points(["sample", "-m", "sampler=ar,sjd", "seed=0,1", "labels=[0,3]"]) == [
        ["sample", f"sampler={s}", f"seed={n}", "labels=[0,3]"] for s in ("ar", "sjd") for n in (0, 1)]
    assert sweep_points(["sample", "labels=[0,3]"]) == [["sample", "labels=[0,3]"]]


def test_the_readme_has_its_commands():
    """The parser finds the README's commands (a change of its format must not leave this module testing
    nothing)."""
    readme = {c.argv for c in COMMANDS if c.where.startswith("README.md")}
    assert len(readme) >= 10
    assert ("sample",) in readme


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.text for c in COMMANDS])
def test_documented_command_composes(cmd, capsys, monkeypatch):
    """Composition and validation of the config (``--cfg job``: nothing runs), for every documented command."""
    monkeypatch.chdir(REPO)
    if not cmd.argv or cmd.argv[0].startswith("-"):  # vgen --help: no config
        points = [list(cmd.argv)]
    else:
        points = [[*argv, "--cfg", "job"] for argv in sweep_points(cmd.argv)]
    for argv in points:
        code, err = run_command(argv, capsys)
        if code != 0:
            pytest.fail(f"{cmd.where}: `{cmd.line}` (as `vgen {shlex.join(argv)}`) exited {code}: {err}")


@pytest.mark.slow
@pytest.mark.parametrize("cmd", RUNNABLE, ids=[c.text for c in RUNNABLE])
def test_documented_command_runs(cmd, capsys, monkeypatch, tmp_path):
    """The commands ``composes_only`` lets run, run: `vgen sample` writes its samples and stats.json."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    argv = real_argv(cmd.argv, out) if cmd.argv and cmd.argv[0] == "sample" else list(cmd.argv)
    code, err = run_command(argv, capsys)
    if code != 0:
        pytest.fail(f"{cmd.where}: `{cmd.line}` (as `vgen {shlex.join(argv)}`) exited {code}: {err}")
    if argv and argv[0] == "sample":
        assert (out / "stats.json").exists(), f"{cmd.where}: `{cmd.line}` wrote no stats.json in {out}"
