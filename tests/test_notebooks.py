"""The quick-start notebook runs top to bottom (nbclient), so it never rots."""
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.slow
def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("VGEN_CACHE", str(tmp_path / "cache"))
    nb = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    for name in ("ar", "sjd", "gsd", "lantern"):
        assert f"\n{name} " in text  # its row of the race
    assert "AR's tokens at batch 1 equal the batch of 4: True" in text
    assert "continuous tokens: (1, 256, 4) torch.float32" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plots rendered


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_official_checkpoint_notebook_is_valid_and_skips_without_files(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOKS / "official_checkpoints.ipynb", as_version=4)
    nbformat.validate(nb)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "found: False False" in text and "place the official files" in text
    assert "place the official VAR files" in text and "place the official NAR files" in text
