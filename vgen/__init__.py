"""vgen: fast sampling for visual autoregressive image generators."""
from vgen.errors import VGenError
from vgen.cards import list_models
from vgen.conditions import Labels, Prompts
from vgen.pipeline import Generation, Pipeline, load_pipeline
from vgen.samplers import fitting_samplers, get_sampler, list_samplers, sample
from vgen.version import __version__

__all__ = ["VGenError", "Generation", "Pipeline", "list_models", "load_pipeline", "get_sampler", "list_samplers",
           "fitting_samplers", "sample", "Labels", "Prompts", "__version__"]
