"""Bad values for every option of every command, generated from the commands' schemas (vgen.configs): each is a
one-line refusal (exit 2, no traceback) before anything is written. Wrong types for every typed field, non-finite
and non-numeric floats, negative counts and sizes, a device and a dtype that do not exist, and output paths that
cannot be written. A field added to a schema gets these cases without a new test; a field whose bad value is not
refused fails here (the run would start: slow, and a failure)."""
import dataclasses
import typing

import pytest
from guards import cli_refusal

from vgen.configs import BenchSchema, EvalSchema, SampleSchema, ScaleKVSchema

# the rest of each command's arguments: small, valid, and not the field under test
BASE = {
    "sample": (SampleSchema, ["sample"], {"num_samples": "1", "progress": "false", "outdir": "{out}"}),
    "bench": (BenchSchema, ["bench"], {"num_samples": "1", "repeats": "1", "batch_sizes": "[1]", "baseline": "false",
                                       "compile": "false", "outdir": "{out}"}),
    "eval": (EvalSchema, ["eval", "fid"], {"samples": "photos-train", "out": "{out}.json", "progress": "false"}),
    "scalekv": (ScaleKVSchema, ["scalekv", "calibrate"], {"num_samples": "1", "progress": "false",
                                                          "out": "{out}.json"}),
}
# counts and sizes: a negative one is refused (0 is a meaningful value for some: "off")
COUNTS = {"num_samples", "batch_size", "repeats", "grid_nrow", "prompt_frames", "samples_per_class", "threads",
          "kid_subset_size", "fid_samples", "fidelity_samples", "fvd_samples", "hf_repeats", "hf_zoo_samples",
          "hf_grid", "seed"}
# what is not an option a user types a value into (groups, the eval metric, dicts, free strings)
SKIP = {"model", "sampler", "options", "metric", "action", "labels", "prompts", "prompt_column", "fid_reference",
        "fvd_reference", "fidelity_reference", "reference", "extractor", "backend", "clip_model", "dinov2_model",
        "suite", "samplers", "models", "shapes", "cpu_shapes", "shape_dtypes", "hf_models", "hf_cpu_models",
        "hf_zoo_models", "hf_samplers", "hf_shape_samplers", "hf_dtype"}
PATHS = {"outdir", "out"}
INPUTS = {("eval", "samples"), ("eval", "classifier"), ("sample", "prompt"), ("sample", "prompt_file")}  # files read


def _kind(tp) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if typing.get_origin(tp) is typing.Union and args else tp
    if typing.get_origin(base) is list:
        return "list[int]" if typing.get_args(base) == (int,) else "list"
    return getattr(base, "__name__", str(base))


def bad_values(command: str, name: str, tp) -> list[str]:
    kind = _kind(tp)
    out = []
    if kind == "int":
        out += ["abc", "1.5"] + (["-3"] if name in COUNTS else [])
    elif kind == "float":
        out += ["abc", "nan", "inf"]
    elif kind == "bool":
        out += ["maybe"]
    elif kind == "list[int]":
        out += ["[a]", "[-2]"]
    if name == "device":
        out += ["tpu9"]
    if name == "dtype":
        out += ["int8"]
    if name in PATHS:
        out += ["/proc/vgen/x"]
    if (command, name) in INPUTS:
        out += ["/nonexistent/vgen.x"]
    return out


def cases():
    """Every (command, field, bad value); the first field of each (command, bad value) runs in the quick loop, the
    others (the same refusal path for another field) in the slow set."""
    seen = set()
    for command, (schema, head, base) in BASE.items():
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            if f.name in SKIP:
                continue
            for value in bad_values(command, f.name, hints[f.name]):
                marks = [pytest.mark.slow] if (command, value) in seen else []
                seen.add((command, value))
                yield pytest.param(command, f.name, value, id=f"{command}-{f.name}={value}", marks=marks)


CASES = list(cases())


def test_every_command_has_cases():
    assert {c.values[0] for c in CASES} == set(BASE) and len(CASES) > 60


@pytest.mark.parametrize("command,key,value", CASES)
def test_a_bad_value_is_a_one_line_refusal(command, key, value, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    schema, head, base = BASE[command]
    args = [*head] + [f"{k}={v.format(out=out)}" for k, v in base.items() if k != key] + [f"{key}={value}"]
    code, err = cli_refusal(args, capsys)
    assert code == 2, err
    assert key in err or value in err, err  # the line names what it refuses
    assert list(tmp_path.iterdir()) == []  # nothing written
