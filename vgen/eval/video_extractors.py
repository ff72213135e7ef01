"""Feature extractors for FVD.

``i3d``: the StyleGAN-V / cd-fvd protocol. cd-fvd's ``InceptionI3d(400)`` (the Kinetics-400 I3D that TATS and
StyleGAN-V use), its ``preprocess_i3d`` (bilinear resize to 224, [-1, 1], (B, C, T, H, W)) and the 400 logits as
its ``get_i3d_logits`` returns them. Its weights cannot be downloaded here: they are read from a local file
(``i3d_weights=`` or ``$VGEN_I3D_WEIGHTS``), safetensors or a plain state dict loaded with ``weights_only=True``.
The network sees exactly 16 frames (``fit_frames``).

``photo``: FVD-photo. A torchvision ``r3d_18`` (random init, no download; the zoo's keeps its first three residual
stages: 32x32 frames are 4x4 there, and the file stays small) that ``vgen train recipe=video-classifier`` trains on
the embedded clips to tell the 16 photographs and the 4 camera motions apart and frames in order from shuffled ones;
the zoo ships it
(``vgen/zoo/video-classifier``). Its pooled features (256-d with three stages) give FVD-photo.

Both take uint8 clips (N, T, 3, H, W) of any size and length.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from vgen.errors import VGenError
from vgen.eval.extractors import load_state_dict_file

ZOO_VIDEO_CLASSIFIER = (Path(__file__).resolve().parent.parent / "zoo" / "video-classifier"
                        / "classifier.safetensors")
I3D_FILE = "i3d_pretrained_400.pt"
I3D_URL = "https://github.com/songweige/TATS/raw/main/tats/fvd/" + I3D_FILE
I3D_FRAMES = 16
I3D_FEATURES = 400
VIDEO_ARCHS = ("r3d_18", "mc3_18", "r2plus1d_18")  # torchvision video ResNets (512-d pooled feature at 4 stages)


def fit_frames(videos: torch.Tensor, frames: int) -> torch.Tensor:
    """uint8 (N, T, 3, H, W) -> (N, ``frames``, 3, H, W). Shorter clips are stretched by repeating frames
    (nearest neighbour in time: output frame k is input frame ``k * T // frames``; 8 -> 16 shows every frame
    twice), longer clips keep their first ``frames`` frames."""
    t = videos.shape[1]
    if t == frames:
        return videos
    if t > frames:
        return videos[:, :frames]
    return videos[:, [k * t // frames for k in range(frames)]]


def state_digest(module: nn.Module, n: int = 12) -> str:
    """A digest of a module's tensors (for cache keys when a model object, not a file, is given)."""
    h = hashlib.sha1()
    for k, v in sorted(module.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:n]


# ---------------------------------------------------------------- FVD-photo: the video classifier
class VideoClassifier(nn.Module):
    """A torchvision video ResNet (``r3d_18`` by default, random init; its first ``stages`` residual stages, pooled
    features of 64 * 2**(stages-1) dims; ``differences``: the stem also sees frame differences) with heads on its
    pooled features: the photograph (``num_classes``), the camera motion (``num_motions``: still, pan, zoom-in,
    zoom-out) and, with ``order``, whether the frames are in their order or shuffled in time (``order_head``, 2
    logits: ordered, shuffled). ``forward(uint8 or 0..255 float clips (B, T, 3, H, W)) -> (features, class_logits,
    motion_logits)``; clips are fitted to ``frames`` frames (``fit_frames``) and their frames resized
    (antialiased bilinear) to ``image_size`` when they differ."""

    def __init__(self, arch: str = "r3d_18", num_classes: int = 16, num_motions: int = 4, frames: int = 8,
                 image_size: int = 32, stages: int = 4, differences: bool = False, order: bool = False):
        super().__init__()
        import torchvision.models.video as tvv
        if arch not in VIDEO_ARCHS:
            raise VGenError(f"unknown video classifier arch {arch!r}: use one of {', '.join(VIDEO_ARCHS)}")
        if stages not in (2, 3, 4):
            raise VGenError(f"stages must be 2, 3 or 4 (residual stages of the video ResNet kept), got {stages}")
        self.arch, self.num_classes, self.num_motions = arch, num_classes, num_motions
        self.frames, self.image_size, self.stages, self.differences = frames, image_size, stages, differences
        self.net = getattr(tvv, arch)(weights=None)
        if differences:  # the stem also sees each frame minus the one before: motion is then first-order visible
            old = self.net.stem[0]
            self.net.stem[0] = nn.Conv3d(6, old.out_channels, old.kernel_size, old.stride, old.padding, bias=False)
        for k in range(stages + 1, 5):  # later stages dropped: 32x32 frames are 4x4 after stage 3
            setattr(self.net, f"layer{k}", nn.Identity())
        self.num_features = 64 * 2 ** (stages - 1)
        self.net.fc = nn.Identity()
        self.class_head = nn.Linear(self.num_features, num_classes)
        self.motion_head = nn.Linear(self.num_features, num_motions)
        self.order = order
        if order:  # ordered vs shuffled frames: makes the pooled features see the order of time, not only motion
            self.order_head = nn.Linear(self.num_features, 2)

    @property
    def config(self) -> dict:
        return {"arch": self.arch, "num_classes": self.num_classes, "num_motions": self.num_motions,
                "frames": self.frames, "image_size": self.image_size, "stages": self.stages,
                "differences": self.differences, "order": self.order}

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 5 or x.shape[2] != 3:
            raise VGenError(f"expected clips of shape (B, T, 3, H, W), got {tuple(x.shape)}")
        x = fit_frames(x, self.frames)
        b, t = x.shape[:2]
        x = x.flatten(0, 1).to(torch.float32)
        if x.shape[-2:] != (self.image_size, self.image_size):
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", antialias=True,
                              align_corners=False)
        x = x.view(b, t, 3, self.image_size, self.image_size).transpose(1, 2) / 127.5 - 1.0  # (B, C, T, H, W)
        if self.differences:  # [frames, frame - previous frame (zero for the first)]
            d = torch.cat([torch.zeros_like(x[:, :, :1]), x[:, :, 1:] - x[:, :, :-1]], dim=2)
            x = torch.cat([x, d], dim=1)
        return x

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feats = self.net(self.preprocess(x))
        return feats, self.class_head(feats), self.motion_head(feats)


