from vgen.data.photos import CLASS_NAMES, NUM_CLASSES, Photos, load_photographs, photos, to_model_range, to_uint8
from vgen.data.clips import MOTIONS, Clips, clips  # noqa: E402  (after photos: clips builds on it)

__all__ = ["CLASS_NAMES", "NUM_CLASSES", "MOTIONS", "Clips", "Photos", "clips", "load_photographs", "photos",
           "to_model_range", "to_uint8"]
