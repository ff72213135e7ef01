"""Every shipped experiment file (vgen/configs/experiment/*.yaml) composes with its command's config and passes the
checks that command makes before any weights load: a typo in a setting, a model or an option fails here, not an
hour into a benchmark."""
from pathlib import Path

import pytest
import yaml

EXPERIMENTS = sorted((Path(__file__).resolve().parents[1] / "vgen" / "configs" / "experiment").glob("*.yaml"))
BENCH_KEYS = {"samplers", "models", "hf_models", "hf_cpu_models", "hf_zoo_models", "shapes", "cpu_shapes"}


def command_of(path: Path) -> str:
    """bench for a file that sets the bench's own keys, else sample (the ADM / COCO sampling jobs)."""
    return "bench" if BENCH_KEYS & set(yaml.safe_load(path.read_text()) or {}) else "sample"


def compose(command: str, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from vgen.configs import register
    register()
    with initialize_config_module(config_module="vgen.configs", version_base="1.3"):
        return hydra_compose(config_name=command, overrides=overrides)


def test_the_experiments_are_found():
    assert len(EXPERIMENTS) >= 20 and {command_of(p) for p in EXPERIMENTS} == {"bench", "sample"}


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_experiment_composes_and_passes_the_checks(path):
    from vgen import validate
    from vgen.configs import SCHEMAS
    command = command_of(path)
    cfg = compose(command, [f"+experiment={path.stem}"])
    validate.config(cfg, SCHEMAS[command])
    if command == "bench":
        from vgen.eval import hf_speed, shapes
        from vgen.eval.bench import plan
        p = plan(cfg)  # every sampler setting against every model card
        assert p.settings
        shapes.check(cfg)
        hf_speed.check(cfg)
        hf_speed.check_zoo(cfg)


def test_a_broken_experiment_setting_is_caught():
    """The check above can fail: the readme experiment with a misspelt sampler option does."""
    from vgen.errors import VGenError
    from vgen.eval.bench import plan
    cfg = compose("bench", ["+experiment=readme", "samplers=[ar,'sjd:windw=4']"])
    with pytest.raises(VGenError, match="windw"):
        plan(cfg)


def test_bench_names_the_commit_it_started_from():
    """A bench JSON names the commit the run started from, marked +dirty where the package differs from it; read
    once, so a commit made during a long run does not relabel it."""
    import re
    import subprocess

    from vgen.eval.bench.measuring import code_version
    here = Path(__file__).parent
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    first = code_version()
    assert re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?", first)
    assert code_version() is code_version()  # cached: the run's start
