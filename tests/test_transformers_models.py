"""transformers' image generators (Janus, Emu3) under vgen's samplers (vgen.models.hf): logits equal the model's own
forward, greedy tokens equal transformers' generate(), the lossless samplers are exact (enumerated), SCD reproduces
ar draw=gumbel, padding changes nothing, and bad input is refused before any forward pass."""
import importlib.util

import numpy as np
import pytest
import torch
from exact import chi2_p, counts_of, toward

from vgen import sample
from vgen.errors import VGenError
from vgen.kernels.sampling import filter_probs
from vgen.models import from_transformers
from vgen.models.hf import shapes

# transformers is imported by the tests that use it, not at collection (about 9 s, paid by each test worker)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers is not installed")


def janus(**kw):
    return shapes.janus(**kw)


def emu3(**kw):
    return shapes.emu3(**kw)


def janus_reference_logits(m, prompt, codes):
    """Teacher forcing through transformers' own modules: logits (B, L, V) of each code given the prompt and the
    codes before it (the generation head over the language model's last hidden states)."""
    inner = m.model
    x = torch.cat([inner.language_model.get_input_embeddings()(prompt),
                   inner.generation_aligner(inner.generation_embeddings(codes[:, :-1]))], 1)
    h = inner.language_model(inputs_embeds=x).last_hidden_state
    return inner.generation_head(h[:, prompt.shape[1] - 1:]).float()


