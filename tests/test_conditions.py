"""vgen.conditions: what a user gives (labels=, prompts=) turned into checked conditions, one-line errors for the wrong
kind, and the examples a model offers (calibration, benchmarks, window=auto's prior)."""
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
