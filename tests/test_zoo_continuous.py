"""The embedded continuous-token zoo: photos-car (target) + photos-car-draft, photos-mar; KL tokenizer quality, cards,
sampling through the pipeline, and class conditioning."""
import pytest
import torch
from guards import needs_zoo

import vgen
from vgen.data import NUM_CLASSES, photos, to_model_range

pytestmark = needs_zoo("photos-car", "photos-car-draft", "photos-mar")


@pytest.fixture(scope="module")
def car():
    return vgen.load_pipeline("photos-car")


def test_zoo_continuous_cards(car):
    mar = vgen.load_pipeline("photos-mar")
    for pipe, order in ((car, "continuous-next-token"), (mar, "masked")):
        assert pipe.card.order == order and pipe.card.token_type.kind == "latents"
        assert pipe.card.token_type.channels == 4 and tuple(pipe.model.token_shape) == (16, 16)
        assert pipe.card.metrics["tokenizer_test_psnr"] > 25  # the KL tokenizer's held-out reconstruction
    assert car.card.draft == "photos-car-draft"
    draft = vgen.load_pipeline("photos-car-draft")
    n_t, n_d = (sum(p.numel() for p in m.parameters()) for m in (car.model, draft.model))
    assert 4e6 < n_t < 8e6 and n_d < n_t / 3
    same = car.tokenizer.state_dict()
    assert all(torch.equal(v, draft.tokenizer.state_dict()[k]) for k, v in same.items())  # one tokenizer


@pytest.mark.slow
def test_zoo_car_and_cspd_generate(car):
    opts = dict(num_sampling_steps=4)  # short head schedules: a quick test, not the card's quality
    a = car.generate([2], seed=1, **opts)
    assert a.images.shape == (1, 3, 64, 64) and a.tokens.shape == (1, 256, 4)
    assert a.stats["forward_passes"] == 256 and a.images.float().std() > 10  # not a flat image
    c = car.generate([2], sampler="cspd", seed=1, num_draft=4, rule="path", **opts)
    assert c.stats["forward_passes"] < 256 and c.stats["acceptance_rate"] > 0
    assert c.images.shape == (1, 3, 64, 64)


@pytest.mark.slow
def test_zoo_mar_generates(car):
    mar = vgen.load_pipeline("photos-mar")
    g = mar.generate([4], seed=0, num_iter=8, num_sampling_steps=8)
    assert g.stats["sampler"] == "mar" and g.stats["forward_passes"] == 8
    assert g.images.shape == (1, 3, 64, 64)


@pytest.mark.slow
def test_zoo_car_is_class_conditional(car):
    """Held-out latents have a lower diffusion loss under their own class than under the others (fixed noise)."""
    data = photos("test", NUM_CLASSES, seed=321)
    with torch.no_grad():
        x = car.tokenizer.encode(to_model_range(data.images)).flatten(1, 2)
        loss = torch.empty(NUM_CLASSES, NUM_CLASSES)
        for c in range(NUM_CLASSES):
            for i in range(NUM_CLASSES):
                torch.manual_seed(i)
                loss[i, c] = car.model.loss(x[i:i + 1], torch.tensor([c]))
    acc = (loss.argmin(1) == data.labels).float().mean().item()
    assert acc > 0.3, acc
