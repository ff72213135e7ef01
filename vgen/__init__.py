"""vgen: fast sampling for visual autoregressive image generators."""
import os as _os
import signal as _signal
import sys as _sys

_ARGV = getattr(_sys, "orig_argv", [])  # the interpreter's own command line: `python [-u] -m vgen ...`
_MODULE = _ARGV[_ARGV.index("-m") + 1] if "-m" in _ARGV[:-1] else ""
_COMMAND = _os.path.basename(_sys.argv[0] or "") == "vgen" or _MODULE.split(".")[0] == "vgen"
if _COMMAND and not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(_os.environ):
    _os.environ["GOMP_SPINCOUNT"] = "1000"  # idle OpenMP threads spin briefly, then sleep (vgen.threads)
if _os.path.basename(_sys.argv[0] or "") == "vgen" and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    def _starting(signum, frame):  # Ctrl-C while the `vgen` command imports torch & co.: one line, not a traceback
        _sys.stderr.write("\nvgen: interrupted while starting (nothing was written)\n")
        _os._exit(130)
    _signal.signal(_signal.SIGINT, _starting)  # vgen.cli.main puts the default back once it can catch the interrupt

from vgen import hf_pipeline as _hf_pipeline  # noqa: F401,E402  (registers hf://... and the zoo's transformers models)
from vgen.cards import list_models
from vgen.conditions import Labels, Prompts
from vgen.errors import VGenError
from vgen.pipeline import Generation, Pipeline, load_pipeline
from vgen.samplers import fitting_samplers, get_sampler, list_samplers, sample
from vgen.version import __version__

__all__ = ["VGenError", "Generation", "Pipeline", "list_models", "load_pipeline", "get_sampler", "list_samplers",
           "fitting_samplers", "sample", "Labels", "Prompts", "__version__"]
