"""The ``vgen`` command: ``vgen <command> [hydra overrides ...]``.

Commands: sample, bench, eval, demo, scalekv, train. Each is a Hydra app over the configs shipped in ``vgen/configs``, so
overrides, ``--cfg job``, multirun (``-m``) and launchers work as in any Hydra program.
"""
from __future__ import annotations

import os
import sys

from vgen.errors import VGenError

COMMANDS = {
    "sample": "draw images from a zoo model or a local pipeline folder (PNGs, grid.png, stats.json)",
    "bench": "time samplers x batch sizes side by side (table, bench.json, plots)",
    "eval": "score samples: `vgen eval fid samples=<dir>` (FID/KID/IS -> metrics.json), "
            "`vgen eval fvd samples=<dir of clips>`, `vgen eval clip samples=<dir> prompts=<file>` (CLIP score), "
            "`vgen eval npz`, `vgen eval suite=adm samples=<dir> "
            "reference=<name | dir | ADM .npz>` (FID, sFID, IS, Precision, Recall, KID), `vgen eval suite=t2i "
            "samples=<dir>` (FID, CLIP score, prompt accuracy)",
    "demo": "start the Gradio app: samplers side by side (server_name, server_port, share)",
    "scalekv": "calibrate ScaleKV layer budgets: `vgen scalekv calibrate model=photos-var budget=0.1`",
    "train": "run a zoo training recipe (recipe=vq|gpt|nar|photo|msvq|var|video-gpt|video-nar|video-classifier|kl|car|car-draft|car-distill|mar|drafter|t2i), resumable",
}


def _usage() -> str:
    from vgen import list_models, list_samplers
    lines = ["usage: vgen <command> [key=value ...]", "", "commands:"]
    lines += [f"  {k:<8} {v}" for k, v in COMMANDS.items()]
    lines += ["", f"models:   {', '.join(list_models()) or '(none)'}", f"samplers: {', '.join(list_samplers())}",
              "", "examples:", "  vgen sample", "  vgen sample sampler.top_k=100 labels=[0,3] num_samples=16 outdir=out",
              "  vgen eval fid samples=samples reference=photos-test",
              "  vgen demo server_port=7860",
              "  vgen sample --cfg job      # show the composed config"]
    return "\n".join(lines)


GENERATED_GROUPS = ("model", "sampler")  # config groups vgen.configs generates (from the zoo, from the registry)


def _group_options(group: str) -> list[str]:
    if group == "sampler":  # generated from the registry (vgen.configs)
        from vgen.samplers import list_samplers
        return list_samplers(include_hidden=True)
    if group == "model":  # generated from the zoo (vgen.configs)
        from vgen.cards import list_models, list_transformers_models
        return sorted(list_models() + list_transformers_models())
    from pathlib import Path
    d = Path(__file__).parent / "configs" / group
    return sorted(p.stem for p in d.glob("*.yaml"))


def _precheck(overrides: list[str], command: str = "sample") -> None:
    """One-line errors for unknown config-group choices, before Hydra composes anything."""
    for o in overrides:
        key, sep, value = o.partition("=")
        if o.startswith("+") and not o.startswith("++") and sep and not _is_group(key[1:]):
            raise VGenError(f"{key}={value} adds a key vgen does not read: every setting already has a key, "
                            f"set it without '+' ({key[1:]}={value} names it; `vgen {command} --cfg job` lists every "
                            "key)")
        key = key.lstrip("+~")
        if sep and key in ("model", "sampler", "recipe"):
            valid = _group_options(key)
            if "(" in value:  # a sweep function (choice(...), glob(...)): Hydra checks it
                continue
            for v in value.split(","):  # a multirun sweep lists several
                if v not in valid:
                    extra = " (or model.path=<folder with pipeline.json>)" if key == "model" else ""
                    raise VGenError(f"unknown {key} {v!r}; available: {', '.join(valid)}{extra}")


def _bench_models(overrides: list[str]) -> list[str]:
    """``vgen bench model=photos-var`` (or ``model.path=<folder>``), as every other command takes a model: the
    bench's ``models`` list of that one model (``model=a,b``: of those)."""
    out, named = [], []
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep and key.lstrip("+~") in ("model", "model.path", "models"):
            named.append(o)
        if sep and key in ("model", "model.path") and "(" not in value:
            o = f"models=[{value}]"
        out.append(o)
    if len(named) > 1:
        raise VGenError(f"{' and '.join(named)} name the models more than once: give model=<name> (or "
                        "model.path=<folder>) for one model, models=[a,b] for several")
    return out


def _is_group(key: str) -> bool:
    """Whether '+' may add ``key``: a config group (``+experiment=...``, ``+hydra/launcher=...``) or one of Hydra's
    own settings (``+hydra.job.env_set.X=1``); every key vgen reads is already in its config."""
    from pathlib import Path
    top = key.split("/")[0].split(".")[0]
    group = "." not in key and (top in GENERATED_GROUPS or (Path(__file__).parent / "configs" / top).is_dir())
    return top == "hydra" or group


def _as_set(override: str) -> str:
    """``++key=value`` (set, or add if missing) on one of vgen's keys -> ``key=value``: Hydra then checks the key
    against vgen's config (an unknown one is the one-line "unknown key" error instead of being added unread)."""
    key = override.partition("=")[0]
    return override[2:] if override.startswith("++") and "=" in override and not _is_group(key[2:]) else override


