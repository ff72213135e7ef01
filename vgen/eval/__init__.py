"""Evaluation: FID / KID / IS (torch-fidelity, clean-fid), feature extractors, ADM .npz export, bench."""
from vgen.eval.metrics import BACKENDS, REFERENCES, export_npz, fid, load_images

__all__ = ["fid", "export_npz", "load_images", "BACKENDS", "REFERENCES"]
