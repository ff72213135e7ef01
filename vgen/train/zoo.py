"""Turn finished recipe runs into a zoo pipeline folder (``vgen/zoo/<name>/``) with its card numbers.

    python -m vgen.train.zoo --vq runs/photos-vq/vq.safetensors --gpt runs/photos-gpt/gpt.safetensors \
        --name photos-gpt --out vgen/zoo/photos-gpt
    python -m vgen.train.zoo --vq runs/photos-vq/vq.safetensors --nar runs/photos-nar/nar.safetensors \
        --name photos-nar --out vgen/zoo/photos-nar --compare-to photos-gpt
    python -m vgen.train.zoo --msvq runs/photos-msvq/msvq.safetensors --var runs/photos-var/var.safetensors \
        --name photos-var --out vgen/zoo/photos-var
    python -m vgen.train.zoo --vq vgen/zoo/photos-gpt/vq.safetensors \
        --video-gpt runs/photos-video-gpt/video-gpt.safetensors --name photos-video-gpt --out vgen/zoo/photos-video-gpt
    python -m vgen.train.zoo --vq vgen/zoo/photos-gpt/vq.safetensors \
        --video-nar runs/photos-video-nar/nar-video.safetensors --name photos-video-nar \
        --out vgen/zoo/photos-video-nar --compare-to photos-video-gpt
    python -m vgen.train.zoo --kl runs/photos-kl/kl.safetensors --car runs/photos-car/car.safetensors \
        --name photos-car --out vgen/zoo/photos-car --draft photos-car-draft
    python -m vgen.train.zoo --kl runs/photos-kl/kl.safetensors --car runs/photos-car-draft/car.safetensors \
        --name photos-car-draft --out vgen/zoo/photos-car-draft
    python -m vgen.train.zoo --kl runs/photos-kl/kl.safetensors --mar runs/photos-mar/mar.safetensors \
        --name photos-mar --out vgen/zoo/photos-mar

The GPT / NAR / VAR weights are stored as fp16 (half the bytes; loaded back as fp32); the export measures the test
loss both ways so the card shows what the rounding costs.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from vgen.data import CLASS_NAMES, NUM_CLASSES
from vgen.io import atomic_write_json, make_grid, save_png, save_safetensors

# init: the speculative drafts that accepted most (docs/lab/benchmarks-log.md); the window is the samplers' own
# default (auto: cost-aware). Samplers ignore the keys they do not take.
DEFAULT_SAMPLING = {"cfg_scale": 3.0, "top_k": 100, "temperature": 1.0, "init": "vertical"}


NAR_SAMPLING = {"cfg_scale": 3.0, "top_k": 100, "temperature": 1.0}  # photos-gpt's, for a like-for-like comparison


def store_fp16(model, kind: str, out: Path):
    """Write ``<out>/<kind>.safetensors`` with fp16 tensors (config in the metadata) and load it back (as fp32),
    so the card can say what the rounding costs."""
    from vgen.kinds import load_official
    half = {k: (v.half() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    save_safetensors(half, out / f"{kind}.safetensors", metadata={"config": json.dumps(model.config_dict())})
    return load_official(kind, out / f"{kind}.safetensors")


def export(vq_path: str, gpt_path: str, out: str, name: str, sampling: dict | None = None,
           n_test: int = 512, grid_seed: int = 0, grid: str | None = None, kind: str = "gpt",
           compare_to: str | None = None) -> dict:
    """A token-grid zoo pipeline: VQ tokenizer (fp32) + GPT or NAR (``kind``; stored fp16, test loss measured
    both ways). ``compare_to`` names the zoo model a benchmark takes the AR baseline from (photos-nar:
    photos-gpt, same tokenizer, data and training budget)."""
    from vgen.kinds import load_official
    from vgen.pipeline import Pipeline
    from vgen.train.common import encode_split
    from vgen.train.gpt import test_loss
    from vgen.train.vq import evaluate

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vq = load_official("vq", vq_path)
    gpt = load_official(kind, gpt_path)
    vq_metrics = evaluate(vq, 512)
    codes, labels = encode_split(vq, "test", n_test, seed=1)
    loss32 = test_loss(gpt, codes, labels)
    save_safetensors(vq.state_dict(), out / "vq.safetensors", metadata={"config": json.dumps(vq.config_dict())})
    loss16 = test_loss(store_fp16(gpt, kind, out), codes, labels)
    card = {"model_kind": kind, "model": f"{kind}.safetensors", "tokenizer_kind": "vq", "tokenizer": "vq.safetensors",
            "generation": str(gpt.order), "token_shape": list(gpt.token_shape), "name": name,
            "num_classes": NUM_CLASSES, "vocab_size": gpt.vocab_size,
            "class_names": list(CLASS_NAMES), "image_size": 64,
            "sampling": sampling or (NAR_SAMPLING if kind == "nar" else DEFAULT_SAMPLING),
            "metrics": {"tokenizer_test_psnr": vq_metrics["test_psnr"],
                        "tokenizer_codebook_usage": vq_metrics["codebook_usage"],
                        f"{kind}_test_loss_fp32": loss32, f"{kind}_test_loss_stored_fp16": loss16,
                        f"{kind}_params": sum(p.numel() for p in gpt.parameters()),
                        "vq_params": sum(p.numel() for p in vq.parameters())}}
    if compare_to:
        card["compare_to"] = compare_to
    atomic_write_json(out / "pipeline.json", card)
    # card grid: two samples per class with the recommended settings, classes in rows
    pipe = Pipeline.from_pretrained(str(out))
    labels = [c for c in range(NUM_CLASSES) for _ in range(4)]  # 4 per class: two classes per grid row
    gen = pipe.generate(labels, seed=grid_seed, batch_size=16)
    save_png(grid or f"docs/{name}-grid.png", make_grid(gen.images, nrow=8))
    return card


VAR_SAMPLING = {"cfg_scale": 2.5, "top_k": 100, "temperature": 1.0, "kv_calibration": "scalekv.json"}


def export_var(msvq_path: str, var_path: str, out: str, name: str, sampling: dict | None = None,
               n_test: int = 512, grid_seed: int = 0, grid: str | None = None) -> dict:
    """A next-scale zoo pipeline: multi-scale VQVAE (fp32) + VAR (stored fp16, test loss measured both ways)."""
    from vgen.kinds import load_official
    from vgen.pipeline import Pipeline
    from vgen.train.common import encode_split
    from vgen.train.var import test_loss
    from vgen.train.vq import evaluate

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vae = load_official("msvq", msvq_path)
    var = load_official("var", var_path)
    vq_metrics = evaluate(vae, 512)
    codes, labels = encode_split(vae, "test", n_test, seed=1)
    loss32 = test_loss(var, vae, codes, labels)
    save_safetensors(vae.state_dict(), out / "msvq.safetensors", metadata={"config": json.dumps(vae.config_dict())})
    loss16 = test_loss(store_fp16(var, "var", out), vae, codes, labels)
    card = {"model_kind": "var", "model": "var.safetensors", "tokenizer_kind": "msvq", "tokenizer": "msvq.safetensors",
            "generation": str(var.order), "token_shape": list(var.token_shape), "name": name,
            "num_classes": NUM_CLASSES, "vocab_size": var.vocab_size,
            "class_names": list(CLASS_NAMES), "image_size": 64, "patch_nums": var.patch_nums,
            "sampling": sampling or VAR_SAMPLING,
            "metrics": {"tokenizer_test_psnr": vq_metrics["test_psnr"],
                        "tokenizer_codebook_usage": vq_metrics["codebook_usage"],
                        "var_test_loss_fp32": loss32["test_loss"], "var_test_loss_stored_fp16": loss16["test_loss"],
                        "var_test_loss_per_scale": loss32["test_loss_per_scale"],
                        "var_params": sum(p.numel() for p in var.parameters()),
                        "msvq_params": sum(p.numel() for p in vae.parameters())}}
    if "kv_calibration" in card["sampling"] and not (out / card["sampling"]["kv_calibration"]).exists():
        card["sampling"] = {k: v for k, v in card["sampling"].items() if k != "kv_calibration"}  # calibrate later
    atomic_write_json(out / "pipeline.json", card)
    pipe = Pipeline.from_pretrained(str(out))
    labels = [c for c in range(NUM_CLASSES) for _ in range(4)]
    gen = pipe.generate(labels, sampler="var", seed=grid_seed, batch_size=16)
    save_png(grid or f"docs/{name}-grid.png", make_grid(gen.images, nrow=8))
    return card


VIDEO_SAMPLING = {"cfg_scale": 3.0, "top_k": 100, "temperature": 1.0, "max_window": 16, "init": "temporal"}


def export_video(vq_path: str, model_path: str, out: str, name: str, kind: str = "video-gpt",
                 sampling: dict | None = None, n_test: int = 256, seed: int = 0,
                 compare_to: str | None = None, docs: str = "docs") -> dict:
    """A video zoo pipeline: the photos VQ tokenizer (frame by frame, fp32) + a video GPT or video NAR (``kind``;
    stored fp16, test loss on held-out clips measured both ways). Writes the card and, for the docs, a strip of
    frames per class (``docs/<name>-strip.png``) and a GIF of the first clips (``docs/<name>.gif``)."""
    from vgen.io import save_gif
    from vgen.kinds import load_official
    from vgen.pipeline import Pipeline
    from vgen.train.gpt import test_loss
    from vgen.train.video import encode_clips
    from vgen.train.vq import evaluate

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vq = load_official("vq", vq_path)
    model = load_official(kind, model_path)
    t, h, w = model.token_shape
    frame = 32  # clips("...", size=32): 8x8 codes per frame with the photos VQ (downsampling 4)
    codes, labels = encode_clips(vq, "test", n_test, seed=1, frames=t, size=frame)
    loss32 = test_loss(model, codes, labels)
    save_safetensors(vq.state_dict(), out / "vq.safetensors", metadata={"config": json.dumps(vq.config_dict())})
    loss16 = test_loss(store_fp16(model, kind, out), codes, labels)
    vq_metrics = evaluate(vq, 512)
    key = kind.replace("-", "_")
    card = {"model_kind": kind, "model": f"{kind}.safetensors", "tokenizer_kind": "vq", "tokenizer": "vq.safetensors",
            "generation": str(model.order), "token_shape": [t, h, w], "name": name,
            "num_classes": NUM_CLASSES, "vocab_size": model.vocab_size, "class_names": list(CLASS_NAMES),
            "image_size": frame, "frames": t, "fps": 8,
            "sampling": sampling or (NAR_SAMPLING if kind == "nar-video" else VIDEO_SAMPLING),
            "metrics": {"tokenizer_test_psnr_64px": vq_metrics["test_psnr"],
                        f"{key}_test_loss_fp32": loss32, f"{key}_test_loss_stored_fp16": loss16,
                        f"{key}_params": sum(p.numel() for p in model.parameters()),
                        "vq_params": sum(p.numel() for p in vq.parameters())}}
    if compare_to:
        card["compare_to"] = compare_to
    atomic_write_json(out / "pipeline.json", card)
    pipe = Pipeline.from_pretrained(str(out))
    gen = pipe.generate(list(range(NUM_CLASSES)), seed=seed, batch_size=8)
    strips = torch.stack([make_grid(v, nrow=t, pad=1) for v in gen.videos])
    save_png(Path(docs) / f"{name}-strip.png", make_grid(strips, nrow=1, pad=1))
    grid_video = torch.stack([make_grid(gen.videos[:8, i], nrow=8, pad=1) for i in range(t)])
    save_gif(Path(docs) / f"{name}.gif", grid_video, fps=card["fps"])
    return card


CONTINUOUS_SAMPLING = {"cfg_scale": 3.0, "cfg_schedule": "linear", "temperature": 1.0, "clip_x0": 4.0,
                       "num_iter": 64}


def export_continuous(kl_path: str, model_path: str, out: str, name: str, kind: str = "car",
                      sampling: dict | None = None, n_test: int = 256, grid_seed: int = 0, grid: str | None = None,
                      draft: str | None = None, compare_to: str | None = None) -> dict:
    """A continuous-token zoo pipeline: the KL tokenizer (fp32) + a CAR or MAR (``kind``; stored fp16, held-out
    diffusion loss measured both ways). ``draft``: the zoo model ``cspd`` takes as its draft by default."""
    from vgen.kinds import load_official
    from vgen.pipeline import Pipeline
    from vgen.train.continuous import encode_latents, test_loss
    from vgen.train.kl import evaluate

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kl = load_official("kl", kl_path).eval()
    model = load_official(kind, model_path).eval()
    test = encode_latents(kl, "test", n_test, seed=1)
    loss32 = test_loss(model, test)
    save_safetensors(kl.state_dict(), out / "kl.safetensors", metadata={"config": json.dumps(kl.config_dict())})
    loss16 = test_loss(store_fp16(model, kind, out), test)
    kl_metrics = evaluate(kl, 512)
    card = {"model_kind": kind, "model": f"{kind}.safetensors", "tokenizer_kind": "kl", "tokenizer": "kl.safetensors",
            "generation": str(model.order), "token_shape": list(model.token_shape), "name": name,
            "num_classes": NUM_CLASSES, "token_kind": "latents", "latent_channels": model.token_channels,
            "class_names": list(CLASS_NAMES), "image_size": model.token_shape[-1] * kl.downsample,
            "sampling": sampling or CONTINUOUS_SAMPLING,
            "metrics": {"tokenizer_test_psnr": kl_metrics["test_psnr"],
                        "tokenizer_posterior_std": float(test["std"].float().mean()),
                        f"{kind}_test_loss_fp32": loss32, f"{kind}_test_loss_stored_fp16": loss16,
                        f"{kind}_params": sum(p.numel() for p in model.parameters()),
                        f"{kind}_head_params": sum(p.numel() for p in model.diffloss.parameters()),
                        "kl_params": sum(p.numel() for p in kl.parameters())}}
    if draft:
        card["draft"] = draft
    if compare_to:
        card["compare_to"] = compare_to
    atomic_write_json(out / "pipeline.json", card)
    pipe = Pipeline.from_pretrained(str(out))
    labels = [c for c in range(NUM_CLASSES) for _ in range(2)]  # 2 per class: a 100-step head is slow on a CPU
    gen = pipe.generate(labels, seed=grid_seed, batch_size=16)
    save_png(grid or f"docs/{name}-grid.png", make_grid(gen.images, nrow=8))
    return card


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vq", help="LlamaGen VQ tokenizer (with --gpt)")
    ap.add_argument("--gpt")
    ap.add_argument("--nar", help="a NAR model over the --vq tokenizer's codes (instead of --gpt)")
    ap.add_argument("--compare-to", default=None, help="zoo model holding the AR baseline (photos-nar: photos-gpt)")
    ap.add_argument("--msvq", help="multi-scale VQVAE (with --var)")
    ap.add_argument("--var")
    ap.add_argument("--video-gpt", help="a video GPT over the --vq tokenizer's codes, frame by frame")
    ap.add_argument("--video-nar", help="a video NAR (LARP-AR layout) over the --vq tokenizer's codes")
    ap.add_argument("--kl", help="KL tokenizer (with --car or --mar)")
    ap.add_argument("--car", help="a causal continuous model over the --kl tokenizer's latents")
    ap.add_argument("--mar", help="a MAR over the --kl tokenizer's latents")
    ap.add_argument("--draft", default=None, help="the zoo model cspd takes as the draft (photos-car: photos-car-draft)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--grid", default=None, help="where to write the card's sample grid (docs/<name>-grid.png)")
    a = ap.parse_args()
    if a.kl and (a.car or a.mar):
        card = export_continuous(a.kl, a.car or a.mar, a.out, a.name, kind="car" if a.car else "mar", grid=a.grid,
                                 draft=a.draft, compare_to=a.compare_to)
    elif a.vq and (a.video_gpt or a.video_nar):
        kind = "video-gpt" if a.video_gpt else "nar-video"
        card = export_video(a.vq, a.video_gpt or a.video_nar, a.out, a.name, kind=kind, compare_to=a.compare_to)
    elif a.var and a.msvq:
        card = export_var(a.msvq, a.var, a.out, a.name, grid=a.grid)
    elif a.vq and a.gpt:
        card = export(a.vq, a.gpt, a.out, a.name, grid=a.grid)
    elif a.vq and a.nar:
        card = export(a.vq, a.nar, a.out, a.name, grid=a.grid, kind="nar", compare_to=a.compare_to)
    else:
        ap.error("give --vq and --gpt (next-token), --vq and --nar (next-neighbour) or --msvq and --var (next-scale)")
    print(json.dumps(card["metrics"], indent=2))


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
