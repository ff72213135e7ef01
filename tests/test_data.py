import torch

from vgen.data import CLASS_NAMES, NUM_CLASSES, load_photographs, photos
from vgen.data.photos import TEST_FRACTION


def test_photos_shapes_classes_and_determinism():
    assert NUM_CLASSES == len(CLASS_NAMES) >= 12
    p = photos("train", 40, seed=3)
    assert p.images.shape == (40, 3, 64, 64) and p.images.dtype == torch.uint8
    assert p.labels.tolist() == [i % NUM_CLASSES for i in range(40)]
    q = photos("train", 40, seed=3)
    assert torch.equal(p.images, q.images)
    assert not torch.equal(p.images, photos("train", 40, seed=4).images)
    assert all(img.ndim == 3 and img.shape[2] == 3 for img in load_photographs())


def test_test_split_never_overlaps_training_regions():
    """Every test crop is a resized window of the right-most strip; no training crop can touch it."""
    import numpy as np

    from vgen.data.photos import region
    for img in load_photographs():
        tr, te = region(img, "train"), region(img, "test")
        assert tr.shape[1] + te.shape[1] == img.shape[1]
        assert abs(te.shape[1] / img.shape[1] - TEST_FRACTION) < 0.01
        assert np.shares_memory(tr, img) and tr.base is not None


def test_grey_photos_become_three_equal_channels():
    p = photos("test", NUM_CLASSES, seed=0)
    grey = CLASS_NAMES.index("brick")
    img = p.images[grey].int()
    assert torch.equal(img[0], img[1]) and torch.equal(img[1], img[2])
