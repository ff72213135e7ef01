"""Evaluation: FID / KID / IS (torch-fidelity, clean-fid), the ADM suite (FID, sFID, IS, Precision, Recall, KID),
FVD (I3D, FVD-photo), CLIP score, the text-to-image suite (FID + CLIP score + prompt accuracy), feature extractors, ADM .npz export, bench."""
from vgen.eval.adm import evaluate, features, reference_stats
from vgen.eval.clip import clip_score
from vgen.eval.fvd import REFERENCES as VIDEO_REFERENCES
from vgen.eval.fvd import fvd, load_videos
from vgen.eval.metrics import BACKENDS, export_npz, fid
from vgen.eval.sources import REFERENCES, load_images
from vgen.eval.t2i import evaluate as evaluate_t2i
from vgen.eval.t2i import prompt_accuracy

__all__ = ["fid", "fvd", "clip_score", "evaluate", "evaluate_t2i", "prompt_accuracy", "features", "reference_stats", "export_npz", "load_images",
           "load_videos", "BACKENDS", "REFERENCES", "VIDEO_REFERENCES"]
