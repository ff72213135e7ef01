"""Backbones with official parameter names. ``build(kind, **config)``, ``load_official(kind, src, **config)``.

Each model kind registers itself where it is defined (``register_kind`` at the bottom of its module: how to build it,
how to read its config from tensor shapes, how to recognise its state dict); importing this package imports them
all. Tokenizer kinds register in :mod:`vgen.tokenizers`; :mod:`vgen.kinds` imports both families, so it knows every
kind, and the first kind lookup (``build``, ``load_official``, ``list_kinds``) imports every package declared under
the ``vgen.kinds`` entry points (both of vgen's, a plugin's), so ``build("vq")`` works from here too.
"""
from vgen.models.car import CAR, CARConfig  # noqa: E402
from vgen.models.gpt import GPT, GPTConfig  # noqa: E402  (each module registers its kind)
from vgen.models.hf import from_transformers  # noqa: E402  (transformers' image generators, imported on use)
from vgen.models.loading import (
                                 GPT_PRESETS,
                                 VQ_PRESETS,
                                 build,
                                 detect_kind,
                                 list_kinds,
                                 load_official,
                                 read_checkpoint,
                                 register_kind,
)
from vgen.models.mar import MAR, MARConfig  # noqa: E402
from vgen.models.nar import NAR, NARConfig  # noqa: E402
from vgen.models.nar_video import NARVideo, NARVideoConfig  # noqa: E402
from vgen.models.var import VAR, VARConfig  # noqa: E402
from vgen.models.video_gpt import VideoGPT, VideoGPTConfig  # noqa: E402

__all__ = ["GPT", "GPTConfig", "CAR", "CARConfig", "MAR", "MARConfig", "NAR", "NARConfig", "NARVideo", "NARVideoConfig", "VideoGPT", "VideoGPTConfig", "VAR", "VARConfig", "build", "load_official", "from_transformers", "list_kinds", "read_checkpoint", "detect_kind", "register_kind",
           "GPT_PRESETS", "VQ_PRESETS"]
