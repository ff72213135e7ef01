"""The embedded zoo: ships, loads, samples deterministically, and is really class-conditional."""
import pytest
import torch
from guards import needs_zoo

import vgen
from vgen.data import NUM_CLASSES, photos, to_model_range

pytestmark = needs_zoo("photos-gpt")


@pytest.fixture(scope="module")
def pipe():
    return vgen.load_pipeline("photos-gpt")


def test_zoo_card_and_model(pipe):
    assert pipe.num_classes == NUM_CLASSES and len(pipe.class_names) == NUM_CLASSES
    assert pipe.model.seq_len == 256 and pipe.model.token_shape == (16, 16)
    n = sum(p.numel() for p in pipe.model.parameters())
    assert 4e6 < n < 7e6
    assert pipe.model.output.weight.dtype == torch.float32  # stored fp16, loaded as fp32


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_zoo_generate_is_seeded_and_batch_invariant(pipe):
    a = pipe.generate([1, 5], seed=3)
    assert a.images.shape == (2, 3, 64, 64) and a.images.dtype == torch.uint8
    assert a.tokens.shape == (2, 256) and a.stats["forward_passes"] == 256
    b = pipe.generate([5], seed=4)
    assert torch.equal(a.tokens[1], b.tokens[0]) and torch.equal(a.images[1], b.images[0])


@pytest.mark.slow
def test_zoo_gpt_is_class_conditional(pipe):
    """Held-out crops are most likely under their own class far more often than chance (1/16): one
    per class (12/16 and 10/16 at seeds 123 and 7; 8 or more of 16 by chance has probability ~1e-6)."""
    data = photos("test", NUM_CLASSES, seed=123)
    with torch.no_grad():
        codes = pipe.tokenizer.encode_to_codes(to_model_range(data.images))
        n = codes.shape[0]
        ll = torch.empty(n, NUM_CLASSES)
        for c in range(NUM_CLASSES):
            logits = pipe.model(codes, torch.full((n,), c))
            ll[:, c] = logits.log_softmax(-1).gather(-1, codes[..., None]).squeeze(-1).sum(-1)
    acc = (ll.argmax(1) == data.labels).float().mean().item()
    assert acc > 0.5, acc


def test_zoo_tokenizer_reconstructs_held_out_crops(pipe):
    from vgen.train.vq import psnr
    data = photos("test", 32, seed=9)
    with torch.no_grad():
        rec = pipe.decode(pipe.tokenizer.encode_to_codes(to_model_range(data.images)))
    assert psnr(rec, data.images) > 24.0
