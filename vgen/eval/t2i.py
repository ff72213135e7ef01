"""The text-to-image suite (``vgen eval suite=t2i``): FID and the rest of the ADM table against a reference (the ADM
suite's machinery, :mod:`vgen.eval.adm`), CLIP score of every image against its prompt (:mod:`vgen.eval.clip`, when
CLIP weights are at hand), and for prompts about the embedded photos (``photos-t2i``) a prompt-accuracy score:

* subject: the zoo's captioned-photo classifier (:data:`T2I_CLASSIFIER`) names the subject the prompt names ("a
  photo of the cat" -> cat);
* colour and brightness: measured from the pixels (:func:`vgen.data.captions.measure_colour` /
  ``measure_brightness``, the treatments the captions describe) equal what the prompt says.

Each accuracy counts the prompts that state that fact only (:func:`vgen.data.captions.read_facts`).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from vgen.errors import VGenError
from vgen.eval.sources import ImageSource

# The judge of subjects: a photo classifier trained on the captioned crops (treatments included), which the plain
# one, never shown a tinted or darkened crop, is not (`vgen train recipe=photo recipe.data=captioned`).
T2I_CLASSIFIER = Path(__file__).resolve().parent.parent / "zoo" / "photo-classifier-t2i" / "classifier.safetensors"


def sample_prompts(samples) -> list[str]:
    """The prompts a ``vgen sample`` folder records (``stats.json``: one per sample), for ``prompts=`` left out."""
    p = Path(samples)
    stats = p / "stats.json" if p.is_dir() else None
    if stats is None or not stats.is_file():
        raise VGenError(f"give the prompts of {samples}: prompts=<.txt | .jsonl | .csv> (a vgen sample folder "
                        "records them in stats.json)")
    try:
        rec = json.loads(stats.read_text())
    except ValueError:
        raise VGenError(f"{stats} is not valid JSON: give prompts=<file>") from None
    prompts = rec.get("prompts") if isinstance(rec, dict) else None
    if not isinstance(prompts, list) or not all(isinstance(x, str) for x in prompts):
        raise VGenError(f"{stats} records no prompts (a class model's samples?): give prompts=<file>")
    return prompts


def prompt_accuracy(images, prompts: list[str], classifier=None, device="cpu", batch_size: int = 64) -> dict:
    """Subject, colour and brightness accuracy of ``images`` (uint8 (N, 3, H, W), a folder or an .npz) against what
    ``prompts`` state, with the counts each is over (None where no prompt states that fact)."""
    from vgen.data.captions import measure_brightness, measure_colour, read_facts
    from vgen.data.photos import CLASS_NAMES
    from vgen.eval.extractors import load_photo_classifier
    src = ImageSource(images, "samples")
    if len(src) != len(prompts):
        raise VGenError(f"{len(src)} images but {len(prompts)} prompts: sample i is scored against prompt i")
    facts = [read_facts(p) for p in prompts]
    net = load_photo_classifier(classifier or T2I_CLASSIFIER, device)
    pred, colour, light = [], [], []
    with torch.inference_mode():
        for x in src.batches(batch_size):
            pred += net(x.to(device))[1].argmax(-1).tolist()
            colour += measure_colour(x)
            light += measure_brightness(x)
    out: dict = {}
    for key, got in (("subject", [CLASS_NAMES[i] for i in pred]), ("colour", colour), ("brightness", light)):
        hits = [got[i] == f[key] for i, f in enumerate(facts) if key in f]
        out[f"{key}_accuracy"] = float(np.mean(hits)) if hits else None
        out[f"{key}_n"] = len(hits)
    return out


def evaluate(samples, prompts: list[str] | None = None, reference="photos-test", extractor: str = "photo",
             weights=None, clip_model: str = "ViT-B/32", clip_weights=None, accuracy: bool | None = None,
             classifier=None, batch_size: int = 64, device="cpu", kid_subset_size: int = 1000,
             progress: bool = False) -> dict:
    """The t2i table of ``samples`` (a folder, .npz or uint8 tensor) for ``prompts`` (None: the folder's
    stats.json): the ADM table against ``reference`` (FID first), ``clip_score`` (None, with a warning, when no CLIP
    weights are given or found: ``clip_weights``, ``$VGEN_CLIP_WEIGHTS``, the local hub cache) and, where every
    prompt names a zoo photo subject (``accuracy=None``) or when asked, the prompt accuracies."""
    from vgen.data.captions import read_facts
    from vgen.eval import adm
    from vgen.eval.clip import clip_score, clip_weights_folder
    prompts = list(prompts) if prompts is not None else sample_prompts(samples)
    n = len(ImageSource(samples, "samples"))
    if n != len(prompts):
        raise VGenError(f"{n} samples but {len(prompts)} prompts: sample i is scored against prompt i")
    notes: list[str] = []
    clip_folder = None
    try:
        clip_folder = clip_weights_folder(clip_weights, clip_model)
    except VGenError as e:
        if clip_weights is not None:
            raise
        notes.append(f"CLIP score left out: {e}")
    if accuracy is None:
        accuracy = all("subject" in read_facts(p) for p in prompts)
    res = adm.evaluate(samples, reference, extractor=extractor, weights=weights, batch_size=batch_size,
                       device=device, kid_subset_size=kid_subset_size, progress=progress)
    out = {"suite": "t2i", **{k: res[k] for k in ("fid", "sfid", "is", "precision", "recall", "kid", "kid_std")},
           "clip_score": None, "clip_score_std": None, "clip_model": None}
    if clip_folder is not None:
        c = clip_score(samples, prompts, model=clip_model, weights=clip_folder, batch_size=batch_size, device=device)
        out.update(clip_score=c["mean"], clip_score_std=c["std"], clip_model=c["model"])
    if accuracy:
        out.update(prompt_accuracy(samples, prompts, classifier, device, batch_size))
    out.update(num_samples=n, num_prompts=len(set(prompts)), adm=res, warnings=res["warnings"] + notes)
    return out


def markdown(res: dict) -> str:
    def num(v, fmt):
        return "n/a" if v is None else format(v, fmt)
    rows = [("FID", num(res["fid"], ".3f")), ("sFID", num(res["sfid"], ".3f")), ("IS", num(res["is"], ".3f")),
            ("Precision", num(res["precision"], ".4f")), ("Recall", num(res["recall"], ".4f")),
            ("CLIP score", num(res["clip_score"], ".2f") + (f" ({res['clip_model']})" if res["clip_model"] else ""))]
    for k in ("subject", "colour", "brightness"):
        if f"{k}_accuracy" in res:
            rows.append((f"{k} accuracy", f"{num(res[f'{k}_accuracy'], '.3f')} (of {res[f'{k}_n']} prompts)"))
    lines = ["| metric | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    lines += ["", f"- samples: {res['num_samples']} images for {res['num_prompts']} distinct prompts",
              f"- FID: {res['adm']['extractor']} features against {res['adm']['reference']}"]
    lines += [f"- warning: {w}" for w in res["warnings"]]
    return "\n".join(lines) + "\n"
