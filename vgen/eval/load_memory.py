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

Janus-Pro's language-model shapes (``janus-pro-1b``, ``janus-pro-7b``: :data:`vgen.models.hf.shapes.RELEASED`,
random weights) are saved as the release is (``save_pretrained``, bfloat16 safetensors) and loaded through
``vgen.load_pipeline`` in bfloat16 (``bfloat16``), then quantized (``int8-after`` / ``int4-after``), or quantized
while transformers loads it (``int8`` / ``int4``: :mod:`vgen.models.hf.quantizer`).

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
HF_SHAPES = ("janus-pro-1b", "janus-pro-7b")  # transformers releases: loaded by from_pretrained, stored bfloat16


def check(cfg) -> list[str]:
    """The shapes whose loads this run measures (``load_shapes``), with the formats and modes checked."""
    from vgen.eval.shapes import SHAPES
    from vgen.kernels.quant import check_mode
    names = [str(s) for s in (cfg.get("load_shapes") or [])]
    unknown = [s for s in names if s not in SHAPES and s not in HF_SHAPES]
    if unknown:
        raise VGenError(f"unknown load_shapes {unknown}: choose from {', '.join([*SHAPES, *HF_SHAPES])}")
    bad = [f for f in cfg.get("load_formats") or [] if f not in FORMATS]
    if bad:
        raise VGenError(f"unknown load_formats {bad}: choose from {', '.join(FORMATS)}")
    for q in cfg.get("load_quantize") or []:
        check_mode(str(q), cfg.get("quantize_group", 32))
    return names


def modes(quantize: list[str], name: str = "") -> list[str]:
    floats = ["bfloat16"] if name in HF_SHAPES else ["float32-whole", "float32"]
    return floats + [f"{q}-after" for q in quantize] + list(quantize)


def save_hf_shape(name: str, folder: Path) -> Path:
    """A transformers release's language-model shape, random weights, as ``save_pretrained`` writes it (bfloat16
    safetensors, as released), with the begin-of-image id its loader reads."""
    import torch

    from vgen.models.hf import shapes
    model = shapes.janus(**shapes.RELEASED[name], std=0.02).to(torch.bfloat16)
    path = folder / name
    model.save_pretrained(path)
    return path


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
    """Every shape x format x mode; the checkpoints are written to a temporary folder and removed after (a
    transformers release is saved in its one format, safetensors)."""
    names = check(cfg)
    quantize = [str(q) for q in (cfg.get("load_quantize") or [])]
    group = int(cfg.get("quantize_group", 32))
    result: dict = {"modes": modes(quantize), "shapes": {}}
    for name in names:
        hf = name in HF_SHAPES
        if hf:
            result.setdefault("hf_modes", modes(quantize, name))
        for fmt in ["safetensors"] if hf else cfg.get("load_formats") or ["pt"]:
            with tempfile.TemporaryDirectory(prefix="vgen-load-") as tmp:
                path = save_hf_shape(name, Path(tmp)) if hf else save_shape(name, Path(tmp), fmt)
                files = path.glob("*.safetensors") if hf else [path]
                cells = result["shapes"].setdefault(name, {}).setdefault(fmt, {})
                cells["file_mb"] = sum(f.stat().st_size for f in files) / 2 ** 20
                for mode in result["hf_modes"] if hf else result["modes"]:
                    cells[mode] = measure(path, name, mode, group)
    return result


def markdown(result: dict) -> str:
    """One row per shape, format and mode: the process's peak, what it held before loading, what the load added
    (and that against the first, float load: float32 whole, or a transformers release in bfloat16), seconds, the
    loaded weights' bytes, and what they hold resident once read (:func:`resident`)."""
    cells = [c for by in result["shapes"].values() for fmt in by.values() for c in fmt.values() if isinstance(c, dict)]
    read = any("resident_mb" in c for c in cells)  # recorded since the transformers loads were measured
    lines = ["| shape | file | load | peak RSS MB | before loading MB | added MB | x the float load | load s | weight MB |"
             + (" resident once read MB |" if read else ""), "|---|---|---|---|---|---|---|---|---|" + "---|" * read]
    for name, by in result["shapes"].items():
        names = result.get("hf_modes", []) if name in HF_SHAPES else result["modes"]
        for fmt, cells in by.items():
            ref = max(cost(cells[names[0]]), 1e-9)  # float32 whole (vgen's checkpoints), bfloat16 (transformers')
            for mode in names:
                c = cells[mode]
                added = cost(c)
                lines.append(f"| {name} | {fmt} ({cells['file_mb']:.0f} MB) | {mode} | {c['peak_mb']:.0f} | "
                             f"{c['base_mb']:.0f} | {added:.0f} | {added / ref:.2f} | {c['load_s']:.1f} | "
                             f"{c['weight_mb']:.0f} |" + (f" {held(c)} |" if read else ""))
    return "\n".join(lines)


