"""Feature extractors for FID / KID / IS.

``photo``: a small timm classifier that ``vgen train recipe=photo`` trains on the embedded photo classes and
the zoo ships (``vgen/zoo/photo-classifier``). Its penultimate features give FID-photo / KID-photo, its
logits an IS-style score. It needs no download, so it is the default everywhere in vgen.

``inception``: the standard FID network (torch-fidelity's InceptionV3 port of the 2015-12-05 TensorFlow
graph). Its weights cannot be downloaded here: they are read from a local file (``inception_weights=`` or
``$VGEN_INCEPTION_WEIGHTS``), safetensors or a plain state dict loaded with ``weights_only=True``.

Both accept uint8 (B, 3, H, W) images of any size.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from vgen.errors import VGenError

ZOO_CLASSIFIER = Path(__file__).resolve().parent.parent / "zoo" / "photo-classifier" / "classifier.safetensors"
INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_URL = "https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/" + INCEPTION_FILE
EXTRACTORS = ("photo", "inception")


class PhotoClassifier(nn.Module):
    """A timm classifier over the photo classes. ``forward(uint8 or 0..255 float images) -> (features,
    logits)``; images are resized (antialiased bilinear) to ``image_size`` when they differ."""

    def __init__(self, arch: str = "resnet10t", num_classes: int = 16, image_size: int = 64):
        super().__init__()
        import timm
        self.arch, self.num_classes, self.image_size = arch, num_classes, image_size
        self.net = timm.create_model(arch, pretrained=False, num_classes=num_classes)
        self.num_features = self.net.num_features

    @property
    def config(self) -> dict:
        return {"arch": self.arch, "num_classes": self.num_classes, "image_size": self.image_size}

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != 3:
            raise VGenError(f"expected images of shape (B, 3, H, W), got {tuple(x.shape)}")
        x = x.to(torch.float32)
        if x.shape[-2:] != (self.image_size, self.image_size):
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", antialias=True,
                              align_corners=False)
        return x / 127.5 - 1.0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.net.forward_features(self.preprocess(x))
        feats = self.net.forward_head(h, pre_logits=True)
        return feats, self.net.get_classifier()(feats)


def load_photo_classifier(path: str | os.PathLike | None = None, device="cpu") -> PhotoClassifier:
    """The zoo's photo classifier (or a ``vgen train recipe=photo`` output file)."""
    from safetensors import safe_open
    path = Path(path) if path is not None else ZOO_CLASSIFIER
    if not path.exists():
        raise VGenError(f"photo classifier weights not found at {path}: train them with "
                        "`vgen train recipe=photo` and pass the classifier.safetensors it writes")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}
    if "config" not in meta:
        raise VGenError(f"{path} has no 'config' metadata: is it a vgen photo classifier?")
    model = PhotoClassifier(**json.loads(meta["config"]))
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return model.to(device).eval().requires_grad_(False)


def inception_weights_path(path: str | os.PathLike | None = None) -> Path:
    """Resolve the local Inception weights file, or say exactly what to put where."""
    p = path or os.environ.get("VGEN_INCEPTION_WEIGHTS")
    if not p:
        raise VGenError(
            "extractor='inception' needs the standard Inception weights, which cannot be downloaded here. "
            f"Download {INCEPTION_URL} on a machine with internet, copy it here, and pass "
            f"inception_weights=/path/to/{INCEPTION_FILE} (or set VGEN_INCEPTION_WEIGHTS). "
            "extractor='photo' needs no download.")
    p = Path(p).expanduser()
    if not p.is_file():
        raise VGenError(f"Inception weights file {p} does not exist: place {INCEPTION_FILE} there "
                        f"(from {INCEPTION_URL}) or point inception_weights / VGEN_INCEPTION_WEIGHTS at it")
    return p