def emu3_sequence(codes, w, text=40, row_end=3):
    b, n = codes.shape
    rows = (codes + text).view(b, n // w, w)
    return torch.cat([rows, rows.new_full((b, n // w, 1), row_end)], -1).flatten(1)


def emu3_reference_logits(m, prompt, codes, w, text=40, n_codes=8):
    """Teacher forcing on Emu3's own layout (row ends included) through its forward: the visual-token logits (B, L, V)
    at the position before each code."""
    seq = torch.cat([prompt, emu3_sequence(codes, w, text)], 1)
    logits = m(input_ids=seq).logits
    P, L = prompt.shape[1], codes.shape[1]
    before = torch.tensor([P - 1 + i + i // w for i in range(L)])
    return logits[:, before, text: text + n_codes].float()


def adapter_logits(model, prompt, codes, chunk):
    """The adapter's logits for every code, fed ``chunk`` codes per decode call (windows crossing row ends)."""
    view, cond = model.prepare(prompt)
    cache = view.new_cache(cond.shape[0])
    out = [view.prefill(cond, cache)[:, None]]
    L = codes.shape[1]
    for s in range(0, L - 1, chunk):
        e = min(L - 1, s + chunk)
        pos = torch.arange(view.cond_len + s, view.cond_len + e)
        out.append(view.decode(codes[:, s:e], pos, cache))
    return torch.cat(out, 1)


PROMPTS = torch.tensor([[0, 9, 11, 13, 3], [0, 17, 12, 5, 3]])


@pytest.mark.parametrize("chunk", [1, 3, 15])
def test_janus_logits_equal_its_own_forward(chunk):
    m = janus(codes=8, grid=(4, 4))
    codes = torch.randint(0, 8, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = janus_reference_logits(m, PROMPTS, codes)
        got = adapter_logits(from_transformers(m), PROMPTS, codes, chunk)
    assert torch.allclose(got, ref, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 7, 11])
def test_emu3_logits_equal_its_own_forward_with_row_ends(chunk):
    """Windows of every width, crossing row ends anywhere: the forced row end is fed in the pass of its row's last
    code and the logits after it are the next row's first code's."""
    m = emu3(codes=8)
    codes = torch.randint(0, 8, (2, 12), generator=torch.Generator().manual_seed(1))
    prompt = torch.tensor([[0, 10, 11, 12, 7, 9, 6], [0, 13, 14, 15, 7, 9, 6]])
    with torch.no_grad():
        ref = emu3_reference_logits(m, prompt, codes, w=4)
        got = adapter_logits(from_transformers(m, height=3, width=4), prompt, codes, chunk)
    assert torch.allclose(got, ref, atol=1e-5)


SAMPLERS = [("ar", {}), ("sjd", {"window": 4}), ("scd", {"window": 4}), ("gsd", {"window": 4}),
            ("lantern", {"window": 4}), ("zipar", {}), ("pjd", {"lag": 4})]  # pjd at lag = the width: exact


@pytest.mark.parametrize("name,opts", SAMPLERS)
def test_janus_greedy_equals_generate(name, opts):
    """Greedy (top_k=1) with guidance 3: every sampler gives transformers' generate(generation_mode="image") tokens,
    for a batch of two prompts."""
    m = janus(codes=16, grid=(4, 4), std=0.2)
    ref = m.generate(PROMPTS, attention_mask=torch.ones_like(PROMPTS), generation_mode="image", do_sample=False,
                     guidance_scale=3.0)
    tokens, _ = sample(from_transformers(m), PROMPTS, name, top_k=1, cfg_scale=3.0, **opts)
    assert torch.equal(tokens, ref)


@pytest.mark.parametrize("name,opts", SAMPLERS)
@pytest.mark.parametrize("guided", [False, True])
def test_emu3_greedy_equals_generate(name, opts, guided):
    """Greedy with the row ends forced by prefix_allowed_tokens_fn, without CFG and with a negative prompt (which
    transformers runs as a second, unbatched forward and vgen as batched rows)."""
    m = emu3(codes=16, std=0.2)
    H, W = 3, 4
    prompt = torch.tensor([[0, 10, 11, 12, 7, 9, 6]])
    neg = torch.tensor([[0, 13, 7, 9, 6]])
    kw = dict(guidance_scale=3.0, negative_prompt_ids=neg) if guided else {}
    out = m.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=(W + 1) * H + 3,
                     prefix_allowed_tokens_fn=shapes.emu3_allowed(H, W, prompt.shape[1], list(range(40, 56))), **kw)
    grid = out[:, prompt.shape[1]: prompt.shape[1] + (W + 1) * H].view(1, H, W + 1)
    assert (grid[:, :, W] == 3).all() and out[0, -3:].tolist() == [4, 5, 2]
    model = from_transformers(m, height=H, width=W, negative_prompt_ids=neg if guided else None)
    tokens, _ = sample(model, prompt, name, top_k=1, cfg_scale=3.0 if guided else 1.0, **opts)
    assert torch.equal(tokens, grid[:, :, :W].flatten(1) - 40)


def drafter_for(model, arch="block", seed=0):
    """An untrained draft head of ``arch`` for ``model`` (its drafts are poor, never wrong: the rule keeps AR's law)."""
    from vgen.models.drafter import Drafter
    torch.manual_seed(seed)
    return Drafter(model.config, arch).eval()


@pytest.mark.parametrize("arch,window", [("block", 2), ("block", 5), ("mlp", 4)])
def test_eagle_greedy_equals_generate(arch, window):
    """eagle (a draft head on the decoder's hidden states, chains across Emu3's forced row ends) gives transformers'
    own greedy tokens: Janus with guidance, Emu3 with a negative prompt, a left-padded batch."""
    m = janus(codes=16, grid=(4, 4), std=0.2)
    ref = m.generate(PROMPTS, attention_mask=torch.ones_like(PROMPTS), generation_mode="image", do_sample=False,
                     guidance_scale=3.0)
    model = from_transformers(m)
    tokens, st = sample(model, PROMPTS, "eagle", draft=drafter_for(model, arch), top_k=1, cfg_scale=3.0,
                        window=window)
    assert torch.equal(tokens, ref) and st["accepted_per_step"] >= 1.0
    e = emu3(codes=16, std=0.2)
    H, W = 3, 4
    prompt = torch.tensor([[0, 10, 11, 12, 7, 9, 6]])
    neg = torch.tensor([[0, 13, 7, 9, 6]])
    out = e.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=(W + 1) * H + 3,
                     prefix_allowed_tokens_fn=shapes.emu3_allowed(H, W, prompt.shape[1], list(range(40, 56))),
                     guidance_scale=3.0, negative_prompt_ids=neg)
    grid = out[:, prompt.shape[1]: prompt.shape[1] + (W + 1) * H].view(1, H, W + 1)[:, :, :W].flatten(1) - 40
    model = from_transformers(e, height=H, width=W, negative_prompt_ids=neg)
    padded = torch.tensor([[0, 10, 11, 12, 7, 9, 6], [-1, -1, -1, 0, 14, 9, 6]])
    tokens, _ = sample(model, padded, "eagle", draft=drafter_for(model, arch), top_k=1, cfg_scale=3.0, window=window)
    alone, _ = sample(model, padded[1:, 3:], "ar", top_k=1, cfg_scale=3.0)
    assert torch.equal(tokens[:1], grid) and torch.equal(tokens[1:], alone)


@pytest.mark.parametrize("tree,children,least", [("3,3,3", "top", 2.5), ("2,1", "sample", 1.0)])
def test_eagle_trees_greedy_equal_generate(tree, children, least):
    """eagle's static trees on both families (3 codes): every node at a scratch slot of its own (Emu3: with the row
    end its position forces, readable only by its descendants), the accepted path moved into place: transformers'
    greedy tokens, a left-padded batch as each prompt alone. A full tree of every code (3,3,3 with children=top)
    holds the greedy path at every depth: each pass keeps the whole depth, across row ends."""
    m = janus(codes=3, grid=(4, 4), std=0.2)
    ref = m.generate(PROMPTS, attention_mask=torch.ones_like(PROMPTS), generation_mode="image", do_sample=False,
                     guidance_scale=3.0)
    model = from_transformers(m)
    tokens, st = sample(model, PROMPTS, "eagle", draft=drafter_for(model), top_k=1, cfg_scale=3.0, tree=tree,
                        children=children, window=2)  # a fixed window: the tree on every pass
    assert torch.equal(tokens, ref) and st["accepted_per_step"] >= least
    e = emu3(codes=3, std=0.2)
    H, W = 3, 4
    prompt = torch.tensor([[0, 10, 11, 12, 7, 9, 6]])
    neg = torch.tensor([[0, 13, 7, 9, 6]])
    out = e.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=(W + 1) * H + 3,
                     prefix_allowed_tokens_fn=shapes.emu3_allowed(H, W, prompt.shape[1], [40, 41, 42]),
                     guidance_scale=3.0, negative_prompt_ids=neg)
    grid = out[:, prompt.shape[1]: prompt.shape[1] + (W + 1) * H].view(1, H, W + 1)[:, :, :W].flatten(1) - 40
    model = from_transformers(e, height=H, width=W, negative_prompt_ids=neg)
    padded = torch.tensor([[0, 10, 11, 12, 7, 9, 6], [-1, -1, -1, 0, 14, 9, 6]])
    tokens, st = sample(model, padded, "eagle", draft=drafter_for(model), top_k=1, cfg_scale=3.0, tree=tree,
                        children=children, window=2)  # a fixed window: the tree on every pass
    alone, _ = sample(model, padded[1:, 3:], "ar", top_k=1, cfg_scale=3.0)
    assert torch.equal(tokens[:1], grid) and torch.equal(tokens[1:], alone) and st["accepted_per_step"] >= least
    if children == "top":
        with pytest.raises(VGenError, match="children=top needs distinct codes"):
            sample(model, prompt, "eagle", draft=drafter_for(model), tree="4,1", children="top")


@pytest.mark.parametrize("family", ["janus", "emu3"])
def test_teacher_features_are_what_the_logits_come_from(family):
    """What a drafter trains on: the adapter's teacher-forced hidden states give, through its head, the model's own
    teacher-forced logits (Emu3: row ends in its layout, the state after each row end where one follows)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if family == "janus":
            m = janus(codes=16, grid=(4, 4), std=0.2)
            model, prompt = from_transformers(m), PROMPTS
            codes = torch.randint(0, 16, (2, 16), generator=g)
            ref = janus_reference_logits(m, prompt, codes)
        else:
            m = emu3(codes=8, std=0.2)
            model, prompt = from_transformers(m, height=3, width=4), torch.tensor([[0, 10, 11, 12, 7, 9, 6]] * 2)
            codes = torch.randint(0, 8, (2, 12), generator=g)
            ref = emu3_reference_logits(m, prompt, codes, w=4)
        view, cond = model.prepare(prompt)
        feats = view.teacher_features(codes, cond)
        assert feats.shape == (2, codes.shape[1], model.config.dim)
        assert torch.allclose(view.head(feats), ref, atol=1e-5)
        with pytest.raises(VGenError, match="teacher_features takes codes"):
            view.teacher_features(codes[:, :-1], cond)


def test_emu3_logit_cfg_equals_transformers_log_softmax_cfg():
    """vgen mixes logits (u + s (c - u)) over the visual tokens; transformers mixes log-softmaxes over the whole
    vocabulary then masks to visual tokens: the same distribution (they differ by a constant per row)."""
    g = torch.Generator().manual_seed(0)
    c, u = torch.randn(4, 60, generator=g) * 3, torch.randn(4, 60, generator=g) * 3
    vis = slice(40, 56)
    s = 3.0
    hf = s * (c.log_softmax(-1) - u.log_softmax(-1)) + u.log_softmax(-1)
    ours = u[:, vis] + s * (c[:, vis] - u[:, vis])
    assert torch.allclose(hf[:, vis].softmax(-1), ours.softmax(-1), atol=1e-6)
    for k in (1, 5):
        assert torch.allclose(filter_probs(hf[:, vis], top_k=k, temperature=0.7),
                              filter_probs(ours, top_k=k, temperature=0.7), atol=1e-6)


def enumerated(ref_logits, seqs, cfg, **opts):
    """P(x) of every code sequence under the target (CFG-mixed, filtered) from teacher-forced logits."""
    lc, lu = ref_logits
    p = filter_probs(lu + cfg * (lc - lu), **opts)
    return p.gather(-1, seqs[..., None]).squeeze(-1).prod(-1).double().numpy()


def all_sequences(V, L):
    import itertools
    return torch.tensor(list(itertools.product(range(V), repeat=L)))


LOSSLESS = [(f, n, o) for f in ("janus", "emu3") for n, o in [("ar", {}), ("sjd", {"window": 3}),
                                                               ("scd", {"window": 3}), ("eagle", {"window": 3})]]
LOSSLESS.append(("emu3", "eagle", {"tree": "2,1", "window": 2}))  # a tree across row ends (Emu3's 2 x 2 grid)


@pytest.mark.slow
@pytest.mark.parametrize("family,name,opts", LOSSLESS)
def test_lossless_samplers_are_exact(family, name, opts):
    """Every 2 x 2 image over 3 codes enumerated from the model's own teacher-forced logits (transformers' modules,
    no adapter); 10,000 samples (Janus: 20,000, its guided and unguided laws lie closer) match it (chi-square) and
    reject the unguided law and one a fifth of the way to it (power). eagle's tree on Emu3
    (2 codes per row: its nodes cross row ends)."""
    V = 3
    seqs = all_sequences(V, 4)
    with torch.no_grad():
        if family == "janus":
            m = janus(codes=V, grid=(2, 2), std=0.3)
            model = from_transformers(m)
            prompt = torch.tensor([[0, 9, 11, 3]])
            null = model.null_cond(prompt)
            ref = [janus_reference_logits(m, p.expand(len(seqs), -1), seqs) for p in (prompt, null)]
        else:
            m = emu3(codes=V, std=0.3)
            model = from_transformers(m, height=2, width=2)
            prompt = torch.tensor([[0, 10, 11, 7, 9, 6]])
            ref = [emu3_reference_logits(m, p.expand(len(seqs), -1), seqs, w=2, n_codes=V)
                   for p in (prompt, prompt[:, -1:])]
    draft = drafter_for(model) if name == "eagle" else None
    samples_follow_the_enumerated_law(model, prompt, ref, seqs, name, dict(opts, draft=draft),
                                      N=20_000 if family == "janus" else 10_000)


def samples_follow_the_enumerated_law(model, prompt, ref, seqs, name, opts, V=3, N=20_000):
    """``N`` samples at cfg 1.5, top-k 2, temperature 0.9 match the law enumerated from the teacher-forced logits
    ``ref`` (chi-square), reject the unguided law and one a fifth of the way to it (power) and never hit an
    impossible sequence."""
    joint = enumerated(ref, seqs, 1.5, top_k=2, temperature=0.9)
    wrong = enumerated(ref, seqs, 1.0, top_k=2, temperature=0.9)
    tokens, st = sample(model, prompt.expand(N, -1), name, seed=1, batch_size=5_000, cfg_scale=1.5, top_k=2,
                        temperature=0.9, **opts)
    counts = counts_of(tokens, V)
    assert chi2_p(counts, joint) > 1e-3
    assert chi2_p(counts, wrong) < 1e-6 and chi2_p(counts, toward(joint, wrong, 0.2)) < 1e-6
    assert counts[joint == 0].sum() == 0
    if name != "ar":
        assert st["accepted_per_step"] > 1.0


@pytest.mark.parametrize("family", ["janus", "emu3"])
def test_scd_reproduces_ar_gumbel(family):
    m = janus(codes=16, grid=(4, 4), std=0.2) if family == "janus" else emu3(codes=16, std=0.2)
    model = from_transformers(m) if family == "janus" else from_transformers(m, height=4, width=4)
    prompt = PROMPTS if family == "janus" else torch.tensor([[0, 10, 11, 7, 9, 6], [0, 12, 13, 7, 9, 6]])
    a, _ = sample(model, prompt.repeat(3, 1), "ar", seed=4, draw="gumbel", cfg_scale=2.0, top_k=8)
    b, st = sample(model, prompt.repeat(3, 1), "scd", seed=4, window=4, cfg_scale=2.0, top_k=8)
    assert torch.equal(a, b)
    assert st["accepted_per_step"] >= 1.0


@pytest.mark.parametrize("family", ["janus", "emu3"])
@pytest.mark.parametrize("name", ["ar", "sjd"])
def test_left_padding_changes_nothing(family, name):
    """A prompt alone, and left-padded with -1 in a batch beside a longer prompt: the same logits and tokens."""
    if family == "janus":
        model = from_transformers(janus(codes=16, grid=(4, 4), std=0.2))
        short, long_ = [0, 9, 11, 3], [0, 17, 12, 5, 8, 3]
    else:
        model = from_transformers(emu3(codes=16, std=0.2), height=3, width=4)
        short, long_ = [0, 10, 7, 9, 6], [0, 12, 13, 14, 7, 9, 6]
    padding_changes_nothing(model, short, long_, name, chunk=5)


def padding_changes_nothing(model, short, long_, name, chunk):
    """``short`` alone and left-padded in a batch beside ``long_``: the same tokens (seeds per sample) and logits."""
    kw = dict(window=3) if name == "sjd" else {}
    alone, _ = sample(model, torch.tensor([short]), name, seed=7, cfg_scale=2.0, top_k=8, **kw)
    batch = torch.tensor([long_, [-1] * (len(long_) - len(short)) + short])
    both, _ = sample(model, batch, name, seed=6, cfg_scale=2.0, top_k=8, **kw)  # row 1 gets seed 7
    assert torch.equal(both[1], alone[0])
    codes = torch.randint(0, model.vocab_size, (1, model.seq_len), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        la = adapter_logits(model, torch.tensor([short]), codes, chunk)
        lb = adapter_logits(model, batch, codes.expand(2, -1), chunk)[1:]
    assert torch.allclose(la, lb, atol=1e-5)


def test_bad_input_is_refused_before_generation():
    from transformers import LlamaConfig, LlamaForCausalLM
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2))
    with pytest.raises(VGenError, match="not an image generator"):
        from_transformers(llama)
    e = emu3()
    with pytest.raises(VGenError, match="give height= and width="):
        from_transformers(e)
    j = from_transformers(janus(grid=(2, 2)))
    with pytest.raises(VGenError, match="fixed 2 x 2 token grid"):
        from_transformers(janus(grid=(2, 2)), height=3, width=3)
    with pytest.raises(VGenError, match="padding must be on the left"):
        sample(j, torch.tensor([[0, 5, -1]]))
    with pytest.raises(VGenError, match="prompt ids must be in"):
        sample(j, torch.tensor([[0, 5, 999]]))
    with pytest.raises(VGenError, match="int64 tensor"):
        sample(j, torch.rand(1, 4))
    small = from_transformers(emu3(), height=2, width=2)
    small.family.max_positions = 12
    with pytest.raises(VGenError, match="exceeds Emu3's context of 12"):
        sample(small, torch.tensor([[0] * 8]))
    with pytest.raises(VGenError, match="needs a draft head"):
        sample(j, torch.tensor([[0, 5, 3]]), "eagle")


def test_decode_image_uses_the_models_own_vq():
    m = janus(codes=8, grid=(2, 2))
    px = from_transformers(m).decode_image(torch.tensor([[[1, 2], [3, 4]]]))
    ref = m.model.vqmodel.decode(torch.tensor([[1, 2, 3, 4]])).clamp(-1, 1)
    assert px.shape[:2] == (1, 3) and torch.equal(px, ref)
    e = emu3(codes=8)
    px = from_transformers(e, height=2, width=2).decode_image(torch.tensor([[[1, 2], [3, 4]]]))
    seq = torch.tensor([[41, 42, 3, 43, 44, 3, 0, 0, 0]])
    assert torch.equal(px, e.model.decode_image_tokens(seq, height=2, width=2).clamp(-1, 1))
    assert np.isfinite(px.numpy()).all()


def test_pipeline_from_a_save_pretrained_folder(tmp_path, monkeypatch):
    """A save_pretrained folder loads as a pipeline (from_pretrained, no network), samples from prompt ids with any
    sampler and decodes through the model's VQ; prompts without a processor, an uncached hub repository and a
    non-generator model are one-line errors; a cached hf:// repository resolves to its snapshot."""
    import vgen
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    m = janus(codes=8, grid=(2, 2))
    m.save_pretrained(tmp_path / "janus")
    pipe = vgen.load_pipeline(str(tmp_path / "janus"))
    ids = torch.tensor([[0, 9, 11, 3], [-1, 0, 12, 3]])
    g = pipe.generate(input_ids=ids, sampler="sjd", seed=3, window=3)
    assert g.pixels.dtype == torch.uint8 and g.pixels.shape[:2] == (2, 3) and g.tokens.shape == (2, 4)
    ref, _ = sample(from_transformers(m), ids, "sjd", seed=3, window=3, cfg_scale=5.0)
    assert torch.equal(g.tokens, ref)  # the card's cfg 5 filled in
    with pytest.raises(VGenError, match="has no processor"):
        pipe.generate(prompts=["a photo of the cat"])
    with pytest.raises(VGenError, match="nobody/no-such-model-here"):
        vgen.load_pipeline("hf://nobody/no-such-model-here")
    from vgen.hf_pipeline import transformers_folder
    monkeypatch.setattr("vgen.hub.hub_folder", lambda repo, sub="", local_only=False: tmp_path / "janus")
    assert transformers_folder("hf://deepseek-community/Janus-Pro-1B") == tmp_path / "janus"
    from transformers import LlamaConfig, LlamaForCausalLM
    LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2)).save_pretrained(tmp_path / "llama")
    with pytest.raises(VGenError, match="holds a 'llama' model"):
        vgen.load_pipeline(str(tmp_path / "llama"))


def test_warm_start_maps_llamagen_rope_pairs_to_transformers_halves():
    """LlamaGen rotates interleaved channel pairs (2i, 2i+1); transformers rotates halves (i, i + d/2): the recipe's
    row permutation of q / k makes the two rotations agree for the same angles."""
    from transformers.models.emu3.modeling_emu3 import rotate_half

    from vgen.models.gpt import apply_rope
    heads, hd, dim = 2, 8, 16
    g = torch.Generator().manual_seed(0)
    wq, x = torch.randn(heads * hd, dim, generator=g), torch.randn(3, dim, generator=g)
    ang = torch.rand(3, hd // 2, generator=g) * 6
    rope = torch.stack([ang.cos(), ang.sin()], -1)  # (S, d/2, 2)
    ours = apply_rope((x @ wq.T).view(1, 3, heads, hd), rope)[0]  # (S, H, d) interleaved
    perm = wq.view(heads, hd // 2, 2, dim).transpose(1, 2).reshape(heads * hd, dim)  # as vgen.train.emu3.warm_start
    q = (x @ perm.T).view(3, heads, hd)
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    theirs = q * cos + rotate_half(q) * sin
    back = ours.view(3, heads, hd // 2, 2).transpose(2, 3).reshape(3, heads, hd)
    assert torch.allclose(theirs, back, atol=1e-5)


@pytest.mark.slow
def test_emu3_recipe_runs_exports_and_loads(tmp_path):
    """recipe=emu3 at toy size on photos-t2i's VQ and captions: save_pretrained folder, caption tokenizer, card; the
    folder loads as a pipeline that samples from prompts with any sampler; training sequences follow Emu3's layout."""
    from transformers import AutoTokenizer

    from vgen.hf_pipeline import load_zoo
    from vgen.models.hf.emu3_zoo import N_SPECIAL, Layout, vocabulary
    from vgen.train.emu3 import Emu3TrainConfig, train_emu3
    cfg = Emu3TrainConfig(out=str(tmp_path / "e"), steps=2, batch_size=2, n_train=8, n_test=4, save_every=1,
                          warm_start=False, model=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                       num_attention_heads=2, num_key_value_heads=2))
    m = train_emu3(cfg)
    assert m["steps"] == 2 and m["warm_start_tensors"] == 0
    folder = tmp_path / "e" / "pipeline"
    pipe = load_zoo(folder)
    g = pipe.generate(prompts=["a photo of the cat", "a dark photo of the moon"], sampler="sjd", seed=0, window=3)
    assert g.pixels.shape == (2, 3, 64, 64) and g.tokens.shape == (2, 256)
    from vgen.eval.hf_speed import generate_emu3  # transformers' own sampling of the same pipeline (the bench's row)
    ids = pipe.encode(["a photo of the cat", "a dark close-up of the moon"])
    out = generate_emu3(pipe, ids)
    grid = out[:, ids.shape[1]: ids.shape[1] + 16 * 17].view(2, 16, 17)
    assert (grid[:, :, 16] == pipe.model.family.row_end).all()
    tok = AutoTokenizer.from_pretrained(str(folder / "text"))
    _, sp = vocabulary(len(tok), 1024)
    lay = Layout(tok, sp, 1024, (16, 16), 32)
    assert lay.prompt(None) == [sp["<|bos|>"], sp["<|image start|>"], sp["<|image token|>"]]
    seq = lay.image(torch.arange(256)[None] % 1024)[0]
    assert (seq[16:16 * 17:17] == sp["<|extra_200|>"]).all() and seq[0] == len(tok) + N_SPECIAL
    assert seq[-3:].tolist() == [sp["<|extra_201|>"], sp["<|image end|>"], sp["<|eos|>"]]
    # a draft head for the exported model (recipe=drafter on a transformers zoo folder), installed in its card
    from vgen.train.drafter import DrafterTrainConfig, train_drafter
    d = train_drafter(DrafterTrainConfig(out=str(tmp_path / "d"), model=str(folder), steps=2, batch_size=2,
                                         n_train=4, n_test=2, save_every=1, self_samples=2, install=True))
    assert 0.0 <= d["test_acceptance"] <= 1.0 and (folder / "drafter.safetensors").is_file()
    pipe = load_zoo(folder)
    prompts = ["a photo of the cat", "a dark photo of the moon"]
    ar = pipe.generate(prompts=prompts, sampler="ar", seed=0, top_k=1)
    eagle = pipe.generate(prompts=prompts, sampler="eagle", seed=0, top_k=1, window=3)
    assert torch.equal(ar.tokens, eagle.tokens)


def test_bench_experiment_checks_its_models_before_loading():
    from omegaconf import OmegaConf

    from vgen.eval import hf_speed
    with pytest.raises(VGenError, match="unknown transformers shapes"):
        hf_speed.check(OmegaConf.create({"device": "cpu", "hf_cpu_models": ["emu3-huge"]}))
    with pytest.raises(VGenError, match="not a transformers zoo model"):
        hf_speed.check_zoo(OmegaConf.create({"device": "cpu", "hf_zoo_models": ["photos-gpt"]}))
    with pytest.raises(VGenError, match="unknown sampler"):
        hf_speed.check_zoo(OmegaConf.create({"device": "cpu", "hf_zoo_models": [], "hf_samplers": ["nope"]}))
    assert hf_speed.check(OmegaConf.create({"device": "cpu", "hf_models": ["emu3-gen"]})) == []  # CUDA-only list
    with pytest.raises(VGenError, match="hf_grid must be"):
        hf_speed.check(OmegaConf.create({"device": "cpu", "hf_grid": 0}))
    with pytest.raises(VGenError, match="hf_shape_samplers: unknown sampler 'nope'"):
        hf_speed.check(OmegaConf.create({"device": "cpu", "hf_shape_samplers": ["nope"]}))
    with pytest.raises(VGenError, match="hf_shape_samplers: eagle needs a draft head or model"):
        hf_speed.check(OmegaConf.create({"device": "cpu", "hf_shape_samplers": ["sjd:window=4", "eagle"]}))


@pytest.mark.slow
def test_shape_samplers_run_in_float_and_int8(monkeypatch):
    """``hf_shape_samplers``: each sampler on a random-weight shape in float and in int8, beside ar: timed, with its
    tokens per pass and memory peak, its ratio to the float model's same sampler, and a table row each."""
    from omegaconf import OmegaConf

    from vgen.eval import hf_speed
    tiny = dict(hidden=64, layers=2, heads=4, kv_heads=4, ffn=128, vocab=1024, codes=64, grid=(4, 4))
    monkeypatch.setitem(hf_speed.CPU, "janus-tiny", tiny)
    cfg = OmegaConf.create({"device": "cpu", "hf_cpu_models": ["janus-tiny"], "hf_batch_sizes": [1, 2],
                            "hf_quantize": ["int8"], "hf_warmup": False, "hf_grid": None,
                            "hf_shape_samplers": ["sjd:window=4", "pac:window=4,tree_width=2,tree_depth=1"]})
    assert hf_speed.check(cfg) == ["janus-tiny"]
    r = hf_speed.run(cfg)["models"]["janus-tiny"]
    for by_b in (r["batch"], r["quantized"]["int8"]["batch"]):
        for b in ("1", "2"):
            cells = by_b[b]["samplers"]
            assert list(cells) == ["sjd:window=4", "pac:window=4,tree_width=2,tree_depth=1"]
            for c in cells.values():
                # 16 tokens a sample in fewer passes than tokens whenever a pass accepts a draft; never more
                assert c["seconds_per_image"] > 0 and c["peak_rss_mb"] > 0 and 1.0 <= c["tokens_per_pass"] <= 4.0
                assert c["forward_passes"] is not None
    for c in r["quantized"]["int8"]["batch"]["1"]["samplers"].values():
        assert c["speedup_vs_float"] > 0
    table = hf_speed.markdown_samplers({"models": {"janus-tiny": r}})
    assert table.count("| janus-tiny |") == 6  # ar, sjd and pac, in float and int8
    assert "| janus-tiny | int8 | `pac:window=4,tree_width=2,tree_depth=1` |" in table
    assert hf_speed.markdown_samplers({"models": {"janus-tiny": {**r, "batch": {"1": {"vgen": {}}},
                                                                  "quantized": {}}}}) == ""


@pytest.mark.slow
@pytest.mark.parametrize("family", ["janus", "emu3"])
def test_transformers_sampling_has_the_distribution_vgen_samples(family):
    """transformers' own generate(do_sample=True) with CFG, top-k and temperature draws from the enumerated law vgen's
    samplers are tested against (chi-square, with power against the unguided law): the two target the same
    distribution, CFG mixing included (Emu3: log-softmax mixing in an unbatched second forward)."""
    V, N = 3, 6_000
    seqs = all_sequences(V, 4)
    torch.manual_seed(0)
    with torch.no_grad():
        if family == "janus":
            m = janus(codes=V, grid=(2, 2), std=0.3)
            prompt = torch.tensor([[0, 9, 11, 3]])
            null = from_transformers(m).null_cond(prompt)
            ref = [janus_reference_logits(m, p.expand(len(seqs), -1), seqs) for p in (prompt, null)]
            x = prompt.expand(N, -1)
            out = m.generate(x, attention_mask=torch.ones_like(x), generation_mode="image", do_sample=True,
                             guidance_scale=1.5, top_k=2, temperature=0.9)
        else:
            m = emu3(codes=V, std=0.3)
            prompt, neg = torch.tensor([[0, 10, 11, 7, 9, 6]]), torch.tensor([[0, 13, 7, 9, 6]])
            ref = [emu3_reference_logits(m, p.expand(len(seqs), -1), seqs, w=2, n_codes=V) for p in (prompt, neg)]
            x = prompt.expand(N, -1)
            out = m.generate(x, attention_mask=torch.ones_like(x), do_sample=True, max_new_tokens=9,
                             prefix_allowed_tokens_fn=shapes.emu3_allowed(2, 2, 6, [40, 41, 42]), top_k=2,
                             temperature=0.9, guidance_scale=1.5, negative_prompt_ids=neg.expand(N, -1))
            out = out[:, 6:12].view(N, 2, 3)[:, :, :2].reshape(N, 4) - 40
    joint = enumerated(ref, seqs, 1.5, top_k=2, temperature=0.9)
    wrong = enumerated(ref, seqs, 1.0, top_k=2, temperature=0.9)
    counts = counts_of(out, V)
    assert chi2_p(counts, joint) > 1e-3
    assert chi2_p(counts, wrong) < 1e-6


@pytest.mark.slow
def test_vgen_sample_takes_a_transformers_folder(tmp_path):
    """`vgen sample model.path=<folder>` on a transformers pipeline folder: prompts cycled, every sample a PNG, the
    run resumable (a rerun draws nothing), the card's settings recorded; the card is read before any weights."""
    from vgen.cli import main
    from vgen.hf_pipeline import card
    from vgen.train.emu3 import Emu3TrainConfig, train_emu3
    train_emu3(Emu3TrainConfig(out=str(tmp_path / "e"), steps=1, batch_size=2, n_train=8, n_test=4, save_every=1,
                               warm_start=False, model=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                            num_attention_heads=2, num_key_value_heads=2)))
    folder = tmp_path / "e" / "pipeline"
    c = card(str(folder))
    assert c.conditioning == "text" and c.token_shape == (16, 16) and c.sampling["cfg_scale"] == 3.0
    args = ["sample", f"model.path={folder}", 'prompts=["a photo of the cat","a dark photo of the moon"]',
            "num_samples=3", "sampler=sjd", "sampler.window=3", "batch_size=2", f"outdir={tmp_path / 'out'}",
            "progress=false"]
    main(args)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("0*.png")) == ["000000.png", "000001.png", "000002.png"]
    first = (out / "000002.png").read_bytes()
    main(args)
    assert (out / "000002.png").read_bytes() == first
    import json
    st = json.loads((out / "stats.json").read_text())
    assert st["skipped"] == 3 and st["prompts"][1] == "a dark photo of the moon"


@pytest.mark.slow
def test_photos_emu3_zoo_model_has_structure():
    """The zoo's Emu3-architecture model loads by name (its transformers folder, caption tokenizer and VQ), samples
    from prompts with every sampler family, and its drafts are accepted well above a structureless model's 1 token
    per pass; `vgen sample model=photos-emu3` takes it."""
    import vgen
    from vgen.cards import list_transformers_models
    assert "photos-emu3" in list_transformers_models()
    pipe = vgen.load_pipeline("photos-emu3")
    prompts = ["a photo of the cat", "a dark photo of the moon"]
    g = pipe.generate(prompts=prompts, sampler="sjd", seed=0, window=4)
    assert g.pixels.shape == (2, 3, 64, 64) and g.stats["accepted_per_step"] > 1.4
    z = pipe.generate(prompts=prompts, sampler="zipar", seed=0)
    assert z.stats["accepted_per_step"] > 3.0
    p = pipe.generate(prompts=prompts, sampler="pjd", seed=0, score=True)  # stand-ins at row ends: forced row ends
    assert p.stats["accepted_per_step"] > 3.0 and p.stats["nll"] > 0
    e = pipe.generate(prompts=prompts, sampler="eagle", seed=0, window=4)  # the draft head the zoo ships
    assert e.stats["accepted_per_step"] > 1.9
    dark = g.pixels[1].float().mean()
    assert dark < g.pixels[0].float().mean()  # "dark" is read: the moon comes out darker than the cat


@pytest.mark.slow
def test_bench_and_demo_take_the_transformers_zoo_model(tmp_path):
    """`vgen bench models=[photos-emu3]` times its samplers beside ar (no LlamaGen-loop row: that baseline re-enacts
    vgen GPTs); the demo lists photos-emu3 and races samplers on a prompt."""
    import json

    from vgen.cli import main
    from vgen.demo import Demo, zoo_models
    out = tmp_path / "bench"
    main(["bench", "models=[photos-emu3]", "batch_sizes=[1]", "repeats=1", "num_samples=1", "warmup=false",
          'samplers=[ar,"sjd:window=4"]', "fid_samples=0", f"outdir={out}"])
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert [row["sampler"] for row in rows] == ["ar", "sjd:window=4"]
    sjd = rows[1]
    assert sjd["pass_reduction"] > 1.2 and sjd["speedup_vs_ar"] > 0
    assert "photos-emu3" in zoo_models()
    res = Demo().race("photos-emu3", None, None, 0, ["sjd"], {"window": 4}, prompt="a photo of the moon")
    assert [x["sampler"] for x in res] == ["ar", "sjd"] and res[1]["forward_passes"] < res[0]["forward_passes"]
    assert tuple(res[0]["image"].shape) == (3, 64, 64)


def test_a_bench_wide_compile_leaves_a_forward_vgen_does_not_own_to_auto():
    """`vgen bench compile=true`: vgen's GPT compiles; a transformers model's forward (Card.own_forward false) runs
    at compile=auto unless the setting itself names compile=true."""
    from hydra import compose, initialize_config_module

    from vgen.configs import register
    from vgen.eval.bench import plan
    from vgen.pipeline import load_card
    assert load_card("photos-gpt").own_forward and not load_card("photos-emu3").own_forward
    register()
    with initialize_config_module("vgen.configs", version_base="1.3"):
        cfg = compose("bench", overrides=["models=[photos-gpt,photos-emu3]", "compile=true", "baseline=false",
                                          'samplers=[ar,"sjd:window=4,compile=true"]'])
    p = plan(cfg)
    assert p.sampler_options("ar", "photos-gpt")[1]["compile"] is True
    assert p.sampler_options("ar", "photos-emu3")[1]["compile"] == "auto"
    assert p.sampler_options("sjd:window=4,compile=true", "photos-emu3")[1]["compile"] is True


def test_the_pipeline_names_no_family_and_finds_one_registered_elsewhere(tmp_path, monkeypatch):
    """Families register where they are defined (vgen/models/hf/<family>.py): vgen/hf_pipeline.py names none of
    them (registry names, releases, transformers classes; docstrings included), and a family registered from here
    loads a folder, makes its card, fills its sampling settings and tokenizes prompts through the pipeline."""
    import json
    import re
    from pathlib import Path

    import vgen
    import vgen.hf_pipeline as hp
    from vgen.models.hf import adapter, registered_families
    from vgen.models.hf.janus import Janus
    from vgen.pipeline import load_card, pipeline_for
    src = Path(hp.__file__).read_text()
    fams = registered_families()
    assert {f.name for f in fams} >= {"janus", "emu3", "chameleon"}
    for f in fams:
        for word in [f.name, f.model_class().__name__, *f.releases.split(", ")]:
            assert not re.search(re.escape(word), src, re.I), f"hf_pipeline.py names {word!r}"
    hf = janus(codes=8, grid=(2, 2))

    class ToyModel:  # the toy family's "transformers class": loads the tiny model above
        @classmethod
        def from_pretrained(cls, folder, **kw):
            return hf

    class Toy(Janus):  # a Janus underneath, found before the real one
        name, releases = "toy", "Toy-1"

        def model_class(self):
            return ToyModel

        def detect(self, m):
            return m is hf

        def wrap(self, m, height=None, width=None, **options):
            fam = super().wrap(m, height, width, **options)
            fam.name, fam.sampling = "Toy", {"cfg_scale": 2.0}
            return fam

        def card_fields(self, name, folder, config):
            return {"token_shape": [2, 2], "vocab_size": 8, "sampling": {"cfg_scale": 2.0}}

        def tokenize(self, processor, hf_model, family, prompt):
            return torch.tensor([0, 5, 3])

    toy = Toy()
    assert isinstance(toy, adapter.TransformersFamily)
    monkeypatch.setattr(adapter, "_FAMILIES", [toy, *fams])
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "config.json").write_text(json.dumps({"model_type": "toy"}))
    assert hp.family_for(tmp_path / "toy") is toy
    card = load_card(str(tmp_path / "toy"))
    assert card.external and tuple(card.token_shape) == (2, 2) and card.sampling == {"cfg_scale": 2.0}
    pipe = pipeline_for(card)
    assert pipe.hf_family is toy and pipe.model.family.name == "Toy" and pipe.defaults == {"cfg_scale": 2.0}
    pipe.processor = object()
    assert pipe.tokenize("a photo").tolist() == [0, 5, 3]
    g = pipe.generate(prompts=["a photo"], seed=0)
    assert g.tokens.shape == (1, 4) and g.stats["options"]["cfg_scale"] == 2.0
    (tmp_path / "toy" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(VGenError, match=r"holds a 'llama' model: .*toy \(Toy-1\), .*janus \(Janus, Janus-Pro\)"):
        vgen.load_pipeline(str(tmp_path / "toy"))
