"""Golden outputs: the bytes every zoo model gives with its plain sampler and with each accelerated sampler, recorded
before the core was reshaped (issue 15). A refactor that changes any token or pixel fails here.

Each case: 4 samples, labels (0, 3, 7, 12), seed 0, eager, the card's settings (the speculative samplers at the
window the card named when the bytes were recorded, 4: their default, window=auto, picks widths from this machine's
measured pass costs). Hashes are sha256 of the int64
token bytes and of the PNG bytes ``vgen sample`` writes (concatenated over the 4 samples), recorded with Pillow
12.3.0 before the refactor. PNG bytes also depend on the encoder (Pillow and zlib), so the raw uint8 pixels are
pinned too (hashed after the refactor, when the PNG hashes still matched: PNG is lossless, so they are the pixels
of the recorded files); the PNG comparison runs where Pillow is the recorded version."""
import hashlib
import io

import pytest
import torch
import PIL
from PIL import Image

import vgen
from guards import needs_zoo

LABELS = [0, 3, 7, 12]

# (model, sampler, options) -> (sha256 of tokens, sha256 of PNGs)
GOLDEN = {
    ("photos-gpt", None, ()):
        ("e08695066fce7b7c7503fc52158182a1446e3eb9785767158ed264fcd83b89c1",
         "8780e4ebace17ea16ff4cbbb1138391a8892cbcd0594abf4ea94469b7051ba34"),
    ("photos-gpt", "sjd", (("window", 4),)):
        ("3c75326374728cfbda98356c051177818d44754996ab512bc9a9862d3ac36bee",
         "083cfcce3e843502b78117f97465f653cc2fa56cc7a50ae4bc8f41e83cc1b1f7"),
    ("photos-gpt", "gsd", (("window", 4),)):
        ("842d26b4f8680d2c0d9faa3e39c52a1fb313bc36c22bed6dde704efc40f235f5",
         "ac07f60da4652296c853cd2a602eebef6f63327659fbb60bec8f39877b5e8207"),
    ("photos-gpt", "lantern", (("window", 4),)):
        ("0dc369a95e5a78579e8f3bbb7f15aa0a8de0247a4c025dc8eca2888b870efa89",
         "e8eba168891fac537a49498a2168e1fba5b50e61ba0f2490de6028fe4ab5e3c2"),
    ("photos-nar", None, ()):
        ("f036a5fd293eeb26e0bfe66d42ec8bef81932636b16b303c6c6896eba874d109",
         "a524ed67edf34b00a7a173f4f915218e09b99604a1de6e44b0b2e67a847c914b"),
    ("photos-var", None, ()):
        ("bd7a5f4c32c7baac9f64dee76dde9a34b6adcae3970f4d1c293f6fa6f6d64c5b",
         "91a1086dce3ec78de91e7909917b406c1c7cfb32faa51c679983b0d8d2037d3e"),
    ("photos-var", "var", (("kv_compression", "scalekv"), ("kv_budget", 0.1))):
        ("ab0409957294655e90eac800a354f1c020a4090289df29eeb17505703a4dba73",
         "7ab4ba6a7a2cf043f0c78a04ec4eef3ecc1ab27e7dfed7cbf377cea228734492"),
}


PNG_PILLOW = "12.3.0"
PIXELS = {
    ("photos-gpt", None, ()): "f76e7743343f91614509221100d8d70174812b63a889d1763365052243d98170",
    ("photos-gpt", "sjd", (("window", 4),)): "4ea9ea2efff13a6a9e10a48b48a481c00f4fa65ea7524d468830107ce2e3f410",
    ("photos-gpt", "gsd", (("window", 4),)): "2c9cf1a81e0784230b8faecbc5f5a7e7861f5c606775418c4be3c6ff09098745",
    ("photos-gpt", "lantern", (("window", 4),)): "0cc136a56b4e8d10ba041a5d3481d499d8fb40c46f9638b34683c9251977024b",
    ("photos-nar", None, ()): "e1956b60247e77d93831df65fa295861ef9beefb083cee65b76833739a7e5a38",
    ("photos-var", None, ()): "4b0cbf9855dbb8378cfaf511a5ff026dc33820464248beb7437d101c99f6b6d7",
    ("photos-var", "var", (("kv_compression", "scalekv"), ("kv_budget", 0.1))):
        "eab37acf9687bf80d93b0000ead16b4966530139fdd3497faafce418fc6aec3f",
}