def cost(cell: dict) -> float:
    """MB a load costs the process: its peak, or what the weights hold once read when that is more (a transformers
    release in bfloat16 stays in its memory-mapped file until sampling reads it), over what it held before."""
    return max(cell["peak_mb"], cell.get("resident_mb") or 0) - cell["base_mb"]


def held(cell: dict) -> str:
    """MB the loaded weights hold once every page is read, over what the process held before loading ("-": a cell
    measured before this was recorded)."""
    r = cell.get("resident_mb")
    return "-" if r is None else f"{r - cell['base_mb']:.0f}"


def _child(path: str, name: str, mode: str, group: int) -> dict:
    import resource
    import time

    # torch._dynamo: torch imports it at a model's build (nn.init.normal_ on the meta device goes through
    # torch._refs), about 150 MB; imported before the count, as every other import, so a load adds only its weights
    import torch
    import torch._dynamo  # noqa: F401

    from vgen.eval.shapes import SHAPES, TOKENS
    from vgen.kernels.quant import quantize_model, weight_bytes
    from vgen.models.loading import load_official

    torch.set_num_threads(max(1, torch.get_num_threads()))
    hf = Path(path).is_dir()  # a save_pretrained folder (a transformers release), else a vgen checkpoint file
    if hf:  # transformers and the loader imported before the count starts, as vgen's are
        import transformers

        import vgen.hf_pipeline  # noqa: F401
        from vgen.models.hf import families
        families()  # every family module, the quantizer's too
        transformers.JanusForConditionalGeneration  # noqa: B018 - the lazy module imported here
    try:  # the peak from here on: the high-water mark reset to what the process holds now (Linux)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base, peak_mb = _status("VmRSS"), lambda: _status("VmHWM")
    except OSError:  # elsewhere: the process's peak so far, imports included
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scale = 2 ** 20 if sys.platform == "darwin" else 2 ** 10  # bytes on macOS, kilobytes on Linux
        base, peak_mb = r / scale, lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
    t0 = time.perf_counter()
    q = mode.removesuffix("-after")
    if hf:
        from vgen.pipeline import load_pipeline
        pipe = load_pipeline(path, dtype=torch.bfloat16, quantize=mode if mode in ("int8", "int4") else None)
        if q != mode:
            pipe.quantize(q, group)
        secs = time.perf_counter() - t0
        return {"peak_mb": peak_mb(), "base_mb": base, "load_s": secs, "weight_mb": weight_bytes(pipe.hf) / 2 ** 20,
                "resident_mb": resident(pipe.hf)}
    config = {"n_head": SHAPES[name][2], "block_size": TOKENS}
    if mode.startswith("float32"):
        model = load_official("gpt", path, stream=mode == "float32", **config)
    elif mode.endswith("-after"):
        model = load_official("gpt", path, **config)
        quantize_model(model, q, group)
    else:
        model = load_official("gpt", path, quantize=q, quantize_group=group, **config)
    secs = time.perf_counter() - t0
    return {"peak_mb": peak_mb(), "base_mb": base, "load_s": secs, "weight_mb": weight_bytes(model) / 2 ** 20,
            "resident_mb": resident(model)}


def resident(model) -> float | None:
    """The process's resident MB once every page of the model's weights has been read, as sampling reads them (a
    weight left in a memory-mapped file by the load, as transformers leaves a safetensors file it need not convert,
    counts from here)."""
    import torch
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.numel() and t.device.type == "cpu":
                t.reshape(-1)[::256].sum()  # one element per page at least (4 KiB; int8's 256 elements = 256 B)
    return _status("VmRSS")


def _status(field: str) -> float | None:
    """A memory field of ``/proc/self/status`` in MB (Linux; None elsewhere)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2 ** 10
    except OSError:
        return None
    return None


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))))