def load_state_dict_file(path: Path) -> dict:
    """safetensors, or a plain state dict via ``torch.load(weights_only=True)``."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(path))
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise VGenError(f"could not read {path} as a state dict with weights_only=True ({e})") from e
    if not isinstance(sd, dict) or not all(torch.is_tensor(v) for v in sd.values()):
        raise VGenError(f"{path} is not a plain state dict of tensors")
    return sd


def file_digest(path: str | os.PathLike, n: int = 16) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:n]


# ---------------------------------------------------------------- torch-fidelity feature extractors
_REGISTERED = False


def register_torch_fidelity() -> None:
    """Register ``vgen-photo`` and ``vgen-inception-v3`` with torch-fidelity (once)."""
    global _REGISTERED
    if _REGISTERED:
        return
    import torch_fidelity
    from torch_fidelity.feature_extractor_base import FeatureExtractorBase
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    class VGenPhotoFeatures(FeatureExtractorBase):
        def __init__(self, name, features_list, feature_extractor_weights_path=None, **kwargs):
            super().__init__(name, features_list)
            self.model = load_photo_classifier(feature_extractor_weights_path)

        @staticmethod
        def get_provided_features_list():
            return ("features", "logits_unbiased")

        @staticmethod
        def get_default_feature_layer_for_metric(metric):
            return {"isc": "logits_unbiased", "fid": "features", "kid": "features", "prc": "features"}[metric]

        @staticmethod
        def can_be_compiled():
            return False

        @staticmethod
        def get_dummy_input_for_compile():
            return torch.zeros(1, 3, 64, 64, dtype=torch.uint8)

        def forward(self, x):
            feats, logits = self.model(x)
            out = {"features": feats, "logits_unbiased": logits}
            return tuple(out[k] for k in self.features_list)

    class VGenInception(FeatureExtractorInceptionV3):
        """torch-fidelity's InceptionV3, but the weights are read safely (safetensors or weights_only) from a
        local file; torch-fidelity itself would unpickle the file or download it."""

        def __init__(self, name, features_list, feature_extractor_weights_path=None, **kwargs):
            sd = load_state_dict_file(inception_weights_path(feature_extractor_weights_path))
            buf = io.BytesIO()
            torch.save(sd, buf)  # our own serialisation of plain tensors, handed to the parent's loader
            buf.seek(0)
            super().__init__(name, features_list, feature_extractor_weights_path=buf, **kwargs)

    torch_fidelity.register_feature_extractor("vgen-photo", VGenPhotoFeatures)
    torch_fidelity.register_feature_extractor("vgen-inception-v3", VGenInception)
    _REGISTERED = True


def build_inception(path: str | os.PathLike | None = None, features: tuple = ("2048", "logits_unbiased")):
    register_torch_fidelity()
    from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY
    return FEATURE_EXTRACTORS_REGISTRY["vgen-inception-v3"]("vgen-inception-v3", list(features),
                                                            feature_extractor_weights_path=path)


def inception_pool3_from_float(fx, x: torch.Tensor) -> torch.Tensor:
    """Pool3 (2048-d) features of float images in [0, 255] already resized to 299x299 (clean-fid's "clean"
    preprocessing), through torch-fidelity's InceptionV3 layers in their forward order."""
    x = (x.to(fx.feature_extractor_internal_dtype) - 128) / 128
    for name in ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "MaxPool_1", "Conv2d_3b_1x1",
                 "Conv2d_4a_3x3", "MaxPool_2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b",
                 "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "AvgPool"):
        x = getattr(fx, name)(x)
    return torch.flatten(x, 1).to(torch.float32)


def random_inception_weights(path: str | os.PathLike, seed: int = 0) -> Path:
    """Write randomly initialised weights with the standard Inception shapes (offline tests of the full
    Inception path; the numbers mean nothing)."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    from vgen.io import save_safetensors

    class _RandomInit(FeatureExtractorInceptionV3):
        def load_state_dict(self, state_dict, strict=True, assign=False):
            return None  # keep the fresh initialisation

    buf = io.BytesIO()
    torch.save({}, buf)
    buf.seek(0)
    torch.manual_seed(seed)
    m = _RandomInit("inception-v3-compat", ["2048"], feature_extractor_weights_path=buf)
    for mod in m.modules():  # variance-preserving init, so features vary from image to image
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(mod.weight, nonlinearity="relu")
    sd = m.state_dict()
    save_safetensors(sd, path)
    return Path(path)


def save_photo_classifier(model: PhotoClassifier, path: str | os.PathLike, extra: dict | None = None) -> Path:
    """Write a classifier as the zoo ships it: fp16 tensors, its config in the safetensors metadata."""
    from vgen.io import save_safetensors
    meta = {"config": json.dumps(model.config)}
    meta.update({k: json.dumps(v) for k, v in (extra or {}).items()})
    sd = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    save_safetensors(sd, path, metadata=meta)
    return Path(path)
