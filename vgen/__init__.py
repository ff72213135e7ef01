"""vgen: fast sampling for visual autoregressive image generators."""
__version__ = "0.1.0"

from vgen.errors import VGenError  # noqa: E402
from vgen.pipeline import Generation, Pipeline, list_models, load_pipeline  # noqa: E402
from vgen.samplers import get_sampler, list_samplers, sample  # noqa: E402

__all__ = ["VGenError", "Generation", "Pipeline", "list_models", "load_pipeline", "get_sampler", "list_samplers",
           "sample", "__version__"]
