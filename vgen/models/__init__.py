"""Backbones with official parameter names. ``build(kind, **config)``, ``load_official(kind, src, **config)``.

Each model and tokenizer kind registers itself where it is defined (``register_kind`` at the bottom of its module:
how to build it, how to read its config from tensor shapes, how to recognise its state dict); importing this
package imports them all.
"""
from vgen.models.loading import (GPT_PRESETS, VQ_PRESETS, build, detect_kind, list_kinds, load_official,
                                 read_checkpoint, register_kind)
from vgen.models.gpt import GPT, GPTConfig  # noqa: E402  (each module registers its kind)
from vgen.models.car import CAR, CARConfig  # noqa: E402
from vgen.models.mar import MAR, MARConfig  # noqa: E402
from vgen.models.nar import NAR, NARConfig  # noqa: E402
from vgen.models.nar_video import NARVideo, NARVideoConfig  # noqa: E402
from vgen.models.video_gpt import VideoGPT, VideoGPTConfig  # noqa: E402
from vgen.models.var import VAR, VARConfig  # noqa: E402
from vgen.tokenizers.kl import KLConfig, KLTokenizer  # noqa: E402
from vgen.tokenizers.msvq import MSVQConfig, MultiScaleVQVAE  # noqa: E402
from vgen.tokenizers.vq import VQConfig, VQModel  # noqa: E402

__all__ = ["GPT", "GPTConfig", "CAR", "CARConfig", "MAR", "MARConfig", "NAR", "NARConfig", "NARVideo", "NARVideoConfig", "VideoGPT", "VideoGPTConfig", "VQModel", "VQConfig", "VAR", "VARConfig", "MultiScaleVQVAE",
           "MSVQConfig", "KLConfig", "KLTokenizer", "build", "load_official", "list_kinds", "read_checkpoint", "detect_kind", "register_kind",
           "GPT_PRESETS", "VQ_PRESETS"]
