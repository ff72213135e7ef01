"""vgen: fast sampling for visual autoregressive image generators.

Importing the package loads nothing heavy and changes nothing: the public names below load on first use (PEP 562),
and the ``vgen`` command's start-up settings (OpenMP's spin bound, a quiet Ctrl-C while torch loads) are made by
:func:`vgen.cli.main` when it runs as the command."""
from importlib import import_module as _import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for readers and type checkers (and the API pages); at run time __getattr__ below loads them
    from vgen.cards import list_models
    from vgen.conditions import Labels, Prompts
    from vgen.errors import VGenError
    from vgen.pipeline import Generation, Pipeline, load_pipeline
    from vgen.samplers import fitting_samplers, get_sampler, list_samplers, sample
    from vgen.version import __version__

_PUBLIC = {"VGenError": "vgen.errors", "Generation": "vgen.pipeline", "Pipeline": "vgen.pipeline",
           "load_pipeline": "vgen.pipeline", "list_models": "vgen.cards", "Labels": "vgen.conditions",
           "Prompts": "vgen.conditions", "get_sampler": "vgen.samplers", "list_samplers": "vgen.samplers",
           "fitting_samplers": "vgen.samplers", "sample": "vgen.samplers", "__version__": "vgen.version"}
__all__ = ["VGenError", "Generation", "Pipeline", "load_pipeline", "list_models", "Labels", "Prompts", "get_sampler",
           "list_samplers", "fitting_samplers", "sample", "__version__"]


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'vgen' has no attribute {name!r}")
    value = getattr(_import_module(_PUBLIC[name]), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
