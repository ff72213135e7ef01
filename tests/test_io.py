import os

import pytest
import torch

from vgen.io import atomic_write_bytes, make_grid


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "a.bin"
    atomic_write_bytes(target, b"old")

    def boom(fd):
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_make_grid_layout():
    imgs = torch.zeros(5, 3, 4, 4, dtype=torch.uint8)
    g = make_grid(imgs, nrow=3, pad=1)
    assert g.shape == (3, 2 * 5 + 1, 3 * 5 + 1)
    assert g[:, 0, 0].tolist() == [255, 255, 255] and g[:, 1, 1].tolist() == [0, 0, 0]
