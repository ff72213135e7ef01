import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _pin_worker() -> None:
    """Each xdist worker (and the processes it starts) runs on its own share of the cores, round robin: an in-process
    `vgen` command sizes its threads to the cores it may use (vgen.threads), and on a shared core its threads waited
    on each other while the other worker held it (a transformers CLI test: 14 s alone, 59 s beside one busy thread,
    10 s pinned to a core of its own). Fewer cores than workers: no pinning."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= count:
        os.sched_setaffinity(0, cores[int(worker[2:]) % count::count])


if os.environ.get("PYTEST_XDIST_WORKER"):  # one torch thread per worker (and its subprocesses): the workers share the cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    _pin_worker()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip on machines without a CUDA device (CI has none)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


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


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh $VGEN_CACHE (feature caches of FID / FVD references) for one test module."""
    import os
    d = tmp_path_factory.mktemp("cache")
    old = os.environ.get("VGEN_CACHE")
    os.environ["VGEN_CACHE"] = str(d)
    yield d
    if old is None:
        os.environ.pop("VGEN_CACHE")
    else:
        os.environ["VGEN_CACHE"] = old


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


@pytest.fixture
def tiny_msvq():
    from vgen.models import build
    torch.manual_seed(2)
    return build("msvq", vocab_size=32, z_channels=8, ch=32, ch_mult=[1, 2], num_res_blocks=1,
                 v_patch_nums=[1, 2, 3, 4]).eval()


@pytest.fixture
def tiny_var(tiny_msvq):
    """A random 2-block VAR over 4 scales (30 tokens) bound to tiny_msvq. The official init makes blocks nearly
    the identity (AdaLN gains 1e-5) and the head tiny: randomised so attention, and the cache, matter."""
    from vgen.models import build
    torch.manual_seed(0)
    m = build("var", vocab_size=32, Cvae=8, depth=2, embed_dim=64, num_heads=2, num_classes=4,
              patch_nums=[1, 2, 3, 4]).init_weights()
    torch.nn.init.normal_(m.head.weight, std=0.3)
    for blk in m.blocks:
        torch.nn.init.normal_(blk.ada_lin[-1].weight, std=0.1)
        torch.nn.init.normal_(blk.attn.mat_qkv.weight, std=0.3)
    return m.eval().attach_tokenizer(tiny_msvq)


@pytest.fixture
def tiny_var_pipeline(tmp_path, tiny_var, tiny_msvq):
    from vgen.pipeline import save_pipeline
    return save_pipeline(tmp_path / "tinyvar", tiny_var, tiny_msvq, model_kind="var", tokenizer_kind="msvq",
                         class_names=["a", "b", "c", "d"], sampling={"cfg": 1.5, "top_k": 8})


@pytest.fixture
def tiny_nar():
    """A random NAR (2 base blocks + 1 down-head block) over a 4x4 grid; both heads informative."""
    from vgen.models import build
    torch.manual_seed(2)
    m = build("nar", dim=64, n_layer=2, n_head=2, vocab_size=32, num_classes=4, block_size=16)
    torch.nn.init.normal_(m.output.weight, std=0.3)
    torch.nn.init.normal_(m.medusa_output.weight, std=0.3)
    return m.eval()


@pytest.fixture
def tiny_nar_pipeline(tmp_path, tiny_nar, tiny_vq):
    from vgen.pipeline import save_pipeline
    return save_pipeline(tmp_path / "tinynar", tiny_nar, tiny_vq, model_kind="nar",
                         class_names=["a", "b", "c", "d"], sampling={"cfg_scale": 2.0, "top_k": 8})


@pytest.fixture(scope="session", autouse=True)
def _short_timed_calibration():
    """window=auto's timed calibration on 4 samples per run instead of 8 (tests check what it decides and caches,
    not how well 8 samples time a zoo model; 3 paired rounds x (AR + each width) runs per calibration), and for jobs
    of any size (a test's few samples would otherwise run at the small-job width: test_small_jobs_skip_the_timing)."""
    from vgen.samplers.speculative import widths
    old = widths.TIMED_SAMPLES, widths.TIMED_JOB_RATIO
    widths.TIMED_SAMPLES, widths.TIMED_JOB_RATIO = 4, 0
    yield
    widths.TIMED_SAMPLES, widths.TIMED_JOB_RATIO = old


