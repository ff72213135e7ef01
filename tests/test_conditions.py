"""vgen.conditions: what a user gives (labels=, prompts=) turned into checked conditions, one-line errors for the wrong
kind, and the examples a model offers (calibration, benchmarks, window=auto's prior)."""
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vgen.conditions import Labels, Prompts, condition, examples, labels, prompts
from vgen.errors import VGenError


def spec(conditioning="class", num_classes=4):
    return SimpleNamespace(name="m", conditioning=conditioning, num_classes=num_classes)


def test_labels_take_every_integer_form_and_refuse_the_rest():
    for given in (2, [0, 3], (1, 1), torch.tensor([3, 0]), np.array([2, 2])):
        got = labels(given, 4)
        assert isinstance(got, Labels) and all(isinstance(i, int) for i in got.ids)
    assert labels([0, 3], 4).ids == (0, 3)
    for bad, words in (([0, 4], "class id 4 out of range: this model has classes 0..3"), ([-1], "class id -1"),
                       ([], "no labels given"), (True, "got a bool"), ("3", "the string"), ([1.5], "1.5"),
                       (torch.tensor([0.0]), "torch.float32 tensor")):
        with pytest.raises(VGenError, match=words):
            labels(bad, 4)


def test_prompts_take_a_string_or_a_list_and_refuse_empty_ones():
    assert prompts("a cat").texts == ("a cat",)
    assert prompts(["a", "b"]).texts == ("a", "b")
    for bad, words in (([], "is empty"), ([""], r"prompts\[0\] is an empty prompt"), (["a", "  "], r"prompts\[1\]"),
                       ([3], r"prompts\[0\] must be a string"), (3, "must be a string or a list"),
                       (True, "must be a string or a list")):
        with pytest.raises(VGenError, match=words):
            prompts(bad)
    with pytest.raises(VGenError, match="prompt_file is empty"):
        prompts([], where="prompt_file")


def test_condition_matches_the_model_kind():
    assert condition(spec(), [1, 2]) == Labels((1, 2))
    assert condition(spec(num_classes=3), default_all_classes=True) == Labels((0, 1, 2))
    assert condition(spec("text"), prompts_=["x"]) == Prompts(("x",))
    assert condition(spec("tokens"), prompts_="x") == Prompts(("x",))  # prompt token ids: prompts too
    for kw, words in ((dict(spec_=spec(), labels_=[0], prompts_=["x"]), "labels or prompts, not both"),
                      (dict(spec_=spec("text"), labels_=[0]), "text-to-image model: give prompts"),
                      (dict(spec_=spec("text")), "text-to-image model: give prompts, e.g."),
                      (dict(spec_=spec(), prompts_=["x"]), "class-conditional model and reads no text"),
                      (dict(spec_=spec()), "no labels given")):
        s = kw.pop("spec_")
        with pytest.raises(VGenError, match=words):
            condition(s, **kw)


def test_conditions_take_cycle_and_record():
    lab, pr = Labels((5, 6, 7)), Prompts(("a", "b"))
    assert len(lab) == 3 and lab.take([2, 0]) == Labels((7, 5)) and lab.cycle(5) == Labels((5, 6, 7, 5, 6))
    assert pr.cycle(3) == Prompts(("a", "b", "a")) and pr.take([1]) == Prompts(("b",))
    assert lab.record() == {"labels": [5, 6, 7]} and pr.record() == {"prompts": ["a", "b"]}
    assert (lab.kind, pr.kind) == ("class", "text")


def test_examples_cycle_the_classes_or_the_card_prompts():
    assert examples(SimpleNamespace(conditioning="class", num_classes=3), 5) == Labels((0, 1, 2, 0, 1))
    card = SimpleNamespace(conditioning="text", examples=["p", "q"])
    assert examples(card, 3) == Prompts(("p", "q", "p"))
    assert examples(SimpleNamespace(conditioning="text", examples=[]), 2) == Prompts(("a photo", "a photo"))


