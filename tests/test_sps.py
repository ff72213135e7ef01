"""sampler=sps: speculative sampling with a draft model (vgen.samplers.speculative.model), the quantized self-draft
(draft=self@int4): exactness against the enumerated joint (with power), batch invariance, prefixes, the pipeline's
draft loading and its one-line refusals."""
import copy

import pytest
import torch
from exact import chi2_p, counts_of, exact_joint, toward

from vgen.errors import VGenError
from vgen.kernels.quant import Int4Linear, quantize_linears
from vgen.samplers import sample

OPTS = dict(cfg_scale=2.0, top_k=3, temperature=0.9)
N = 10_000


def other_draft(micro_gpt):
    """A draft the micro target often disagrees with (its head perturbed): rejections, and so the residual draws,
    happen in about half the passes."""
    d = copy.deepcopy(micro_gpt)
    torch.manual_seed(7)
    with torch.no_grad():
        d.output.weight.add_(torch.randn_like(d.output.weight) * 0.15)
    return d


@pytest.mark.slow  # quick loop: kept under 3 minutes
@pytest.mark.parametrize("verify,window", [("block", 3), ("token", 4)])
def test_sps_is_exact_with_a_draft_that_disagrees(micro_gpt, verify, window):
    """10k batched samples follow the target's enumerated joint (guided, top-k, temperature) whatever the draft, and
    reject both the unguided joint and one a tenth of the way there (power); some drafts were rejected."""
    draft = other_draft(micro_gpt)
    _, joint = exact_joint(micro_gpt, 1, 2.0, top_k=3, temperature=0.9)
    _, unguided = exact_joint(micro_gpt, 1, 1.0, top_k=3, temperature=0.9)
    joint, unguided = joint.numpy(), unguided.numpy()
    tokens, st = sample(micro_gpt, [1] * N, "sps", seed=0, window=window, verify=verify, draft=draft, **OPTS)
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, joint) > 1e-3
    assert chi2_p(counts, unguided) < 1e-6 and chi2_p(counts, toward(joint, unguided)) < 1e-6
    assert counts[joint == 0].sum() == 0
    assert 0.2 < st["acceptance_rate"] < 0.95 and st["accepted_per_step"] > 1.0


@pytest.mark.slow
def test_sps_with_a_quantized_self_draft_is_exact_for_the_float_target(micro_gpt):
    """The int8 copy drafts (the fused product; int4's kernel makes this test 5x slower), the float model decides:
    the float model's law, which the draft's own differs from."""
    draft = copy.deepcopy(micro_gpt)
    assert quantize_linears(draft, "int8")["quantized"] >= 8
    _, joint = exact_joint(micro_gpt, 1, 2.0, top_k=3, temperature=0.9)
    _, q_joint = exact_joint(draft, 1, 2.0, top_k=3, temperature=0.9)
    assert 0.5 * abs(joint - q_joint).sum() > 0
    tokens, st = sample(micro_gpt, [1] * N, "sps", seed=0, window=3, draft=draft, **OPTS)
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, joint.numpy()) > 1e-3 and counts[joint.numpy() == 0].sum() == 0
    assert st["acceptance_rate"] > 0.8


def test_sps_is_batch_invariant_and_continues_prefixes(tiny_gpt):
    """Per-sample seeds: batch 4 and batch 1 (refilled slots) give the same bytes; a prefix is kept; with the model
    itself as the draft every draft passes (the chain's catch-up keeps the draft's cache right)."""
    draft = copy.deepcopy(tiny_gpt)
    quantize_linears(draft, "int4", 32)
    kw = dict(seed=3, window=4, cfg_scale=2.0, top_k=8, draft=draft)
    a, _ = sample(tiny_gpt, [0, 1, 2, 3], "sps", batch_size=4, **kw)
    b, st = sample(tiny_gpt, [0, 1, 2, 3], "sps", batch_size=1, **kw)
    assert torch.equal(a, b) and st["accepted_per_step"] > 2.0
    prefix = a[:, :5]
    c, _ = sample(tiny_gpt, [0, 1, 2, 3], "sps", batch_size=2, prefix=prefix, **kw)
    assert torch.equal(c[:, :5], prefix)
    _, own = sample(tiny_gpt, [0, 1, 2, 3], "sps", seed=3, window=4, cfg_scale=2.0, top_k=8, draft=tiny_gpt,
                    batch_size=2)
    assert own["acceptance_rate"] > 0.99


def test_the_pipeline_makes_the_self_draft_and_refuses_what_cannot_draft(tiny_pipeline, tiny_gpt):
    """draft=self@int4 is a quantized copy (the target stays float), made once; a named draft with another sequence
    length, an empty name and a transformers card's self-draft are one-line errors."""
    import vgen
    from vgen.models import build
    pipe = vgen.load_pipeline(str(tiny_pipeline))
    g = pipe.generate(labels=[0, 1], sampler="sps", window=3, seed=0)
    assert g.stats["options"]["draft"] == "self@int4" and g.stats["accepted_per_step"] > 1.0
    d = pipe.draft_model("self@int4")
    assert d is pipe.draft_model("self@int4") and d is not pipe.model
    assert any(isinstance(m, Int4Linear) for m in d.modules())
    assert not any(isinstance(m, Int4Linear) for m in pipe.model.modules())
    assert pipe.draft_model("self") is pipe.model
    short = build("gpt", dim=64, n_layer=1, n_head=2, vocab_size=32, num_classes=4, block_size=9).eval()
    with pytest.raises(VGenError, match="token grid|seq_len"):
        sample(tiny_gpt, [0], "sps", draft=short)
    with pytest.raises(VGenError, match="draft is empty"):
        pipe.generate(labels=[0], sampler="sps", draft="")
    from vgen.cards import split_draft
    assert split_draft("self@int4") == ("self", "int4") and split_draft("a@b/c") == ("a@b/c", None)
    assert split_draft("photos-gpt@float") == ("photos-gpt", None)
