"""The typed pipeline card: every zoo card loads into its fields, and a card holding the wrong thing is refused in one
line naming the key, before any weights load."""
import json

import pytest

from vgen.cards import Card, list_models
from vgen.errors import VGenError
from vgen.interfaces import ModelSpec, Order, TokenType

CARD = {"model_kind": "gpt", "model": "gpt.safetensors", "tokenizer_kind": "vq", "tokenizer": "vq.safetensors",
        "generation": "next-token", "num_classes": 2, "token_shape": [4, 4], "vocab_size": 32,
        "class_names": ["a", "b"], "sampling": {"top_k": 10}}


def write(folder, card) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pipeline.json").write_text(json.dumps(card))
    return str(folder)


@pytest.mark.parametrize("name", list_models())
def test_every_zoo_card_loads(name):
    card = Card.load(name)
    raw = card.data
    assert card.name == raw["name"] == name and card.folder.name == name
    assert card.order == Order(raw["generation"]) and card.num_classes == raw.get("num_classes", 0)
    assert card.model_path.is_file() and card.tokenizer_path.is_file()
    assert card.class_names == tuple(raw.get("class_names", ())) and card.sampling == raw["sampling"]
    if raw.get("conditioning") == "text":  # a text model: its encoder folder and example prompts
        assert card.conditioning == "text" and card.spec.conditioning == "text"
        assert (card.folder / raw["text_encoder"] / "config.json").is_file() and len(card.examples) >= 1
    assert card.token_shape == tuple(raw["token_shape"])
    if raw.get("token_kind") == "latents":
        assert card.token_type == TokenType.latents(raw["latent_channels"])
    else:
        assert card.token_type == TokenType.codes(raw["vocab_size"])
    assert ModelSpec.of(card) == ModelSpec.from_card(card) == card.spec
    assert card.spec.name == f"this model ({name})"
    for draft in filter(None, [card.draft]):  # the draft a zoo card names makes its tokens
        assert card.draft_card().name == draft


def test_a_card_reads_every_field(tmp_path):
    card = Card.load(write(tmp_path / "p", {**CARD, "draft": "d", "drafter": "h.safetensors", "compare_to": "x",
                                            "image_size": 64, "frames": 8, "fps": 4, "patch_nums": [1, 2],
                                            "metrics": {"loss": 1.0}, "note": "kept"}))
    assert (card.name, card.order, card.num_classes, card.token_type, card.token_shape) == \
        ("p", Order.NEXT_TOKEN, 2, TokenType.codes(32), (4, 4))
    assert (card.model_kind, card.tokenizer_kind, card.model_path, card.tokenizer_path) == \
        ("gpt", "vq", tmp_path / "p" / "gpt.safetensors", tmp_path / "p" / "vq.safetensors")
    assert (card.draft, card.drafter, card.compare_to, card.image_size, card.frames, card.fps, card.patch_nums) == \
        ("d", "h.safetensors", "x", 64, 8, 4, (1, 2))
    assert card.class_names == ("a", "b") and card.metrics == {"loss": 1.0} and card.data["note"] == "kept"


def test_a_card_without_the_optional_keys_takes_their_defaults(tmp_path):
    minimal = {k: CARD[k] for k in ("model_kind", "model", "tokenizer_kind", "tokenizer", "num_classes")}
    card = Card.load(write(tmp_path / "m", minimal))
    assert card.order == Order.NEXT_TOKEN and card.token_type == TokenType("codes") and card.token_shape is None
    assert card.class_names == ("0", "1") and card.sampling == {} and card.draft == card.drafter == ""


@pytest.mark.parametrize("key, value, msg", [
    ("generation", "sideways", "generation must be one of next-token, next-scale"),
    ("num_classes", 0, "num_classes must be a whole number >= 1"),
    ("num_classes", "16", "num_classes must be a whole number >= 1"),
    ("token_kind", "pixels", "token_kind must be codes or latents"),
    ("vocab_size", -1, "vocab_size must be a whole number >= 1"),
    ("token_shape", [16, "16"], "token_shape must be a list of whole numbers"),
    ("class_names", ["a"], r"class_names must be a list of num_classes \(2\) names"),
    ("class_names", "a,b", "class_names must be a list of strings"),
    ("sampling", ["top_k", 10], "sampling must be a JSON object"),
    ("draft", 3, "draft must be a string"),
    ("model", 7, "model must be a string"),
    ("image_size", True, "image_size must be a whole number"),
])
def test_malformed_fields_are_refused_in_one_line(tmp_path, key, value, msg):
    with pytest.raises(VGenError, match=msg) as e:
        Card.load(write(tmp_path / "bad", {**CARD, key: value}))
    assert "\n" not in str(e.value) and "pipeline.json" in str(e.value)


def test_latents_need_their_channels(tmp_path):
    with pytest.raises(VGenError, match="latents needs latent_channels"):
        Card.load(write(tmp_path / "l", {**CARD, "token_kind": "latents"}))
    card = Card.load(write(tmp_path / "ok", {**CARD, "token_kind": "latents", "latent_channels": 4}))
    assert card.token_type == TokenType.latents(4)


def test_calibration_files_resolve_against_the_folder(tmp_path):
    from vgen.samplers import sampler_class
    card = Card.load(write(tmp_path / "v", {**CARD, "generation": "next-scale", "token_shape": [5],
                                            "sampling": {"kv_calibration": "scalekv.json", "cfg": 1.5}}))
    opts = card.sampling_options(sampler_class("var", card).Options)
    assert opts["kv_calibration"] == str(tmp_path / "v" / "scalekv.json")
    assert opts["cfg_scale"] == 2.5  # VAR's official cfg alias, resolved


def test_a_draft_card_is_checked_once_for_its_tokens(tmp_path):
    target = Card.load(write(tmp_path / "t", {**CARD, "draft": str(tmp_path / "d")}))
    write(tmp_path / "d", {**CARD, "num_classes": 3, "class_names": ["a", "b", "c"]})
    with pytest.raises(VGenError, match="has another number of classes") as e:
        target.draft_card()
    assert "\n" not in str(e.value)
    with pytest.raises(VGenError, match="names no draft"):
        Card.load(str(tmp_path / "d")).draft_card()