# ---------------------------------------------------------------------------------------------- the kinds, one each
def test_the_class_kind_parses_encodes_checks_and_calibrates():
    from vgen.conditions import kind_of
    k = kind_of("class")
    assert kind_of(spec()) is k and kind_of(SimpleNamespace(name="no conditioning")) is k  # the default kind
    assert (k.noun, k.reads_text, k.needs_text_encoder, k.has_classes, k.on_card) == ("label", False, False, True, True)
    assert k.parse(spec(), [3, 0]) == Labels((3, 0)) and k.card_keys == ("num_classes",)
    with pytest.raises(VGenError, match="m is a class-conditional model and reads no text"):
        k.parse(spec(), None, ["x"])
    assert k.examples(SimpleNamespace(num_classes=2), 3) == Labels((0, 1, 0))
    assert k.calibration(SimpleNamespace(num_classes=2)) is None and k.card_facts(None) == {}
    got = k.encode(SimpleNamespace(device=torch.device("cpu")), Labels((2, 1)))
    assert got.dtype == torch.long and got.tolist() == [2, 1]
    assert k.as_tensor(3).tolist() == [3] and k.as_tensor([1, 2]).dtype == torch.long
    k.check_tensor(torch.tensor([0, 3]), spec())
    with pytest.raises(VGenError, match="m is a class model: its conditions are class ids, got a torch.float32"):
        k.check_tensor(torch.zeros(2), spec())
    with pytest.raises(VGenError, match="class id 4 out of range: this model has classes 0..3"):
        k.check_tensor(torch.tensor([4]), spec())
    assert k.fallback(SimpleNamespace(num_classes=4), 2).tolist() == [0, 2]
    model = torch.nn.Linear(1, 1)
    assert k.bind(model, got) == (model, got)


def test_the_text_kind_parses_encodes_each_prompt_alone_and_checks_features():
    from vgen.conditions import kind_of
    k = kind_of("text")
    assert (k.noun, k.reads_text, k.needs_text_encoder, k.has_classes, k.on_card) == ("prompt", True, True, False, True)
    assert k.parse(spec("text"), None, "a cat") == Prompts(("a cat",)) and k.card_keys == ("text_encoder",)
    with pytest.raises(VGenError, match=r"m is a text-to-image model: give prompts=\[...\] \(or prompt_file=\)"):
        k.parse(spec("text"), [0], None)
    card = SimpleNamespace(examples=("p", "q", "r"))
    assert k.calibration(card) == Prompts(("p", "q", "r")) and k.card_facts(None) == {"conditioning": "text"}
    seen = []

    def encoder(batch):  # one prompt at a time, left-padded to 4 rows
        seen.append(list(batch))
        f = torch.zeros(1, 4, 2)
        f[0, -len(batch[0]):] = 1.0
        return f
    pipe = SimpleNamespace(text_encoder=encoder, model=torch.nn.Linear(1, 1).to(torch.float64),
                           device=torch.device("cpu"))
    got = k.encode(pipe, Prompts(("ab", "a", "ab")))
    assert seen == [["ab"], ["a"]]  # each prompt alone, once: the same bytes whatever shares its batch
    assert got.shape == (3, 4, 2) and got.dtype == torch.float64 and got[1, :3].eq(0).all()
    k.check_tensor(got, spec("text"))
    with pytest.raises(VGenError, match=r"m is a text model: its conditions are caption features \(N, T, D\)"):
        k.check_tensor(torch.tensor([1]), spec("text"))
    with pytest.raises(VGenError, match="calibrating a sampler on a text model needs example prompts"):
        k.fallback(SimpleNamespace(num_classes=0), 2)


