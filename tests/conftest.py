import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def conformance_dir() -> Path:
    return Path(os.environ.get("VGEN_CONFORMANCE_DIR", REPO.parent / "shared" / "conformance"))


@pytest.fixture(scope="session")
def conf_dir():
    d = conformance_dir()
    if not (d / "meta.json").exists():
        pytest.skip(f"conformance fixtures not found at {d} (set VGEN_CONFORMANCE_DIR)")
    return d


def load_io(conf_dir, name):
    path = conf_dir / f"{name}_io.pt"
    if not path.exists():
        pytest.skip(f"{path} missing")
    return torch.load(path, weights_only=True)


@pytest.fixture
def tiny_gpt():
    """A random 2-layer GPT with an informative head (the official init zeroes it)."""
    from vgen.models import build
    torch.manual_seed(0)
    m = build("gpt", dim=64, n_layer=2, n_head=2, vocab_size=32, num_classes=4, block_size=16)
    torch.nn.init.normal_(m.output.weight, std=0.3)
    return m.eval()


@pytest.fixture
def tiny_vq():
    from vgen.models import build
    torch.manual_seed(1)
    return build("vq", codebook_size=32, codebook_embed_dim=8, encoder_ch_mult=[1, 2], decoder_ch_mult=[1, 2],
                 z_channels=32, ch=32, num_res_blocks=1).eval()


@pytest.fixture
def tiny_pipeline(tmp_path, tiny_gpt, tiny_vq):
    from vgen.pipeline import save_pipeline
    return save_pipeline(tmp_path / "tinypipe", tiny_gpt, tiny_vq, class_names=["a", "b", "c", "d"],
                         sampling={"cfg_scale": 2.0, "top_k": 8})


@pytest.fixture(scope="session")
def micro_gpt():
    """vocab 4, 2x2 grid: 256 possible images, exact distribution enumerable. The head is scaled so the
    guided joint is far from deterministic (entropy about 3.2 nats, 64 images above 1e-3) and far from the
    unguided one (TV about 0.55): distribution tests then have power."""
    from vgen.models import build
    torch.manual_seed(3)
    m = build("gpt", dim=32, n_layer=2, n_head=2, vocab_size=4, num_classes=3, block_size=4)
    torch.nn.init.normal_(m.output.weight, std=0.15)
    return m.eval()
