"""Chameleon weights under vgen's samplers (vgen.models.hf.chameleon): Lumina-mGPT's layout against a fixture recorded
with the official code (Alpha-VLLM/Lumina-mGPT's logits processors and Meta's VQGAN, tests/fixtures/README.md),
Anole's layout, logits equal to the model's own forward, the lossless samplers exact, padding and the image's
opening changing nothing, and bad input refused before any forward pass."""
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from test_transformers_models import (
    adapter_logits,
    all_sequences,
    drafter_for,
    padding_changes_nothing,
    samples_follow_the_enumerated_law,
)

from vgen import sample
from vgen.errors import VGenError
from vgen.models import from_transformers
from vgen.models.hf import shapes

# transformers is imported by the tests that use it, not at collection (about 9 s, paid by each test worker)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers is not installed")
FIXTURE = Path(__file__).parent / "fixtures" / "lumina_tiny"
LUMINA = "ChameleonXLLMXForConditionalGeneration"


@pytest.fixture(scope="module")
def official():
    io = torch.load(FIXTURE / "io.pt", weights_only=True)
    import transformers
    m = transformers.ChameleonForConditionalGeneration.from_pretrained(FIXTURE / "model", dtype=torch.float32).eval()
    return m, io


def test_vqgan_decoder_reproduces_the_official_code(official, tmp_path):
    """Meta's VQGAN (as Lumina-mGPT vendors it), random weights: codes -> pixels equal the official decode, read from
    safetensors and from a vqgan.ckpt-style ``{"state_dict": ...}`` holding the encoder too; files that are not
    VQGANs, or hold pickled objects, are one-line errors."""
    from safetensors.torch import load_file

    from vgen.tokenizers.vqgan import load_vqgan
    m, io = official
    dec = load_vqgan(FIXTURE / "vqgan.safetensors")
    assert dec.codebook_size == 8192 and dec.downsample == 2
    with torch.no_grad():
        assert torch.allclose(dec.decode_codes(io["codes_cfg3"][None]), io["pixels_cfg3"], atol=1e-5)
        assert torch.allclose(dec.decode_codes(io["random_codes"]), io["pixels_random"], atol=1e-5)
    sd = dict(load_file(FIXTURE / "vqgan.safetensors"))
    sd.update({f"encoder.{k}": v for k, v in m.model.vqmodel.encoder.state_dict().items()})
    torch.save({"state_dict": sd}, tmp_path / "vqgan.ckpt")
    with torch.no_grad():
        assert torch.allclose(load_vqgan(tmp_path / "vqgan.ckpt").decode_codes(io["random_codes"]),
                              io["pixels_random"], atol=1e-5)
    torch.save({"state_dict": sd, "hparams": Path("x")}, tmp_path / "pickled.ckpt")
    with pytest.raises(VGenError, match="holds more than tensors"):
        load_vqgan(tmp_path / "pickled.ckpt")
    torch.save({"state_dict": {"encoder.conv_in.weight": torch.zeros(1)}}, tmp_path / "enc.ckpt")
    with pytest.raises(VGenError, match="is not a VQGAN: it lacks quantize.embedding.weight"):
        load_vqgan(tmp_path / "enc.ckpt")
    with pytest.raises(VGenError, match="no VQGAN file"):
        load_vqgan(tmp_path / "missing.ckpt")
    with pytest.raises(VGenError, match="codes must be in 0..8191"):
        dec.decode_codes(torch.full((1, 2, 2), 8192))


GREEDY = [("ar", {}), ("sjd", {"window": 4}), ("scd", {"window": 4}), ("gsd", {"window": 4}),
          ("lantern", {"window": 4}), ("zipar", {"window": 6}), ("pjd", {"lag": 6}), ("eagle", {"window": 3})]


@pytest.mark.parametrize("cfg", [1, 3])
@pytest.mark.parametrize("name,opts", GREEDY)
def test_lumina_greedy_equals_the_official_processors(official, name, opts, cfg):
    """Greedy codes equal Lumina-mGPT's own generation (its CFG and multimodal logits processors on transformers'
    generate, image logits unmasked as its fork does): row ends forced, the unconditional row its begin-of-image and
    size tokens. zipar at window = the grid's width keeps AR's order (smaller windows are its relaxation)."""
    m, io = official
    H, W = io["height"], io["width"]
    model = from_transformers(m, height=H, width=W, layout="lumina")
    draft = drafter_for(model) if name == "eagle" else None
    tokens, _ = sample(model, io["prompt"], name, top_k=1, cfg_scale=float(cfg), draft=draft, **opts)
    assert torch.equal(tokens.view(1, H, W), io[f"codes_cfg{cfg}"][None])