# The tables above were recorded on AVX2 hosts. On a host with AVX-512 (torch reports the CPU capability "AVX512")
# MKL and oneDNN run other kernels, whose convolutions round differently: the tokens are the same bytes, and the
# decoded pixels of these cases differ in a few values (recorded 2026-11-25 on an AMD EPYC with AVX-512; on that
# host ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 gives the AVX2 bytes above, and
# torch then reports "AVX2").
# (sha256 of the raw pixels, sha256 of the PNGs)
ISA_PIXELS = {"AVX512": {
    ("photos-gpt", None, ()): ("32616f9800c7dec6425a42c0f1347cfef841cfb3a0187d655a1462951ac7c567",
                               "fa599a8966497f6f06fd008b18c3fa034ece701058ddaca609e612eb8012ed28"),
    ("photos-nar", None, ()): ("d15bcaa92c092ea7ae042e716c31d9909704f6ee1367f8512bfda9e2d05b0063",
                               "74f46d56d699a0db0be543531731321e4ebcc21ffbbd336eefe647f0eac11471"),
    ("photos-var", None, ()): ("172a248414dc34d02edc76f9095fa835aaa06446445fc82479170e5fb10e0ec5",
                               "f77fc979a6fdc13d70716a21694256c9317726dbf67f3660333837e49ccf7e83"),
}}


def png_bytes(images: torch.Tensor) -> bytes:
    out = b""
    for img in images:
        buf = io.BytesIO()
        Image.fromarray(img.permute(1, 2, 0).contiguous().numpy()).save(buf, format="PNG")
        out += buf.getvalue()
    return out


def digest(gen) -> tuple[str, str]:
    tok = gen.tokens.to(torch.int64).contiguous().numpy().tobytes()
    return hashlib.sha256(tok).hexdigest(), hashlib.sha256(png_bytes(gen.images)).hexdigest()


@pytest.fixture(scope="module")
def pipes():
    return {}


@needs_zoo()
@pytest.mark.parametrize("case", list(GOLDEN), ids=lambda c: "-".join(str(x) for x in c[:2]) + (
    "-" + ",".join(f"{k}={v}" for k, v in c[2]) if c[2] else ""))
def test_golden_bytes(case, pipes):
    model, sampler, options = case
    if model not in pipes:
        pipes[model] = vgen.load_pipeline(model)
    gen = pipes[model].generate(LABELS, sampler=sampler, seed=0, **dict(options))
    tokens, png = digest(gen)
    assert tokens == GOLDEN[case][0]
    want_pixels, want_png = PIXELS[case], GOLDEN[case][1]
    isa = ISA_PIXELS.get(torch.backends.cpu.get_cpu_capability(), {})
    if case in isa:
        want_pixels, want_png = isa[case]
    assert hashlib.sha256(gen.images.contiguous().numpy().tobytes()).hexdigest() == want_pixels
    if PIL.__version__ == PNG_PILLOW:
        assert png == want_png


# Every sampler, draft source, acceptance rule and model order, recorded on the tree before the speculative core was
# split into scheduler x draft source x rule (issue 44): continuous batching (batch_size below the job), per-pass
# widths from given costs, every Jacobi init and coupling, the head's chain (block and token verification, LANTERN's
# and GSD's rules) and trees, video with a prompt (a prefix), NAR, and continuous tokens. Each case: labels (0, 3, 7,
# 12), seed 0, eager. (model, sampler, options, call arguments) -> (sha256 of the tokens, sha256 of the step map:
# the pass that decided each token, so a change of schedule fails too). Token ids are the same on AVX2 and AVX-512
# hosts; continuous tokens (float latents) are pinned per CPU kind (CORE_ISA).
W4 = (("window", 4),)
CORE = {
    # CORE_CASES
}
CORE_ISA = {"AVX512": {
    # CORE_ISA_CASES
}}


def core_ids(c):
    opts = ",".join(f"{k}={v}" for k, v in c[2])
    call = ",".join(f"{k}={v}" for k, v in c[3])
    return "-".join(x for x in (c[0], c[1] or "plain", opts, call) if x)


def _hash(t: torch.Tensor) -> str:
    t = t.contiguous()
    t = t.to(torch.float32) if t.is_floating_point() else t.to(torch.int64)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


@needs_zoo()
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CORE) + list(CORE_ISA["AVX512"]), ids=core_ids)
def test_core_bytes(case, pipes):
    model, sampler, options, call = case
    want = CORE.get(case) or CORE_ISA.get(torch.backends.cpu.get_cpu_capability(), {}).get(case)
    if want is None:
        pytest.skip(f"continuous tokens recorded on AVX512 hosts only; this host is "
                    f"{torch.backends.cpu.get_cpu_capability()}")
    if model not in pipes:
        pipes[model] = vgen.load_pipeline(model)
    call = dict(call)
    if "prompt" in call:  # the first frames of a test clip: frame-conditioned generation continues them
        call["prompt_frames"] = call.pop("prompt")
        call["prompt"] = vgen.data.clips("test", 1).videos[0]
    gen = pipes[model].generate(LABELS, sampler=sampler, seed=0, **call, **dict(options))
    assert (_hash(gen.tokens), _hash(gen.step_map)) == want