def test_the_tokens_kind_reads_prompts_and_hands_the_ids_to_the_model():
    from vgen.conditions import card_kinds, kind_of
    k = kind_of("tokens")
    assert (k.reads_text, k.needs_text_encoder, k.has_classes, k.on_card) == (True, False, False, False)
    assert "tokens" not in card_kinds() and k.calibration(SimpleNamespace(examples=("p",))) is None
    assert k.parse(spec("tokens"), None, ["x", "y"]) == Prompts(("x", "y"))
    with pytest.raises(VGenError, match="text-to-image model: give prompts"):
        k.parse(spec("tokens"), [1], None)
    ids = k.as_tensor([5, 6, -1])
    assert ids.shape == (1, 3)  # one prompt's ids -> a batch of one
    view = object()
    model = SimpleNamespace(prepare=lambda c: (view, c[:, 1:]))
    assert k.bind(model, ids)[0] is view
    k.check_tensor(ids, spec("tokens"))  # the model's prepare checks its ids
    assert k.card_facts(None) == {"conditioning": "text"}  # a transformers card names what the user gives
    for call in (lambda: k.encode(None, Prompts(("x",))), lambda: k.fallback(model, 2)):
        with pytest.raises(VGenError, match="transformers"):
            call()


def test_the_registry_names_its_kinds_and_refuses_bad_registrations():
    from vgen.conditions import KINDS, KindBase, kind_of, list_kinds, register_kind
    assert KINDS == ("class", "text") and list_kinds()[:3] == ["class", "text", "tokens"]
    for name in list_kinds():
        assert kind_of(name).name == name and kind_of(spec(name)) is kind_of(name)
    with pytest.raises(VGenError, match="unknown condition kind 'video': the registered kinds are class, text"):
        kind_of("video")
    with pytest.raises(VGenError, match="condition kind 'half' lacks encode, examples, parse"):
        register_kind(type("Half", (KindBase,), {"name": "half"})())
    with pytest.raises(VGenError, match="condition kind 'text' is already registered"):
        register_kind(type("Other", (type(kind_of("text")),), {})())


# ------------------------------------------------------------------------ a kind registered outside vgen/ routes
@dataclass(frozen=True)
class Words:
    """Class ids spelled as words: a toy condition value."""
    ids: tuple[int, ...]
    kind = "toy-words"

    def __len__(self):
        return len(self.ids)

    def take(self, idx):
        return Words(tuple(self.ids[i] for i in idx))

    def cycle(self, n):
        return Words(tuple(self.ids[i % len(self.ids)] for i in range(n)))

    def record(self):
        return {"words": [NUMBERS[i] for i in self.ids]}


NUMBERS = ("zero", "one", "two", "three")


class WordsKind:
    """A toy kind written from the Protocol alone (no KindBase): every call it gets is logged."""
    name = "toy-words"
    title = "word-conditional"
    noun = "word"
    reads_text = True
    needs_text_encoder = False
    has_classes = True
    on_card = True
    card_keys = ("num_classes",)

    def __init__(self):
        self.calls = []

    def ids(self, value):
        words = [value] if isinstance(value, str) else list(value)
        bad = [w for w in words if w not in NUMBERS]
        if bad:
            raise VGenError(f"{bad[0]!r} is no word a {self.title} model knows: use {', '.join(NUMBERS)}")
        return tuple(NUMBERS.index(w) for w in words)

    def parse(self, spec, labels_=None, prompts_=None, *, default_all_classes=False):
        self.calls.append("parse")
        return Words(self.ids(prompts_ if prompts_ is not None else labels_))

    def examples(self, card, n):
        return Words(tuple(i % 4 for i in range(n)))

    def calibration(self, card):
        return None

    def card_facts(self, model):
        return {"conditioning": self.name}

    def encode(self, pipe, cond):
        self.calls.append("encode")
        return torch.tensor(cond.ids, dtype=torch.long, device=pipe.device)

    def as_tensor(self, value, device=None):
        self.calls.append("as_tensor")
        return torch.tensor(self.ids(value), device=device)

    def bind(self, model, cond):
        self.calls.append("bind")
        return model, cond

    def check_tensor(self, cond, spec):
        self.calls.append("check_tensor")

    def fallback(self, model, k, device=None):
        self.calls.append("fallback")
        return torch.arange(k, device=device) % 4


@pytest.fixture
def words():
    from vgen.conditions import register_kind, unregister_kind
    kind = register_kind(WordsKind())
    yield kind
    unregister_kind(kind.name)


