"""Every model and tokenizer kind, registered: ``build(kind, **config)`` and ``load_official(kind, src)`` by name.

Each family registers its kind where it is defined (``register_kind`` at the bottom of its module, in
:mod:`vgen.models` and :mod:`vgen.tokenizers`); this module sits above both and imports both, so a kind named in a
pipeline card or a checkpoint is always known here without either package importing the other.
"""
import vgen.models  # noqa: F401  (registers every model kind)
import vgen.tokenizers  # noqa: F401  (registers every tokenizer kind)
from vgen.models.loading import build, detect_kind, list_kinds, load_official, read_checkpoint

__all__ = ["build", "detect_kind", "list_kinds", "load_official", "read_checkpoint"]
