"""The embedded next-neighbour zoo model: ships, loads, decodes in 31 passes, is seeded and class-conditional."""
import pytest
import torch
from guards import needs_zoo

import vgen
from vgen.data import NUM_CLASSES, photos, to_model_range

pytestmark = needs_zoo("photos-nar")


@pytest.fixture(scope="module")
def pipe():
    return vgen.load_pipeline("photos-nar")


def test_zoo_nar_card_and_model(pipe):
    assert pipe.card.order == "next-neighbour" and pipe.card.compare_to == "photos-gpt"
    assert pipe.model.token_shape == (16, 16) and pipe.model.config.medusa_attention_num == 1
    assert pipe.model.medusa_output.weight.dtype == torch.float32  # stored fp16, loaded as fp32


def test_zoo_nar_generate_31_passes_seeded_and_batch_invariant(pipe):
    a = pipe.generate([1, 5], seed=3)  # the card's sampler: nar
    assert a.images.shape == (2, 3, 64, 64) and a.stats["forward_passes"] == 31
    assert a.stats["sampler"] == "nar"
    b = pipe.generate([5], seed=4)
    assert torch.equal(a.tokens[1], b.tokens[0]) and torch.equal(a.images[1], b.images[0])


@pytest.mark.slow
def test_zoo_nar_is_class_conditional(pipe):
    """Held-out token grids are most likely under their own class far more often than chance (1/16): one
    per class (14/16 at seeds 123 and 7; 8 or more of 16 by chance has probability ~1e-6)."""
    data = photos("test", NUM_CLASSES, seed=123)
    with torch.no_grad():
        codes = pipe.tokenizer.encode_to_codes(to_model_range(data.images)).long()
        n = codes.shape[0]
        ll = torch.empty(n, NUM_CLASSES)
        for c in range(NUM_CLASSES):
            logits = pipe.model(codes, torch.full((n,), c))
            ll[:, c] = logits.log_softmax(-1).gather(-1, codes[..., None]).squeeze(-1).sum(-1)
    acc = (ll.argmax(1) == data.labels).float().mean().item()
    assert acc > 0.5, acc