def save_video_classifier(model: VideoClassifier, path: str | os.PathLike, extra: dict | None = None) -> Path:
    """Write a video classifier as the zoo ships it: fp16 tensors, its config in the safetensors metadata."""
    from vgen.io import save_safetensors
    meta = {"config": json.dumps(model.config)}
    meta.update({k: json.dumps(v) for k, v in (extra or {}).items()})
    sd = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    save_safetensors(sd, path, metadata=meta)
    return Path(path)


def video_classifier_path(path: str | os.PathLike | None = None) -> Path:
    """The classifier file (the zoo's by default), or a one-line error saying how to make it."""
    p = Path(path).expanduser() if path is not None else ZOO_VIDEO_CLASSIFIER
    if not p.is_file():
        raise VGenError(f"video classifier weights not found at {p}: train them with `vgen train "
                        "recipe=video-classifier` and pass the classifier.safetensors it writes (video_classifier=...) "
                        f"or copy it to {ZOO_VIDEO_CLASSIFIER}")
    return p


def load_video_classifier(path: str | os.PathLike | None = None, device="cpu") -> VideoClassifier:
    """The zoo's video classifier (or a ``vgen train recipe=video-classifier`` output file)."""
    from vgen.io import read_safetensors
    p = video_classifier_path(path)
    state, meta = read_safetensors(p, "write it with save_video_classifier or `vgen train recipe=video-classifier`")
    if "config" not in meta:
        raise VGenError(f"{p} has no 'config' metadata: is it a vgen video classifier?")
    with torch.device("meta"):  # no random init of millions of parameters only to overwrite them
        model = VideoClassifier(**json.loads(meta["config"]))
    want = model.state_dict()
    if set(state) != set(want) or any(state[k].shape != want[k].shape for k in want):
        raise VGenError(f"{p} does not match the video classifier its config describes: write it with "
                        "save_video_classifier or `vgen train recipe=video-classifier`")
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=True,
                          assign=True)
    return model.to(device).eval().requires_grad_(False)


# ---------------------------------------------------------------- I3D (StyleGAN-V protocol, cd-fvd's network)
def i3d_weights_path(path: str | os.PathLike | None = None) -> Path:
    """Resolve the local I3D weights file, or say exactly what to put where."""
    p = path or os.environ.get("VGEN_I3D_WEIGHTS")
    if not p:
        raise VGenError(
            "extractor='i3d' needs the Kinetics-400 I3D weights, which cannot be downloaded here. "
            f"Download {I3D_URL} on a machine with internet, copy it here, and pass "
            f"i3d_weights=/path/to/{I3D_FILE} (or set VGEN_I3D_WEIGHTS). extractor='photo' needs no download.")
    p = Path(p).expanduser()
    if not p.is_file():
        raise VGenError(f"I3D weights file {p} does not exist: place {I3D_FILE} there (from {I3D_URL}) or point "
                        "i3d_weights / VGEN_I3D_WEIGHTS at it")
    return p