_TYPES = {"Integer": "a whole number", "Float": "a number", "Boolean": "true or false", "String": "text"}


def _config_error(e: Exception, command: str) -> str | None:
    """One line for an error Hydra or OmegaConf raised while composing the config (a bad override), naming the
    key and what it takes; None for any other exception."""
    import re

    from hydra.errors import HydraException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError
    if not isinstance(e, (HydraException, OmegaConfBaseException)):
        return None
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
    key = getattr(cause, "full_key", None)
    lines = [x.strip() for x in str(cause).splitlines() if x.strip()]
    first = lines[0] if lines else type(e).__name__
    keys = f"`vgen {command} --cfg job` lists every key"
    if isinstance(e, OverrideParseException):
        detail = "; ".join(x for x in lines[:2] if not x.startswith("See "))
        return (f"cannot read the override ({detail}): write key=value, e.g. seed=3, and quote a value with spaces "
                f"or ~ in it, e.g. outdir='my samples' ({keys})")
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and key:
        return f"unknown key {key!r}: {keys}"
    if isinstance(cause, ValidationError) and key:
        m = re.match(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", first)
        if m:
            return f"{key}={m.group(1)}: {key} takes {_TYPES.get(m.group(2), m.group(2))}"
        return f"{key}: {first} ({keys})"
    return f"{first} ({keys})"


def _task(command: str):
    from vgen import commands
    return getattr(commands, command)


def _starting() -> None:
    """The command's start-up settings, made before torch loads (and only then: run in a process that already holds
    torch, such as a test or a notebook, main changes neither): idle OpenMP threads spin briefly, then sleep
    (``GOMP_SPINCOUNT=1000`` unless the user chose ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``; libgomp reads it when
    torch loads; vgen.threads); and for the ``vgen`` script, Ctrl-C while torch & co. load prints one line instead of a
    traceback (main puts the default handler back once it can catch the interrupt)."""
    if "torch" in sys.modules:
        return
    if not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ):
        os.environ["GOMP_SPINCOUNT"] = "1000"
    import signal
    if os.path.basename(sys.argv[0] or "") == "vgen" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        def starting(signum, frame):
            sys.stderr.write("\nvgen: interrupted while starting (nothing was written)\n")
            os._exit(130)
        signal.signal(signal.SIGINT, starting)


def main(argv: list[str] | None = None) -> None:
    _starting()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return
    command, rest = argv[0], argv[1:]
    if command == "eval" and rest and "=" not in rest[0] and not rest[0].startswith("-"):
        rest = [f"metric={rest[0]}"] + rest[1:]  # `vgen eval fid ...` -> metric=fid
    if command == "scalekv" and rest and "=" not in rest[0] and not rest[0].startswith("-"):
        rest = [f"action={rest[0]}"] + rest[1:]  # `vgen scalekv calibrate ...` -> action=calibrate
    if command not in COMMANDS:
        print(f"vgen: error: unknown command {command!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(2)

    rest = [_as_set(o) for o in rest]
    if command == "train":  # `vgen train recipe=drafter model=photos-gpt`: the recipe's target pipeline
        rest = [f"recipe.{o}" if o.startswith("model=") else o for o in rest]
    try:
        _precheck(rest, command)
        if command == "bench":
            rest = _bench_models(rest)
    except VGenError as e:
        print(f"vgen {command}: error: {e}", file=sys.stderr)
        sys.exit(2)

    import hydra
    from omegaconf import DictConfig

    from vgen.configs import register
    register()
    task = _task(command)

    @hydra.main(config_path="pkg://vgen.configs", config_name=command, version_base="1.3")
    def _app(cfg: DictConfig):
        import torch

        from vgen import validate
        from vgen.configs import SCHEMAS
        from vgen.kernels.precision import cuda_tf32
        from vgen.threads import set_threads
        before = torch.get_num_threads()
        try:
            validate.config(cfg, SCHEMAS[command])  # every command's own fields, by its schema's rules, first
            set_threads(cfg.get("threads"))  # this process's share of the cores unless threads= says otherwise
            with cuda_tf32(cfg.get("tf32")):  # CUDA float32 matmuls in TF32 as LlamaGen's scripts (tf32=false: not)
                return task(cfg)
        except VGenError as e:
            print(f"vgen {command}: error: {e}", file=sys.stderr)
            sys.exit(2)
        finally:
            torch.set_num_threads(before)  # run in process (tests, notebooks): the caller's threads are kept

    sys.argv = [f"vgen {command}"] + rest
    import signal
    if getattr(signal.getsignal(signal.SIGINT), "__name__", "") == "starting":  # set by _starting()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here an interrupt is caught below
    full = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors (instead of printing and exiting 1): caught here
    try:
        _app()
    except KeyboardInterrupt:
        hint = (" (finished samples are kept: run the same command again to resume)" if command == "sample" else
                " (run the same command again to resume from the last checkpoint)" if command == "train" else "")
        print(f"\nvgen {command}: interrupted{hint}", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        msg = _config_error(e, command)
        if msg is None or full:  # not a configuration error, or the user asked for Hydra's full report
            raise
        print(f"vgen {command}: error: {msg}", file=sys.stderr)
        sys.exit(2)
    finally:
        if full is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full


if __name__ == "__main__":
    main()
