from vgen.data.captions import (  # noqa: E402
                              CROP_SETS,
                              HELDOUT_COMBOS,
                              HELDOUT_TEMPLATES,
                              SUBJECT_PHRASES,
                              TEMPLATES,
                              CaptionedPhotos,
                              CropFacts,
                              apply_treatment,
                              caption,
                              caption_corpus,
                              captioned_photos,
                              crop_facts,
                              crops,
                              describe,
                              draw_treatment,
                              measure_brightness,
                              measure_colour,
                              prompt_set,
                              train_text_tokenizer,
)
from vgen.data.clips import MOTIONS, Clips, clips  # noqa: E402  (after photos: clips builds on it)
from vgen.data.photos import (
                              CLASS_NAMES,
                              NUM_CLASSES,
                              CropBox,
                              Photos,
                              load_photographs,
                              photos,
                              photos_with_boxes,
                              to_model_range,
                              to_uint8,
)

__all__ = ["CLASS_NAMES", "NUM_CLASSES", "MOTIONS", "Clips", "CropBox", "Photos", "clips", "load_photographs",
           "photos", "photos_with_boxes", "to_model_range", "to_uint8",
           "HELDOUT_COMBOS", "HELDOUT_TEMPLATES", "SUBJECT_PHRASES", "TEMPLATES", "CaptionedPhotos", "CropFacts",
           "apply_treatment", "caption", "caption_corpus", "captioned_photos", "crop_facts", "crops", "CROP_SETS", "describe",
           "draw_treatment", "measure_brightness", "measure_colour", "prompt_set", "train_text_tokenizer"]
