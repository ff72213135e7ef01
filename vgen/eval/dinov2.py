"""FD-DINOv2: the Fréchet distance on DINOv2 features, as torch-fidelity 0.4 computes them, from a local file.

torch-fidelity's ``dinov2-vit-*-14`` extractors fetch both the model code (``torch.hub.load("facebookresearch/
dinov2", ...)``) and the weights from the internet, and refuse a local weights path. vgen builds the same network
with timm (``vit_*_patch14_dinov2``, installed with vgen) and reads the official ``dinov2_vit*14_pretrain.pth``
(``torch.load(weights_only=True)``) or a safetensors copy. What torch-fidelity's extractor does is kept step by
step: uint8 images, TF1-compatible bilinear resize to 224, ImageNet mean / std scaling, the CLS token after the
final norm. The official model interpolates its 37 x 37 position embedding to the 16 x 16 grid of a 224 input on
every call (bicubic, no antialiasing, scale factor (16 + 0.1) / 37); vgen does that same interpolation once at
load. tests/test_adm.py checks the features against torch-fidelity's own extractor's, recorded from the official
code on seeded weights (tests/fixtures/dinov2_conformance.json).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F

from vgen.errors import VGenError

DINOV2_BASE_URL = "https://dl.fbaipublicfiles.com/dinov2"
# torch-fidelity's name -> (timm architecture, official file, feature size)
MODELS = {
    "dinov2-vit-s-14": ("vit_small_patch14_dinov2", "dinov2_vits14_pretrain.pth", 384),
    "dinov2-vit-b-14": ("vit_base_patch14_dinov2", "dinov2_vitb14_pretrain.pth", 768),
    "dinov2-vit-l-14": ("vit_large_patch14_dinov2", "dinov2_vitl14_pretrain.pth", 1024),
    "dinov2-vit-g-14": ("vit_giant_patch14_dinov2", "dinov2_vitg14_pretrain.pth", 1536),
}
DEFAULT = "dinov2-vit-l-14"  # the FD-DINOv2 of Stein et al. 2023 (and EDM2) uses ViT-L/14
INPUT_SIZE, PATCH, OFFSET = 224, 14, 0.1


def weights_path(path=None, model: str = DEFAULT) -> Path:
    """Resolve the local DINOv2 weights file, or say exactly what to put where."""
    if model not in MODELS:
        raise VGenError(f"unknown DINOv2 model {model!r}: use one of {', '.join(MODELS)}")
    fname = MODELS[model][1]
    url = f"{DINOV2_BASE_URL}/{fname.split('_pretrain')[0]}/{fname}"
    p = path or os.environ.get("VGEN_DINOV2_WEIGHTS")
    if not p:
        raise VGenError(f"FD-DINOv2 needs the DINOv2 weights, which cannot be downloaded here. Download {url} on a "
                        f"machine with internet, copy it here, and pass dinov2_weights=/path/to/{fname} (or set "
                        "VGEN_DINOV2_WEIGHTS)")
    p = Path(p).expanduser()
    if not p.is_file():
        raise VGenError(f"DINOv2 weights file {p} does not exist: place {fname} there (from {url}) or point "
                        "dinov2_weights / VGEN_DINOV2_WEIGHTS at it")
    return p


def _official_pos_embed(pos: torch.Tensor, grid: int) -> torch.Tensor:
    """The official ``interpolate_pos_encoding`` for a square input of ``grid`` x ``grid`` patches."""
    n = pos.shape[1] - 1
    m = int(round(n ** 0.5))
    if m * m != n:
        raise VGenError(f"DINOv2 pos_embed has {n} patch positions, not a square grid")
    if m == grid:
        return pos
    cls, patches = pos[:, :1].float(), pos[:, 1:].float()
    s = (grid + OFFSET) / m
    patches = F.interpolate(patches.reshape(1, m, m, -1).permute(0, 3, 1, 2), scale_factor=(s, s), mode="bicubic",
                            antialias=False)
    if patches.shape[-2:] != (grid, grid):
        raise VGenError(f"DINOv2 pos_embed resampled to {tuple(patches.shape[-2:])}, expected ({grid}, {grid})")
    return torch.cat([cls, patches.permute(0, 2, 3, 1).reshape(1, grid * grid, -1)], dim=1).to(pos.dtype)


def load_dinov2(path=None, model: str = DEFAULT, device="cpu") -> torch.nn.Module:
    """The DINOv2 backbone (timm) with the official weights; ``forward(normalised 224 px) -> CLS features``."""
    import timm

    from vgen.eval.extractors import load_state_dict_file
    p = weights_path(path, model)
    sd = dict(load_state_dict_file(p))
    for k in list(sd):  # the released checkpoints' prefixes, if any
        if k.startswith("module."):
            sd[k[len("module."):]] = sd.pop(k)
    sd.pop("mask_token", None)
    if "register_tokens" in sd:
        raise VGenError(f"{p} is a DINOv2 model with registers; torch-fidelity's FD-DINOv2 uses the plain ones "
                        f"({MODELS[model][1]})")
    sd = {k.replace("mlp.w12.", "mlp.fc1.").replace("mlp.w3.", "mlp.fc2."): v for k, v in sd.items()}
    if "pos_embed" not in sd:
        raise VGenError(f"{p} is not a DINOv2 backbone checkpoint (no pos_embed): pass {MODELS[model][1]}")
    sd["pos_embed"] = _official_pos_embed(sd["pos_embed"], INPUT_SIZE // PATCH)
    net = timm.create_model(MODELS[model][0], pretrained=False, img_size=INPUT_SIZE, num_classes=0)
    try:
        net.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise VGenError(f"{p} does not fit {model} ({first[1].strip() if len(first) > 1 else first[0]}): pass "
                        f"the matching file, e.g. {MODELS[model][1]}") from None
    return net.to(device).eval().requires_grad_(False)


def preprocess(x: torch.Tensor) -> torch.Tensor:
    """torch-fidelity's DINOv2 input: uint8 (B, 3, H, W) -> TF1-style bilinear 224 x 224, ImageNet-normalised."""
    from torch_fidelity.interpolate_compat_tensorflow import interpolate_bilinear_2d_like_tensorflow1x
    if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != 3:
        raise VGenError(f"DINOv2 features take uint8 (B, 3, H, W) images, got {x.dtype} {tuple(x.shape)}")
    x = interpolate_bilinear_2d_like_tensorflow1x(x.float(), size=(INPUT_SIZE, INPUT_SIZE), align_corners=False)
    mean = torch.tensor([0.485, 0.456, 0.406], device=x.device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=x.device).view(1, 3, 1, 1) * 255
    return (x - mean) / std


class DINOv2Features:
    """``__call__(uint8 images) -> (B, D)`` float32 CLS features, as torch-fidelity's ``dinov2-vit-*-14``."""

    def __init__(self, path=None, model: str = DEFAULT, device="cpu"):
        self.model, self.weights = model, weights_path(path, model)
        self.device = torch.device(device)
        self.net = load_dinov2(self.weights, model, self.device)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(preprocess(images.to(self.device))).float()