# Compiled steps of the test runs: inductor's on-disk caches (FX graphs, AOTAutograd graphs, built C++), keyed by the
# graph, torch's version and the options, so a hit loads the code a compile would build. Shared by both workers and
# by the processes they start, and kept between runs of this checkout (a fresh clone, as CI's, starts cold): a
# compiled test then pays dynamo's trace, not inductor's codegen and g++ (the compiled eagle step: 52 s cold, 5 s
# warm). Tests of the cache's own behaviour set their own folders.
INDUCTOR_CACHE = REPO / ".pytest_cache" / "vgen-inductor"


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory):
    """Tests never write the user's ~/.cache/vgen (measured pass costs, compiled graphs, reference features): a
    fresh $VGEN_CACHE per session, compiled graphs in :data:`INDUCTOR_CACHE` ($VGEN_CACHE_DIR)."""
    if os.environ.get("VGEN_CACHE"):
        yield
        return
    os.environ["VGEN_CACHE"] = str(tmp_path_factory.mktemp("vgen-cache"))
    own_dir = "VGEN_CACHE_DIR" in os.environ
    if not own_dir:
        os.environ["VGEN_CACHE_DIR"] = str(INDUCTOR_CACHE)
    yield
    os.environ.pop("VGEN_CACHE", None)
    if not own_dir:
        os.environ.pop("VGEN_CACHE_DIR", None)


@pytest.fixture(scope="session")
def classifier(tmp_path_factory):
    """A tiny random timm photo classifier in the zoo's file format (fast; the zoo's own is tested in test_eval)."""
    from vgen.eval.extractors import PhotoClassifier, save_photo_classifier
    torch.manual_seed(0)
    return save_photo_classifier(PhotoClassifier("test_resnet"), tmp_path_factory.mktemp("cls") / "c.safetensors")


@pytest.fixture(scope="session")
def inception(tmp_path_factory):
    """Randomly initialised weights of the standard Inception shapes (the whole Inception path, offline)."""
    from vgen.eval.extractors import random_inception_weights
    return random_inception_weights(tmp_path_factory.mktemp("inc") / "inception.safetensors")


TINY_WORDS = ("a photo of the moon cat coffee rocket dark bright close-up wide left right part in black and white "
              "warm cool mirrored").split()


def tiny_text_encoder(caption_tokens: int = 8, d_model: int = 16):
    """A word-level tokenizer over TINY_WORDS and a random one-layer T5 encoder: the FLAN-T5 path at toy size."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    from vgen.models.text import TextEncoder
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(TINY_WORDS)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.normalizer = normalizers.Lowercase()
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(5)
    enc = T5EncoderModel(T5Config(vocab_size=len(vocab), d_model=d_model, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                  dropout_rate=0.0, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1))
    return TextEncoder(tok, enc.eval(), caption_tokens)


@pytest.fixture
def tiny_t2i_pipeline(tmp_path, tiny_vq):
    """A pipeline folder with a random text-conditional GPT (8 caption positions), a tiny T5 encoder and the tiny
    VQ: every text-to-image code path at toy size."""
    from vgen.models import build
    from vgen.pipeline import save_pipeline
    text = tiny_text_encoder()
    torch.manual_seed(0)
    m = build("gpt", dim=64, n_layer=2, n_head=2, vocab_size=32, block_size=16, model_type="t2i", cls_token_num=8,
              caption_dim=16)
    torch.nn.init.normal_(m.output.weight, std=0.3)
    return save_pipeline(tmp_path / "tinyt2i", m.eval(), tiny_vq, sampling={"cfg_scale": 2.0, "top_k": 8},
                         text_encoder=text, examples=["a photo of the moon", "a dark photo of the cat"])
