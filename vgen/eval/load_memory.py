"""What loading a released-size checkpoint costs in memory (``vgen bench +experiment=quantized-load``).

A LlamaGen GPT at a released shape (:data:`vgen.eval.shapes.SHAPES`, random weights) is saved as the official
release is (``torch.save({"model": state_dict})``, or as .safetensors), then loaded in a fresh process per cell, so
each peak is that load's alone:

* ``float32-whole``: ``load_official(..., stream=False)``: the model built in memory (randomly initialised), the
  whole checkpoint read, then copied in (how vgen loaded before loads streamed);
* ``float32``: :func:`vgen.models.loading.load_official` as every float load runs: built without memory for its
  parameters, filled one tensor at a time;
* ``int8-after`` / ``int4-after``: the same float load, then :func:`vgen.kernels.quant.quantize_model` (what a
  pipeline's ``.quantize(mode)`` does after loading);
* ``int8`` / ``int4``: ``load_official(..., quantize=mode)``, quantized while loading (one layer's float weights
  held at a time).

Each cell records what the process held before loading (Python, torch and vgen imported: ``VmRSS``), its peak
resident memory during the load (``VmHWM``, reset just before it through ``/proc/self/clear_refs``; elsewhere than
Linux the process's peak so far, imports included), the seconds of the load and the bytes of the loaded weights.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from vgen.errors import VGenError

FORMATS = ("pt", "safetensors")


def check(cfg) -> list[str]:
    """The shapes whose loads this run measures (``load_shapes``), with the formats and modes checked."""
    from vgen.eval.shapes import SHAPES
    from vgen.kernels.quant import check_mode
    names = [str(s) for s in (cfg.get("load_shapes") or [])]
    unknown = [s for s in names if s not in SHAPES]
    if unknown:
        raise VGenError(f"unknown load_shapes {unknown}: choose from {', '.join(SHAPES)}")
    bad = [f for f in cfg.get("load_formats") or [] if f not in FORMATS]
    if bad:
        raise VGenError(f"unknown load_formats {bad}: choose from {', '.join(FORMATS)}")
    for q in cfg.get("load_quantize") or []:
        check_mode(str(q), cfg.get("quantize_group", 32))
    return names


def modes(quantize: list[str]) -> list[str]:
    return ["float32-whole", "float32"] + [f"{q}-after" for q in quantize] + list(quantize)


def save_shape(name: str, folder: Path, fmt: str) -> Path:
    """The shape's random float32 weights as a checkpoint file in ``folder`` (the official layout)."""
    import torch

    from vgen.eval.shapes import build_shape
    model = build_shape(name, torch.float32, torch.device("cpu"))
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    del model
    path = folder / f"{name}.{fmt}"
    if fmt == "pt":
        torch.save({"model": sd}, path)
    else:
        from safetensors.torch import save_file
        save_file(sd, str(path))
    return path


def measure(path: Path, name: str, mode: str, group: int = 32) -> dict:
    """One load of ``path`` in ``mode`` in a fresh Python process: its peak memory and seconds."""
    out = subprocess.run([sys.executable, "-m", "vgen.eval.load_memory", str(path), name, mode, str(group)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise VGenError(f"loading {path.name} as {mode} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(cfg) -> dict:
    """Every shape x format x mode; the checkpoints are written to a temporary folder and removed after."""
    names = check(cfg)
    quantize = [str(q) for q in (cfg.get("load_quantize") or [])]
    group = int(cfg.get("quantize_group", 32))
    result: dict = {"modes": modes(quantize), "shapes": {}}
    for name in names:
        for fmt in cfg.get("load_formats") or ["pt"]:
            with tempfile.TemporaryDirectory(prefix="vgen-load-") as tmp:
                path = save_shape(name, Path(tmp), fmt)
                cells = result["shapes"].setdefault(name, {}).setdefault(fmt, {})
                cells["file_mb"] = path.stat().st_size / 2 ** 20
                for mode in result["modes"]:
                    cells[mode] = measure(path, name, mode, group)
    return result


def markdown(result: dict) -> str:
    """One row per shape, format and mode: the process's peak, what it held before loading, what the load added
    (and that against loading float32 whole), seconds, and the loaded weights' bytes."""
    lines = ["| shape | file | load | peak RSS MB | before loading MB | added by the load MB | x float32-whole | "
             "load s | weight MB |", "|---|---|---|---|---|---|---|---|---|"]
    for name, by in result["shapes"].items():
        for fmt, cells in by.items():
            ref = max(cells["float32-whole"]["peak_mb"] - cells["float32-whole"]["base_mb"], 1e-9)
            for mode in result["modes"]:
                c = cells[mode]
                added = c["peak_mb"] - c["base_mb"]
                lines.append(f"| {name} | {fmt} ({cells['file_mb']:.0f} MB) | {mode} | {c['peak_mb']:.0f} | "
                             f"{c['base_mb']:.0f} | {added:.0f} | {added / ref:.2f} | {c['load_s']:.1f} | "
                             f"{c['weight_mb']:.0f} |")
    return "\n".join(lines)


def _child(path: str, name: str, mode: str, group: int) -> dict:
    import resource
    import time

    import torch

    from vgen.eval.shapes import SHAPES, TOKENS
    from vgen.kernels.quant import quantize_model, weight_bytes
    from vgen.models.loading import load_official

    def status(field: str) -> float | None:  # MB, from /proc/self/status (Linux)
        try:
            for line in open("/proc/self/status"):
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 2 ** 10
        except OSError:
            return None
        return None

    torch.set_num_threads(max(1, torch.get_num_threads()))
    try:  # the peak from here on: the high-water mark reset to what the process holds now (Linux)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base, peak_mb = status("VmRSS"), lambda: status("VmHWM")
    except OSError:  # elsewhere: the process's peak so far, imports included
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scale = 2 ** 20 if sys.platform == "darwin" else 2 ** 10  # bytes on macOS, kilobytes on Linux
        base, peak_mb = r / scale, lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
    config = {"n_head": SHAPES[name][2], "block_size": TOKENS}
    t0 = time.perf_counter()
    q = mode.removesuffix("-after")
    if mode.startswith("float32"):
        model = load_official("gpt", path, stream=mode == "float32", **config)
    elif mode.endswith("-after"):
        model = load_official("gpt", path, **config)
        quantize_model(model, q, group)
    else:
        model = load_official("gpt", path, quantize=q, quantize_group=group, **config)
    secs = time.perf_counter() - t0
    return {"peak_mb": peak_mb(), "base_mb": base, "load_s": secs, "weight_mb": weight_bytes(model) / 2 ** 20}


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))))
