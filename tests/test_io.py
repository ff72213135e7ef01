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


@pytest.mark.parametrize("where", ["just created", "while writing", "before the rename"])
def test_ctrl_c_anywhere_in_an_atomic_write_leaves_nothing(tmp_path, monkeypatch, where):
    """A KeyboardInterrupt landing right after the temporary file is created (before the writer has it: where
    ``tempfile.mkstemp`` used to leave it behind, seen once in a Ctrl-C'd sample job), while writing, or just
    before the rename: the old file stays whole, no temporary file is left, the interrupt goes on up; so does
    ``write_npz``'s."""
    import vgen.io as vio
    from vgen.eval.npz import write_npz
    target = tmp_path / "a.bin"
    atomic_write_bytes(target, b"old")
    real_open, real_replace = os.open, os.replace

    def open_then_interrupt(*a, **k):
        real_open(*a, **k)  # the file exists: the interrupt lands before its fd is back
        raise KeyboardInterrupt

    def interrupt(*a, **k):
        raise KeyboardInterrupt
    patch = {"just created": ("open", open_then_interrupt), "while writing": ("fsync", interrupt),
             "before the rename": ("replace", interrupt)}[where]
    monkeypatch.setattr(vio.os, *patch)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(target, b"new")

    def rows():  # write_npz streams: the interrupt lands between two batches of rows
        yield torch.arange(2).numpy()
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        write_npz(tmp_path / "b.npz", {"x": ((4,), "int64", rows())})
    monkeypatch.setattr(vio.os, "open", real_open)
    monkeypatch.setattr(vio.os, "replace", real_replace)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_exclusive_atomic_write_refuses_an_existing_file_and_leaves_nothing(tmp_path, monkeypatch):
    """``exclusive=True`` (the folder lock's write): the file appears whole, a second write is refused with
    FileExistsError and the first content stays; an interrupt right after the temporary file is created leaves
    nothing either."""
    import vgen.io as vio
    from vgen.jobs import FolderLock
    lock = tmp_path / "lock"
    vio.atomic_write_with(lock, lambda t: t.write_text("first"), exclusive=True)
    with pytest.raises(FileExistsError):
        vio.atomic_write_with(lock, lambda t: t.write_text("second"), exclusive=True)
    assert lock.read_text() == "first" and sorted(p.name for p in tmp_path.iterdir()) == ["lock"]
    real_open = os.open

    def open_then_interrupt(*a, **k):
        real_open(*a, **k)
        raise KeyboardInterrupt
    monkeypatch.setattr(vio.os, "open", open_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        FolderLock(tmp_path / "job").__enter__()
    monkeypatch.setattr(vio.os, "open", real_open)
    assert list((tmp_path / "job").iterdir()) == []
    with FolderLock(tmp_path / "job") as held:
        assert held.owner and [p.name for p in (tmp_path / "job").iterdir()] == [FolderLock.NAME]
    assert list((tmp_path / "job").iterdir()) == []


def test_make_grid_layout():
    imgs = torch.zeros(5, 3, 4, 4, dtype=torch.uint8)
    g = make_grid(imgs, nrow=3, pad=1)
    assert g.shape == (3, 2 * 5 + 1, 3 * 5 + 1)
    assert g[:, 0, 0].tolist() == [255, 255, 255] and g[:, 1, 1].tolist() == [0, 0, 0]