def test_lumina_pipeline_from_its_folder_decodes_as_the_official_code(official, tmp_path):
    """A Lumina-mGPT folder (its config names ChameleonXLLMXForConditionalGeneration, vqgan.safetensors beside it)
    loads as a pipeline: the card's cfg 3 and top-k 2000 filled in, greedy codes as the official code's, pixels its
    VQGAN's. A folder without the VQGAN is refused before any weights load, naming the file and its source."""
    import vgen
    m, io = official
    folder = tmp_path / "Lumina-mGPT-7B-768"
    shutil.copytree(FIXTURE / "model", folder)
    conf = json.loads((folder / "config.json").read_text())
    conf["architectures"] = [LUMINA]
    (folder / "config.json").write_text(json.dumps(conf))
    with pytest.raises(VGenError, match="has no vqgan.ckpt: .*Meta's Chameleon release"):
        vgen.load_pipeline(str(folder), height=io["height"], width=io["width"])
    shutil.copy(FIXTURE / "vqgan.safetensors", folder)
    from vgen.hf_pipeline import card
    c = card(str(folder))  # read before any weights load: the 768 release's grid, its codes and settings
    assert tuple(c.token_shape) == (48, 48) and c.token_type.vocab_size == 8192
    pipe = vgen.load_pipeline(str(folder), height=io["height"], width=io["width"], dtype="float32")
    assert pipe.model.family.name == "Lumina-mGPT" and pipe.defaults == {"cfg_scale": 3.0, "top_k": 2000}
    g = pipe.generate(input_ids=io["prompt"], sampler="sjd", window=4, top_k=1)
    assert torch.equal(g.tokens.view(1, io["height"], io["width"]), io["codes_cfg3"][None])
    ref = ((io["pixels_cfg3"].clamp(-1, 1) + 1) * 127.5).round()
    assert (g.pixels.float() - ref).abs().max() <= 1
    with pytest.raises(VGenError, match="has no processor"):
        pipe.generate(prompts=["a photo of the cat"])
    # with a tokenizer in the folder: Lumina-mGPT's request template, BOS first, the opening appended by the adapter
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["<unk>", "a", "photo", "of", "the", "cat", "Generate", "an", "image", "according", "to", "following"]
    tk = Tokenizer(models.WordLevel({**{w: 20 + i for i, w in enumerate(words)}, "<reserved08706>": 8710},
                                    unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(["<reserved08706>"])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>").save_pretrained(folder)
    pipe = vgen.load_pipeline(str(folder), height=io["height"], width=io["width"])
    ids = pipe.tokenize("a photo of the cat")
    text = f"Generate an image of {io['width'] * 16}x{io['height'] * 16} according to the following prompt:\n" \
           "a photo of the cat<reserved08706>"
    assert ids.tolist() == [0] + pipe.processor(text, add_special_tokens=False).input_ids
    assert ids[-6:].tolist() == [21, 22, 23, 24, 25, 8710]  # the prompt's words, then the turn separator
    g = pipe.generate(prompts=["a photo of the cat"], sampler="ar", top_k=1)
    ref, _ = sample(pipe.model, ids[None], "ar", top_k=1, cfg_scale=3.0)
    assert torch.equal(g.tokens, ref)


def chameleon_reference_logits(m, prompt, codes, layout, w, opening):
    """Teacher forcing through transformers' own modules on the official layout (prompt, the image's opening, codes
    with Lumina's row end after each row): the image-token logits in code order at the position before each code."""
    vm = m.model.vocabulary_mapping
    ids = torch.tensor([vm.img2bpe[k] for k in range(len(vm.image_tokens))])
    b, n = codes.shape
    rows = ids[codes].view(b, n // w, w)
    if layout == "lumina":
        rows = torch.cat([rows, rows.new_full((b, n // w, 1), 5)], -1)
    seq = torch.cat([prompt, torch.tensor([opening]).expand(b, -1), rows.flatten(1)], 1)
    logits = m.lm_head(m.model(input_ids=seq).last_hidden_state)
    P = prompt.shape[1] + len(opening)
    step = w + 1 if layout == "lumina" else w
    before = torch.tensor([P - 1 + (i // w) * step + i % w for i in range(n)])
    return logits[:, before][..., ids].float()


OPENING = {"lumina": (3, 7, 8), "anole": (3,)}  # the tiny vocabulary's: begin of image, size tokens 2 and 3


@pytest.mark.parametrize("layout", ["lumina", "anole"])
@pytest.mark.parametrize("chunk", [1, 5, 7])
def test_chameleon_logits_equal_its_own_forward(layout, chunk):
    """Windows of every width, crossing Lumina's row ends: the adapter's logits are the model's own (image tokens
    unmasked, 16 codes whose ids are not in code order)."""
    m = shapes.chameleon(codes=16, std=0.2)
    model = from_transformers(m, height=4, width=6, layout=layout)
    prompt = torch.tensor([[0, 20, 21, 22], [0, 23, 24, 25]])
    codes = torch.randint(0, 16, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = chameleon_reference_logits(m, prompt, codes, layout, 6, OPENING[layout])
        got = adapter_logits(model, prompt, codes, chunk)
    assert torch.allclose(got, ref, atol=1e-5)


def test_chameleon_null_prompts_follow_the_official_code():
    """Lumina-mGPT's unconditional row: the image's opening alone. Anole's (Chameleon's image-conditioned stream): BOS,
    begin / end of image and image tokens of the prompt, in order. A negative prompt gets the opening appended."""
    m = shapes.chameleon(codes=16)
    lum = from_transformers(m, height=4, width=6, layout="lumina")
    view, cond = lum.prepare(torch.tensor([[0, 20, 21], [-1, 0, 22]]))
    assert cond[:, -3:].tolist() == [[3, 7, 8]] * 2
    assert lum.null_cond(cond).tolist() == [[-1, -1, -1, 3, 7, 8]] * 2
    ano = from_transformers(m, height=2, width=2)  # no architectures: Anole
    view, cond = ano.prepare(torch.tensor([[0, 20, 41, 21], [-1, 0, 22, 3]]))
    assert cond.tolist() == [[0, 20, 41, 21, 3], [-1, -1, 0, 22, 3]]
    assert ano.null_cond(cond).tolist() == [[-1, -1, 0, 41, 3], [-1, -1, -1, 0, 3]]
    neg = from_transformers(m, height=2, width=2, layout="lumina", negative_prompt_ids=[0, 30])
    view, cond = neg.prepare(torch.tensor([[0, 20]]))
    assert neg.null_cond(cond).tolist() == [[0, 30, 3, 6, 6]]


@pytest.mark.parametrize("layout", ["lumina", "anole"])
def test_padding_and_the_opening_change_nothing(layout):
    """A prompt alone without the image's opening, and left-padded beside a longer prompt that has it: the same codes
    (sjd) and logits."""
    model = from_transformers(shapes.chameleon(codes=16, std=0.2), height=2, width=4, layout=layout)
    padding_changes_nothing(model, [0, 20, 21], [0, 22, 23, 24, 25, *OPENING[layout]], "sjd", chunk=3)


def test_scd_reproduces_ar_gumbel_on_lumina():
    model = from_transformers(shapes.chameleon(codes=16, std=0.2), height=4, width=4, layout="lumina")
    prompt = torch.tensor([[0, 20, 21], [0, 22, 23]]).repeat(3, 1)
    a, _ = sample(model, prompt, "ar", seed=4, draw="gumbel", cfg_scale=2.0, top_k=8)
    b, st = sample(model, prompt, "scd", seed=4, window=4, cfg_scale=2.0, top_k=8)
    assert torch.equal(a, b) and st["accepted_per_step"] >= 1.0


LOSSLESS = [("lumina", "ar", {}), ("lumina", "sjd", {"window": 3}), ("lumina", "scd", {"window": 3}),
            ("anole", "sjd", {"window": 3})]


@pytest.mark.slow
@pytest.mark.parametrize("layout,name,opts", LOSSLESS)
def test_lossless_samplers_are_exact(layout, name, opts):
    """Every 2 x 2 image over 3 codes enumerated from the model's own teacher-forced logits (Lumina: a row end after
    each row of 2); 10,000 samples match it (chi-square) and reject the unguided law and one a fifth of the way to
    it (power)."""
    V = 3
    seqs = all_sequences(V, 4)
    m = shapes.chameleon(codes=V, std=0.3)
    model = from_transformers(m, height=2, width=2, layout=layout)
    prompt = torch.tensor([[0, 20, 21]])
    opening = (3, 6, 6) if layout == "lumina" else (3,)
    uncond = torch.zeros(1, 0, dtype=torch.long) if layout == "lumina" else torch.tensor([[0]])  # before the opening
    view, cond = model.prepare(prompt)
    null = view.null_cond(cond)
    assert null[0, null[0] >= 0].tolist() == uncond[0].tolist() + list(opening)
    with torch.no_grad():
        ref = [chameleon_reference_logits(m, p.expand(len(seqs), -1), seqs, layout, 2, opening)
               for p in (prompt, uncond)]
    samples_follow_the_enumerated_law(model, prompt, ref, seqs, name, opts, V=V, N=10_000)


def test_bad_chameleon_input_is_refused_before_generation(official):
    m = shapes.chameleon(codes=16)
    with pytest.raises(VGenError, match="give height= and width="):
        from_transformers(m, layout="lumina")
    with pytest.raises(VGenError, match="units of 2 tokens"):
        from_transformers(m, height=3, width=4, layout="lumina")
    with pytest.raises(VGenError, match=r"no <reserved08810> \(height token\)"):
        from_transformers(m, height=20, width=4, layout="lumina")
    with pytest.raises(VGenError, match="layout must be one of lumina, anole"):
        from_transformers(m, layout="emu3")
    model = from_transformers(m, height=2, width=2)
    with pytest.raises(VGenError, match="has no VQ decoder: pass vqgan="):
        model.decode_image(torch.zeros(1, 2, 2, dtype=torch.long))
    from vgen.tokenizers.vqgan import load_vqgan
    with pytest.raises(VGenError, match="the VQGAN has 8192 codes, the model 16"):
        from_transformers(m, height=2, width=2, vqgan=load_vqgan(FIXTURE / "vqgan.safetensors")).decode_image(
            torch.zeros(1, 2, 2, dtype=torch.long))
    with pytest.raises(VGenError, match="vqgan= takes the decoder module"):
        from_transformers(m, height=2, width=2, vqgan=str(FIXTURE / "vqgan.safetensors"))