def test_a_kind_registered_from_outside_vgen_is_what_every_call_asks(words, tiny_gpt, tiny_vq):
    """condition(), examples(), the card (its check and facts), ModelSpec, the sampler fit, Pipeline.encode,
    vgen.sample's tensor and its checks, window=auto's fallback: all through the registered kind, no vgen edit."""
    import vgen
    from vgen.cards import Card
    from vgen.conditions import card_kinds, kind_of
    from vgen.interfaces import ModelSpec
    from vgen.pipeline import Pipeline
    from vgen.samplers import fitting_samplers
    from vgen.samplers.base import example_cond
    assert condition(spec("toy-words"), prompts_=["two", "zero"]) == Words((2, 0)) and words.calls == ["parse"]
    with pytest.raises(VGenError, match="'five' is no word a word-conditional model knows"):
        condition(spec("toy-words"), prompts_="five")
    with pytest.raises(VGenError, match="labels or prompts, not both"):
        condition(spec("toy-words"), ["one"], ["one"])
    assert examples(SimpleNamespace(conditioning="toy-words"), 5) == Words((0, 1, 2, 3, 0))
    assert "toy-words" in card_kinds()

    tiny_gpt.__class__ = type("WordsGPT", (type(tiny_gpt),), {"conditioning": "toy-words"})  # reads class ids
    card = Card.from_model(tiny_gpt)
    assert card.conditioning == "toy-words" and card.num_classes == 4 and kind_of(card) is words
    assert ModelSpec.of(tiny_gpt).conditioning == "toy-words" and card.spec.conditioning == "toy-words"
    assert card.condition(prompts=["three"]).record() == {"words": ["three"]}
    assert "ar" in fitting_samplers(card)  # a sampler that names no conditionings drives every registered kind

    pipe = Pipeline(tiny_gpt, tiny_vq)
    words.calls.clear()
    cond = pipe.encode(pipe.condition(prompts=["one", "three"]))
    assert cond.tolist() == [1, 3] and words.calls == ["parse", "encode"]

    words.calls.clear()
    toks, _ = vgen.sample(tiny_gpt, ["one", "three"], "ar", seed=4)
    assert words.calls == ["as_tensor", "bind", "check_tensor"]
    tiny_gpt.__class__ = type(tiny_gpt).__mro__[1]  # the class model it was: the same tokens for the same ids
    assert torch.equal(toks, vgen.sample(tiny_gpt, [1, 3], "ar", seed=4)[0])
    tiny_gpt.__class__ = type("WordsGPT", (type(tiny_gpt),), {"conditioning": "toy-words"})
    assert example_cond(tiny_gpt, 3).tolist() == [0, 1, 2] and words.calls[-1] == "fallback"


def test_no_module_outside_vgen_conditions_compares_condition_kind_names():
    """Every decision on the kind of condition is the kind's (vgen.conditions): no `conditioning == "text"`,
    `.kind == "class"`, `conditioning in ("class", "text")` elsewhere in vgen/."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "vgen"
    names = r"""["'](?:class|text|tokens)["']"""
    patterns = [re.compile(p) for p in (
        rf"""(?:conditioning|\bkind)\s*(?:==|!=)\s*{names}""",  # conditioning == "text", cond.kind != "class"
        rf"""{names}\s*(?:==|!=)\s*[\w.()]*(?:conditioning|\bkind)\b""",  # "text" == spec.conditioning
        r"""["']conditioning["'][^)\n]*\)\s*(?:==|!=|not\s+in\b|in\b)""",  # getattr(m, "conditioning", ..) == ..
        rf"""(?:conditioning|\bkind)\s+(?:not\s+)?in\s*[(\[{{]\s*{names}""",  # conditioning in ("class", "text")
    )]
    found = [f"{p.relative_to(root.parent)}:{i}: {line.strip()}"
             for p in sorted(root.rglob("*.py")) if "conditions" not in p.relative_to(root).parts[:1]
             for i, line in enumerate(p.read_text().splitlines(), 1) if any(r.search(line) for r in patterns)]
    assert not found, "ask the condition kind (vgen.conditions.kind_of) instead:\n" + "\n".join(found)
