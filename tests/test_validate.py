"""One rule per kind of input, the same for the CLI, the Python API and the demo (vgen.validate)."""
import numpy as np
import pytest
import torch

from vgen import validate
from vgen.errors import VGenError


@pytest.mark.parametrize("bad", [-1, 1.5, "3", None, True, 2 ** 63, float("nan")])
def test_seed_is_a_whole_number_in_range(bad):
    with pytest.raises(VGenError, match="seed must be a whole number"):
        validate.seed(bad)


def test_seed_leaves_room_for_every_sample():
    assert validate.seed(0) == 0 and validate.seed(3.0) == 3 and validate.seed(np.int64(7)) == 7
    assert validate.seed(2 ** 63 - 1) == 2 ** 63 - 1
    with pytest.raises(VGenError, match=r"0\.\.9223372036854775804 \(sample i uses seed \+ i\)"):
        validate.seed(2 ** 63 - 2, count=4)


def test_huge_seeds_sample_without_overflow(tiny_gpt):
    """The issue's seed=18446744073709552 overflowed the generator after sampling began; any valid seed works."""
    from vgen.samplers import sample
    for s in (18446744073709552, 2 ** 63 - 2):
        toks, _ = sample(tiny_gpt, [0, 1], "ar", seed=s)
        assert toks.shape == (2, 16)


@pytest.mark.parametrize("bad, msg", [
    ([0.5, 1.0], "got 0.5"), (torch.tensor([1.0, 2.0]), "float32 tensor"), (np.array([1.0]), "float64 tensor"),
    (torch.tensor([[0, 1]]), "shape"), ("cat", "string"), (torch.tensor([True]), "torch.bool tensor"),
    ([True, 1], "got True"), (np.array([True]), "bool"), ({"a": 1}, "dict"),
])
def test_labels_are_integer_class_ids(bad, msg):
    with pytest.raises(VGenError, match=msg):
        validate.labels(bad)


def test_labels_accepted_forms():
    for good in (3, [1, 2], (1, 2), torch.tensor([1, 2]), np.array([1, 2], dtype=np.int32), torch.tensor(2)):
        t = validate.labels(good)
        assert t.dtype == torch.int64 and t.dim() == 1


def test_pipeline_checks_labels_and_seed_before_sampling(tiny_pipeline):
    import vgen
    pipe = vgen.load_pipeline(str(tiny_pipeline))
    for bad in (torch.tensor([1.0]), torch.tensor([True, False]), [[0, 1]], "a"):
        with pytest.raises(VGenError, match="labels must be"):
            pipe.generate(bad)
    with pytest.raises(VGenError, match="seed must be"):
        pipe.generate([0], seed=-3)
    with pytest.raises(VGenError, match="seed must be"):
        pipe.generate([0, 1], seeds=[1, 2.5])


@pytest.mark.parametrize("bad", ["nope", "meta", "cuda:99", ""])
def test_devices_are_checked(bad, tiny_pipeline):
    import vgen
    with pytest.raises(VGenError, match="device"):
        validate.device(bad)
    with pytest.raises(VGenError, match="device"):
        vgen.load_pipeline(str(tiny_pipeline), device=bad)


@pytest.mark.parametrize("text, msg", [('{"model_kind": "gpt", ', "is not valid JSON"), ("{}", "lacks model_kind"),
                                       ("[1, 2]", "holds a list, not a JSON object")])
def test_malformed_pipeline_cards_give_one_line(tmp_path, text, msg):
    import vgen
    (tmp_path / "pipeline.json").write_text(text)
    with pytest.raises(VGenError, match=msg) as e:
        vgen.load_pipeline(str(tmp_path))
    assert "\n" not in str(e.value)
