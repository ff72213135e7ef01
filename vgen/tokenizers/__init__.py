"""Tokenizers with official parameter names: pixels <-> the tokens a model generates. Each module registers its
kind where it is defined; :mod:`vgen.kinds` loads any of them by name."""
from vgen.tokenizers.kl import KLConfig, KLTokenizer
from vgen.tokenizers.msvq import MSVQConfig, MultiScaleVQVAE
from vgen.tokenizers.vq import VQConfig, VQModel

__all__ = ["KLConfig", "KLTokenizer", "MSVQConfig", "MultiScaleVQVAE", "VQConfig", "VQModel"]