def _i3d_module() -> nn.Module:
    from cdfvd.third_party.i3d.pytorch_i3d import InceptionI3d
    return InceptionI3d(I3D_FEATURES, in_channels=3)


def load_i3d(path: str | os.PathLike | None = None, device="cpu") -> nn.Module:
    """cd-fvd's ``InceptionI3d(400)`` with the weights of a local file, in eval mode. A file that is not that
    network's state dict (other keys or shapes) is refused in one line."""
    p = i3d_weights_path(path)
    try:
        sd = load_state_dict_file(p)
    except Exception as e:  # noqa: BLE001  (unreadable, a pickle with code, safetensors header errors)
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise VGenError(f"{p} is not an I3D state dict (could not read it: {first}); download {I3D_FILE} from "
                        f"{I3D_URL}") from None
    with torch.device("meta"):  # shapes only: the file's tensors are assigned below
        net = _i3d_module()
    full = net.state_dict()
    want = {k: v for k, v in full.items() if not k.endswith("num_batches_tracked")}
    got = {k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")}
    missing, unexpected = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    shapes = sorted(k for k in set(want) & set(got) if tuple(got[k].shape) != tuple(want[k].shape))
    if missing or unexpected or shapes:
        example = (missing or unexpected or shapes)[0]
        raise VGenError(f"{p} is not an I3D state dict (cd-fvd's InceptionI3d(400)): {len(missing)} missing keys, "
                        f"{len(unexpected)} unexpected, {len(shapes)} of other shapes (e.g. {example!r}); use "
                        f"{I3D_FILE} from {I3D_URL}")
    state = {k: v.float() for k, v in got.items()}
    # BatchNorm's step counters are unused in eval mode; older files (and TATS's) may lack them
    state.update({k: torch.zeros((), dtype=torch.long) for k in full if k not in want})
    net.load_state_dict(state, strict=True, assign=True)
    return net.to(device).eval().requires_grad_(False)


def random_i3d_weights(path: str | os.PathLike, seed: int = 0) -> Path:
    """Write randomly initialised weights of cd-fvd's ``InceptionI3d(400)`` (offline tests of the whole I3D
    path; the numbers mean nothing), as safetensors."""
    from vgen.io import save_safetensors
    torch.manual_seed(seed)
    net = _i3d_module()
    for mod in net.modules():  # variance-preserving init, so logits vary from clip to clip
        if isinstance(mod, (nn.Conv3d, nn.Linear)):
            nn.init.kaiming_normal_(mod.weight, nonlinearity="relu")
    save_safetensors(net.state_dict(), path)
    return Path(path)


@torch.no_grad()
def i3d_logits(net: nn.Module, videos: torch.Tensor, batch_size: int = 16, device="cpu",
               progress: bool = False) -> np.ndarray:
    """The 400 I3D logits of uint8 clips (N, T, 3, H, W) -> float32 (N, 400), as cd-fvd's ``get_i3d_logits``
    computes them: clips fitted to 16 frames (``fit_frames``), each batch through cd-fvd's ``preprocess_i3d``
    (uint8 (B, T, H, W, C) -> bilinear 224x224, [-1, 1], (B, C, T, H, W)), then the network."""
    from cdfvd.third_party.i3d.utils import preprocess_i3d
    from tqdm.auto import tqdm
    videos = fit_frames(videos, I3D_FRAMES)
    out = []
    for i in tqdm(range(0, len(videos), batch_size), desc="i3d", disable=not progress, leave=False):
        batch = videos[i:i + batch_size].permute(0, 1, 3, 4, 2).contiguous().numpy()  # (B, T, H, W, C), cd-fvd's layout
        out.append(net(preprocess_i3d(batch).to(device)).float().cpu())
    return torch.cat(out).numpy()


@torch.no_grad()
def video_classifier_features(net: VideoClassifier, videos: torch.Tensor, batch_size: int = 16, device="cpu",
                              progress: bool = False) -> np.ndarray:
    """The pooled features of uint8 clips (N, T, 3, H, W) -> float32 (N, net.num_features)."""
    from tqdm.auto import tqdm
    out = []
    for i in tqdm(range(0, len(videos), batch_size), desc="video classifier", disable=not progress, leave=False):
        out.append(net(videos[i:i + batch_size].to(device))[0].float().cpu())
    return torch.cat(out).numpy()
