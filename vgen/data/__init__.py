from vgen.data.photos import CLASS_NAMES, NUM_CLASSES, Photos, load_photographs, photos, to_model_range, to_uint8

__all__ = ["CLASS_NAMES", "NUM_CLASSES", "Photos", "load_photographs", "photos", "to_model_range", "to_uint8"]
