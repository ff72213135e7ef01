"""Captioned photo crops for the text-to-image zoo model ``photos-t2i``: the crops of :mod:`vgen.data.photos`,
a random colour and brightness treatment on each, and a caption that is TRUE of the crop.

What a caption promises:

* it names the subject, the photograph the crop was cut from (``SUBJECT_PHRASES``: "the cat",
  "the china palace", ...); "a photo of the cat" is one of the captions training sees;
* it may mention any subset of the other facts of :class:`CropFacts` (chosen at random per caption), and every
  fact it mentions is true: the scale ("close-up", "medium shot", "wide shot"), where the crop lies ("the top
  left part of ..."), "mirrored", the colour ("in black and white", "in warm tones", "in cool tones", "in natural
  colours") and the brightness ("dark", "bright");
* a fact it does not mention may be anything;
* :func:`treatment_caption` leaves the subject out (a training option: what the crop looks like, apart from what
  it shows). An untreated brightness ("normal") and an unflipped crop are
  never mentioned.

Where a crop lies is said in the UNFLIPPED photograph: a mirrored crop of the left part of the cat is "the left
part of the cat, mirrored", though its content now faces the other way. The thirds are those of the split's
region of the photograph (:func:`vgen.data.photos.region`: the left three quarters of the photo for training,
the right quarter for testing), which is all of the photo a split ever shows. The scale is the crop's side
relative to the region's shorter side.

Colour and brightness are treatments applied to the crop's pixels, drawn from their own random stream (the crops
themselves are cut as ``photos`` cuts them, with sides up to the region's shorter side so that every scale
occurs). They are strong enough to read back from pixels:
:func:`measure_colour` and :func:`measure_brightness` recover them from the images alone (for scoring generated
images). Grey photographs look black and white untreated, and the retina looks warm untreated: their colour is
always one of the three treatments, so that no caption calls a grey crop "natural colours" or a retina crop
anything but what it looks like.

Held out for evaluation: a few (subject, colour) and (subject, brightness) combinations (``HELDOUT_COMBOS``) that
no training crop has, and two phrasings (``HELDOUT_TEMPLATES``) that no training caption uses.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from vgen.data.photos import CLASS_NAMES, CropBox, photos_with_boxes
from vgen.errors import VGenError

SUBJECT_PHRASES: dict[str, str] = {
    "astronaut": "the astronaut", "brick": "the brick wall", "camera": "the man with the camera",
    "cat": "the cat", "coffee": "the cup of coffee", "coins": "the coins", "grass": "the grass",
    "gravel": "the gravel", "hubble": "the hubble deep field", "tissue": "the tissue sample", "moon": "the moon",
    "motorcycle": "the motorcycle", "retina": "the retina", "rocket": "the rocket", "china": "the china palace",
    "flower": "the flower",
}
assert tuple(SUBJECT_PHRASES) == CLASS_NAMES

SCALES = ("close-up", "medium", "wide")
HORIZONTAL = ("left", "centre", "right")
VERTICAL = ("top", "middle", "bottom")
COLOURS = ("natural", "black and white", "warm", "cool")
BRIGHTNESSES = ("normal", "dark", "bright")

CLOSE_UP_MAX, WIDE_MIN = 0.35, 0.7     # crop side / shorter side of the region
COLOUR_P = (0.5, 1 / 6, 1 / 6, 1 / 6)  # natural, black and white, warm, cool
BRIGHTNESS_P = (0.6, 0.2, 0.2)         # normal, dark, bright
# photographs whose untreated look already reads as a treatment (grey: black and white; the retina: warm)
ALWAYS_TREATED = frozenset({"brick", "camera", "coins", "grass", "gravel", "moon", "retina"})
MAX_SIDE = 1 << 16                     # crop sides range up to the region's shorter side: every scale occurs

TINT = 0.5    # warm: red lifted half-way to 255, blue halved (cool: the reverse); green untouched
DIM = 0.4     # dark: x * 0.4 (at most 102); bright: 255 - 0.4 * (255 - x) (at least 153)
LUMA = (0.299, 0.587, 0.114)

# Read-back thresholds. The treatments bound the pixels: dark caps every channel at 102 and bright lifts every
# channel to at least 153, so the 99th percentile of the brightest channel and the 1st percentile of the darkest
# channel tell them from naturally dark or light crops; after undoing the measured brightness, black and white
# has equal channels, and warm puts red above and blue below 127.5 at every pixel (cool the reverse), which
# natural crops almost never do. The thresholds judge generated images, which pass through a 64-pixel tokenizer:
# its round trip blurs the bounds (a black-and-white crop comes back with a mean chroma around 8-12, a tinted one
# with a few pixels across the 127.5 line). They were chosen on 2,000 training crops (captioned_photos("train",
# 2000, seed=0)) to maximise the lower of two recoveries: of the crops themselves and of their round trips through
# photos-t2i's tokenizer (docs/scripts/calibrate_treatment_judge.py). On 960 unseen crops of the training region
# (the generator's domain): colour 0.961 / brightness 0.989 from the crops, 0.951 / 0.978 from the round trips;
# the pixel-exact thresholds used before (2 / 120 / 110 / 145) read the crops as well but only 0.79 / 0.95 of the
# round trips. The test region is harder (0.84 / 0.91 from its crops: grey natural crops read as black and white).
# tests/test_captions.py checks these rates.
DARK_MAX = 115.0      # 99th percentile of max(R, G, B) at or below: dark
BRIGHT_MIN = 130.0    # 1st percentile of min(R, G, B) at or above: bright
BW_CHROMA = 20.0      # mean of max(R, G, B) - min(R, G, B) below (after undoing the brightness): black and white
TINT_EDGE = 90.0      # 2nd percentile of red >= this and 98th percentile of blue <= 255 - this: warm (cool: swapped)


@dataclass(frozen=True)
class CropFacts:
    """What is true of one captioned crop."""
    subject: str      # a CLASS_NAMES entry
    scale: str        # close-up | medium | wide
    horizontal: str   # left | centre | right: the crop centre's third of the region, in the unflipped photo
    vertical: str     # top | middle | bottom
    mirrored: bool    # flipped left-right
    colour: str       # natural | black and white | warm | cool
    brightness: str   # normal | dark | bright


class CaptionedPhotos(NamedTuple):
    images: torch.Tensor            # uint8 (N, 3, size, size), treated
    labels: torch.Tensor            # int64 (N,), class ids
    facts: tuple[CropFacts, ...]
    captions: tuple[str, ...]


# (subject, attribute, value): never a training crop; the held-out evaluation's crops and prompts
HELDOUT_COMBOS: tuple[tuple[str, str, str], ...] = (
    ("cat", "colour", "cool"), ("china", "colour", "black and white"),
    ("rocket", "colour", "warm"), ("motorcycle", "colour", "cool"),
    ("moon", "brightness", "bright"), ("coffee", "brightness", "dark"),
    ("astronaut", "brightness", "bright"), ("flower", "brightness", "dark"),
)


# ---------------------------------------------------------------------------------------------------- crop facts

def crop_facts(box: CropBox, colour: str = "natural", brightness: str = "normal") -> CropFacts:
    """The facts of the crop cut at ``box`` (see :func:`vgen.data.photos.photos_with_boxes`)."""
    r = box.side / min(box.region_h, box.region_w)
    scale = "close-up" if r <= CLOSE_UP_MAX else "wide" if r >= WIDE_MIN else "medium"
    cx, cy = (box.x + box.side / 2) / box.region_w, (box.y + box.side / 2) / box.region_h
    return CropFacts(CLASS_NAMES[box.label], scale, HORIZONTAL[min(int(cx * 3), 2)], VERTICAL[min(int(cy * 3), 2)],
                     box.flipped, colour, brightness)


def _is_heldout(subject: str, colour: str, brightness: str) -> bool:
    return (subject, "colour", colour) in HELDOUT_COMBOS or (subject, "brightness", brightness) in HELDOUT_COMBOS


def draw_treatment(rng: np.random.Generator, subject: str, heldout: tuple[str, str, str] | None = None
                   ) -> tuple[str, str]:
    """(colour, brightness) for a crop of ``subject``: never a held-out combination, except ``heldout`` when given
    (then that attribute is fixed to its value). A draw that hits a held-out combination is drawn again."""
    while True:
        if subject in ALWAYS_TREATED:
            colour = COLOURS[1 + int(rng.integers(3))]
        else:
            colour = COLOURS[int(rng.choice(4, p=COLOUR_P))]
        brightness = BRIGHTNESSES[int(rng.choice(3, p=BRIGHTNESS_P))]
        if heldout is None:
            ok = not _is_heldout(subject, colour, brightness)
        elif heldout[1] == "colour":
            colour, ok = heldout[2], (subject, "brightness", brightness) not in HELDOUT_COMBOS
        else:
            brightness, ok = heldout[2], (subject, "colour", colour) not in HELDOUT_COMBOS
        if ok:
            return colour, brightness


def apply_treatment(images: torch.Tensor, colour: str, brightness: str) -> torch.Tensor:
    """Treat uint8 ``(..., 3, H, W)`` images: colour first, then brightness. Rounded once, uint8 out."""
    if colour not in COLOURS or brightness not in BRIGHTNESSES:
        raise VGenError(f"unknown treatment {colour!r}, {brightness!r}")
    x = images.double()
    r, g, b = x.unbind(-3)
    if colour == "black and white":
        luma = LUMA[0] * r + LUMA[1] * g + LUMA[2] * b
        r = g = b = luma
    elif colour == "warm":
        r, b = r + TINT * (255 - r), b * (1 - TINT)
    elif colour == "cool":
        r, b = r * (1 - TINT), b + TINT * (255 - b)
    x = torch.stack([r, g, b], dim=-3)
    if brightness == "dark":
        x = x * DIM
    elif brightness == "bright":
        x = 255 - DIM * (255 - x)
    return x.round().clamp(0, 255).to(torch.uint8)


# ----------------------------------------------------------------------------------------- reading back from pixels

def _pixels(images) -> torch.Tensor:
    x = torch.as_tensor(images)
    if x.ndim != 4 or x.shape[1] != 3:
        raise VGenError(f"expected uint8 images (N, 3, H, W), got shape {tuple(x.shape)}")
    return x.double()


def measure_brightness(images) -> list[str]:
    """"normal", "dark" or "bright" per uint8 ``(N, 3, H, W)`` image, from pixels alone."""
    x = _pixels(images)
    top = torch.quantile(x.amax(1).flatten(1), 0.99, dim=1)
    floor = torch.quantile(x.amin(1).flatten(1), 0.01, dim=1)
    return ["dark" if t <= DARK_MAX else "bright" if f >= BRIGHT_MIN else "normal"
            for t, f in zip(top.tolist(), floor.tolist())]


def measure_colour(images) -> list[str]:
    """"natural", "black and white", "warm" or "cool" per uint8 ``(N, 3, H, W)`` image, from pixels alone
    (the measured brightness is undone first)."""
    x = _pixels(images)
    out = []
    for img, light in zip(x, measure_brightness(images)):
        if light == "dark":
            img = img / DIM
        elif light == "bright":
            img = 255 - (255 - img) / DIM
        img = img.clamp(0, 255)
        chroma = (img.amax(0) - img.amin(0)).mean().item()
        q = torch.tensor([0.02, 0.98], dtype=img.dtype)
        r_lo, r_hi = torch.quantile(img[0].flatten(), q).tolist()
        b_lo, b_hi = torch.quantile(img[2].flatten(), q).tolist()
        if chroma < BW_CHROMA:
            out.append("black and white")
        elif r_lo >= TINT_EDGE and b_hi <= 255 - TINT_EDGE:
            out.append("warm")
        elif b_lo >= TINT_EDGE and r_hi <= 255 - TINT_EDGE:
            out.append("cool")
        else:
            out.append("natural")
    return out


# ------------------------------------------------------------------------------------------------------- captions

# <a NOUN>: an article, the brightness if mentioned, then the scale's noun if mentioned, else NOUN.
# <thing>: the subject, with the position if mentioned; <extras>: ", mirrored, in warm tones" (what is mentioned);
# <list>: every mentioned fact as ", dark, close-up, mirrored, in warm tones".
TEMPLATES: tuple[str, ...] = (
    "<a photo> of <thing><extras>",
    "<a picture> of <thing><extras>",
    "<an image> of <thing><extras>",
    "<thing><list>",
    "<thing> in <a photo><extras>",
    "<a photo> showing <thing><extras>",
    "<a photo><extras>: <thing>",
    "<a shot> of <thing><extras>",
    "<a photograph> of <thing><extras>",
)
HELDOUT_TEMPLATES: tuple[str, ...] = (
    "<a snapshot> that shows <thing><extras>",
    "<thing>, captured in <a photo><extras>",
)
FACT_KINDS = ("scale", "horizontal", "vertical", "mirrored", "colour", "brightness")
_SCALE_NOUN = {"close-up": "close-up", "medium": "medium shot", "wide": "wide shot"}
_COLOUR_PHRASE = {"natural": "in natural colours", "black and white": "in black and white",
                  "warm": "in warm tones", "cool": "in cool tones"}
_ACROSS = {"left": "left", "centre": "central", "right": "right"}


def _position(v: str | None, h: str | None) -> str:
    if v and h:
        return "central" if (v, h) == ("middle", "centre") else f"{v} {h}"
    return v or _ACROSS[h]


def _say(facts: CropFacts, template: str, mention: set[str]) -> tuple[str, dict]:
    """Fill ``template`` with the facts in ``mention``; returns the caption and what it says."""
    said = {"subject": facts.subject}
    for k in mention:
        if (k, getattr(facts, k)) not in (("mirrored", False), ("brightness", "normal")):
            said[k] = getattr(facts, k)
    light = [said["brightness"]] if "brightness" in said else []
    shot = [_SCALE_NOUN[said["scale"]]] if "scale" in said else []
    extras = ["mirrored"] if "mirrored" in said else []
    extras += [_COLOUR_PHRASE[said["colour"]]] if "colour" in said else []
    thing = SUBJECT_PHRASES[facts.subject]
    if "horizontal" in said or "vertical" in said:
        thing = f"the {_position(said.get('vertical'), said.get('horizontal'))} part of {thing}"

    def a(m: re.Match) -> str:
        words = " ".join(light + (shot or [m.group(1)]))
        return ("an " if words[0] in "aeiou" else "a ") + words

    text = re.sub(r"<an? (\w+)>", a, template)
    text = text.replace("<thing>", thing).replace("<extras>", "".join(", " + e for e in extras))
    return text.replace("<list>", "".join(", " + e for e in light + shot + extras)), said


def describe(facts: CropFacts, rng: np.random.Generator, template: str | int | None = None,
             must: tuple[str, ...] = ()) -> tuple[str, dict]:
    """A caption of ``facts`` and the facts it mentions (a dict, the subject always): a random subset of the
    facts (plus those in ``must``), in ``template`` (a string or an index into TEMPLATES; random when None)."""
    if template is None:
        template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
    elif isinstance(template, int):
        template = TEMPLATES[template]
    k = int(rng.integers(len(FACT_KINDS) + 1))
    mention = {FACT_KINDS[i] for i in rng.choice(len(FACT_KINDS), size=k, replace=False)} | set(must)
    return _say(facts, template, mention)


# A caption without the subject (``treatment_caption``): what the crop looks like, not what it shows.
TREATMENT_TEMPLATES: tuple[str, ...] = ("<a photo><extras>", "<a picture><extras>", "<an image><extras>",
                                        "<a photograph><extras>")


def treatment_caption(facts: CropFacts, rng: np.random.Generator) -> str:
    """A true caption of ``facts`` that leaves the subject out and always states the colour and the brightness
    (when not normal), plus a random subset of the scale and the mirroring: "a dark close-up, in cool tones".
    Training with some of these (``recipe=t2i recipe.subject_dropout=p``) shows the treatments apart from the
    subjects, which is what a held-out (subject, treatment) combination asks the model to compose."""
    template = TREATMENT_TEMPLATES[int(rng.integers(len(TREATMENT_TEMPLATES)))]
    mention = {"colour", "brightness"} | {k for k in ("scale", "mirrored") if rng.integers(2)}
    said = {k: getattr(facts, k) for k in mention
            if (k, getattr(facts, k)) not in (("mirrored", False), ("brightness", "normal"))}
    light = [said["brightness"]] if "brightness" in said else []
    shot = [_SCALE_NOUN[said["scale"]]] if "scale" in said else []
    extras = (["mirrored"] if "mirrored" in said else []) + [_COLOUR_PHRASE[said["colour"]]]

    def a(m: re.Match) -> str:
        words = " ".join(light + (shot or [m.group(1)]))
        return ("an " if words[0] in "aeiou" else "a ") + words

    return re.sub(r"<an? (\w+)>", a, template).replace("<extras>", "".join(", " + e for e in extras))


def caption(facts: CropFacts, rng: np.random.Generator, template: str | int | None = None) -> str:
    """A true caption of ``facts``: the subject and a random subset of the other facts (see :func:`describe`)."""
    return describe(facts, rng, template)[0]


# ---------------------------------------------------------------------------------------------------- the dataset

def _split_id(split: str) -> int:
    return 0 if split == "train" else 1


def captioned_photos(split: str = "train", n: int = 64, seed: int = 0, size: int = 64,
                     heldout: bool = False, variant: int = 0) -> CaptionedPhotos:
    """``n`` treated crops with their facts and captions; deterministic in the arguments.

    Crops are cut by :func:`vgen.data.photos.photos_with_boxes` (the same random stream as ``photos``) with sides
    from ``size`` up to the region's shorter side.

    ``heldout=False``: crops of every class in turn, never a held-out combination, captioned with TEMPLATES.
    ``heldout=True``: sample i has the held-out combination ``HELDOUT_COMBOS[i % 8]`` and a caption in
    HELDOUT_TEMPLATES that mentions the held-out attribute.
    ``variant=k > 0`` (training crops only): the same crops under another treatment, drawn from a stream of its
    own and never the crop's variant-0 treatment, so a model sees each crop under ``k + 1`` different looks.
    """
    if variant and heldout:
        raise VGenError("captioned_photos: variant is for training crops; the held-out set has one treatment each")
    classes = [CLASS_NAMES.index(s) for s, _, _ in HELDOUT_COMBOS] if heldout else None
    data, boxes = photos_with_boxes(split, n, seed=seed, size=size, classes=classes, max_side=MAX_SIDE)
    treat_rng = np.random.default_rng([seed, _split_id(split), 1, int(heldout)])
    text_rng = np.random.default_rng([seed, _split_id(split), 2, int(heldout)])
    if variant:
        var_rng = np.random.default_rng([seed, _split_id(split), 1, 0, variant])
        text_rng = np.random.default_rng([seed, _split_id(split), 2, 0, variant])
    images = torch.empty_like(data.images)
    facts, captions = [], []
    for i, box in enumerate(boxes):
        combo = HELDOUT_COMBOS[i % len(HELDOUT_COMBOS)] if heldout else None
        treatment = draw_treatment(treat_rng, CLASS_NAMES[box.label], combo)
        if variant:
            first, treatment = treatment, draw_treatment(var_rng, CLASS_NAMES[box.label])
            while treatment == first:
                treatment = draw_treatment(var_rng, CLASS_NAMES[box.label])
        f = crop_facts(box, *treatment)
        images[i] = apply_treatment(data.images[i], f.colour, f.brightness)
        if heldout:
            template = HELDOUT_TEMPLATES[int(text_rng.integers(len(HELDOUT_TEMPLATES)))]
            text = describe(f, text_rng, template, must=(combo[1],))[0]
        else:
            text = caption(f, text_rng)
        facts.append(f)
        captions.append(text)
    return CaptionedPhotos(images, data.labels, tuple(facts), tuple(captions))


CROP_SETS = ("photos", "captioned")  # what a recipe's ``data`` option names


def crops(data: str, split: str, n: int, seed: int = 0, size: int = 64):
    """``n`` crops of a recipe's ``data``: ``"photos"`` (:func:`vgen.data.photos.photos`) or ``"captioned"``
    (:func:`captioned_photos`, treatments applied); either has ``images`` (uint8) and ``labels``."""
    if data == "captioned":
        return captioned_photos(split, n, seed=seed, size=size)
    if data == "photos":
        from vgen.data.photos import photos
        return photos(split, n, seed=seed, size=size)
    raise VGenError(f"recipe.data must be {' or '.join(CROP_SETS)}, got {data!r}")


def _random_facts(rng: np.random.Generator, subject: str, heldout: tuple[str, str, str] | None = None) -> CropFacts:
    colour, brightness = draw_treatment(rng, subject, heldout)
    return CropFacts(subject, SCALES[int(rng.integers(3))], HORIZONTAL[int(rng.integers(3))],
                     VERTICAL[int(rng.integers(3))], bool(rng.integers(2)), colour, brightness)


def prompt_set(kind: str, n: int = 16, seed: int = 0) -> list[tuple[str, dict]]:
    """``n`` evaluation prompts with the facts each states (a dict: subject and what else it mentions).

    * "subject": "a photo of the cat" and so on, prompt i for class ``i % 16``;
    * "colour" / "brightness": a training phrasing that mentions the subject and a (non-held-out) colour or
      brightness treatment (never "natural" or "normal"), and nothing else;
    * "heldout": prompt i for ``HELDOUT_COMBOS[i % 8]`` in a held-out phrasing, mentioning the subject and the
      held-out attribute only.
    """
    rng = np.random.default_rng([seed, 3])
    out = []
    for i in range(n):
        if kind == "subject":
            subject = CLASS_NAMES[i % len(CLASS_NAMES)]
            out.append((f"a photo of {SUBJECT_PHRASES[subject]}", {"subject": subject}))
        elif kind in ("colour", "brightness"):
            subject = CLASS_NAMES[i % len(CLASS_NAMES)]
            while True:
                f = _random_facts(rng, subject)
                if getattr(f, kind) not in ("natural", "normal"):
                    break
            template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
            out.append(_say(f, template, {kind}))
        elif kind == "heldout":
            combo = HELDOUT_COMBOS[i % len(HELDOUT_COMBOS)]
            f = _random_facts(rng, combo[0], combo)
            template = HELDOUT_TEMPLATES[int(rng.integers(len(HELDOUT_TEMPLATES)))]
            out.append(_say(f, template, {combo[1]}))
        else:
            raise VGenError(f"unknown prompt kind {kind!r}: use 'subject', 'colour', 'brightness' or 'heldout'")
    return out


# ------------------------------------------------------------------------------------------------------ tokenizer

def caption_corpus(n: int = 20000, seed: int = 0) -> list[str]:
    """Text for a tokenizer: ``n`` training captions of random facts, then every template (held-out ones too)
    filled for every subject with every value of every fact, one fact at a time and all at once."""
    rng = np.random.default_rng([seed, 4])
    out = [caption(_random_facts(rng, CLASS_NAMES[int(rng.integers(len(CLASS_NAMES)))]), rng) for _ in range(n)]
    values = {"scale": SCALES, "horizontal": HORIZONTAL, "vertical": VERTICAL, "mirrored": (True,),
              "colour": COLOURS, "brightness": BRIGHTNESSES[1:]}
    for template in TEMPLATES + HELDOUT_TEMPLATES:
        for subject in CLASS_NAMES:
            base = _random_facts(rng, subject)
            for kind in FACT_KINDS:
                for value in values[kind]:
                    out.append(_say(replace(base, **{kind: value}), template, {kind})[0])
            for h in HORIZONTAL:
                for v in VERTICAL:
                    out.append(_say(replace(base, horizontal=h, vertical=v), template, set(FACT_KINDS))[0])
    return out


def train_text_tokenizer(corpus: list[str], folder: str | Path, vocab_size: int = 1000,
                         model_max_length: int = 32) -> Path:
    """A lowercase word-level tokenizer (words and punctuation apart) trained on ``corpus``: "<pad>" = 0,
    "</s>" = 1 (appended to every text, as T5 does), "<unk>" = 2. Saved in ``folder`` so that
    ``transformers.AutoTokenizer.from_pretrained(folder)`` loads it; returns the folder."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # \w+ and [^\w\s]+ apart
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(vocab_size=vocab_size,
                                                              special_tokens=["<pad>", "</s>", "<unk>"]))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", tok.token_to_id("</s>"))])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "</s>",
              "unk_token": "<unk>", "model_max_length": model_max_length, "padding_side": "right",
              "truncation_side": "right", "do_lower_case": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2) + "\n")
    return folder



def read_facts(prompt: str) -> dict:
    """The facts a prompt states that can be checked from pixels or by the photo classifier: ``subject`` (a class
    name, when the prompt names one of :data:`SUBJECT_PHRASES` or a class name as a word), ``colour`` and
    ``brightness`` (when it says "in black and white", "in warm tones", "dark", ...). What it does not state is
    absent. The inverse of :func:`describe` for these three facts."""
    text = " " + re.sub(r"[^a-z\- ]", " ", prompt.lower()) + " "
    out: dict = {}
    hits = [(len(p), name) for name, p in SUBJECT_PHRASES.items() if f" {p.removeprefix('the ')} " in text]
    hits += [(len(name), name) for name in SUBJECT_PHRASES if f" {name} " in text]
    if hits:
        out["subject"] = max(hits)[1]
    for colour, phrase in _COLOUR_PHRASE.items():
        if f" {phrase} " in text:
            out["colour"] = colour
    for b in ("dark", "bright"):
        if f" {b} " in text:
            out["brightness"] = b
    return out
