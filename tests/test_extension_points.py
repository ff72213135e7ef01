"""The extension points hold from outside vgen/: a draft source, an acceptance rule and a sampler that composes them,
written and registered in this file, sample end to end on vgen's scheduler and verification core, with no edit to
vgen/. The toy source is exact with vgen's exact rule (the enumerated joint), and the toy rule is what decides."""
import pytest
import torch
import torch.nn.functional as F
from exact import chi2_p, counts_of, exact_joint, toward

from vgen.samplers import register_sampler, sample, unregister_sampler
from vgen.samplers.speculative import SpeculativeSampler
from vgen.samplers.speculative.step import Chain, speculative_step

OPTS = dict(cfg_scale=2.0, top_k=3, temperature=0.9)
N = 10_000  # enough to reject a law a tenth of the way to the unguided one (exact.toward)


def copy_step(model, cache, s, wv, it, W, c, rule, **args):
    speculative_step(CopyLeft, model, cache, s, wv, it, W, c, rule, **args)


class CopyLeft(Chain):
    """A draft source that proposes the last decided token again, W - 1 times (one-hot proposals)."""
    step_fn = staticmethod(copy_step)

    def __init__(self, model, config, slots):
        self.config = config

    @staticmethod
    def copies(tokens, nxt, D: int, V: int):
        f = tokens.gather(1, (nxt - 1)[:, None]).expand(-1, D)
        return tokens.scatter(1, nxt[:, None] + torch.arange(D, device=nxt.device), f), F.one_hot(f, V).float()

    @staticmethod
    def draft(model, cache, tokens, s, v, wv, p, h, us, W, c, **args):
        return CopyLeft.copies(tokens, s.n + v.k + 1, c.D, p.shape[-1])

    def first_drafts(self, model, tokens, first, p0, uf, feats, refilled):
        t, q = self.copies(tokens, first + 1, self.config.D, p0.shape[-1])
        return t.gather(1, (first + 1)[:, None] + torch.arange(self.config.D, device=first.device)), q


class AcceptAll:
    """A (lossy) rule: every draft the target allows at all is accepted."""
    block = False
    calls = 0

    def __call__(self, p, q, x, px, qx):
        AcceptAll.calls += 1
        return torch.ones_like(px)


@pytest.fixture
def toys():
    @register_sampler
    class ToyCopy(SpeculativeSampler):
        name = "toy-copy"

        def draft_source(self, model, config, slots, draft=None):
            return CopyLeft(model, config, slots)

    @register_sampler
    class ToyAll(ToyCopy):
        name = "toy-all"

        def acceptance(self, model, codebook):
            return AcceptAll()

    yield
    unregister_sampler("toy-copy")
    unregister_sampler("toy-all")


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_a_draft_source_and_a_rule_from_outside_vgen_sample_end_to_end(micro_gpt, toys):
    """The toy source with vgen's exact rule follows the enumerated joint (CFG, top-k, temperature on), and the
    counts reject the unguided one and one a tenth of the way to it (power); the toy rule, on the same source, accepts every draft the target allows
    and so drifts from the joint."""
    _, joint = exact_joint(micro_gpt, 1, 2.0, top_k=3, temperature=0.9)
    _, unguided = exact_joint(micro_gpt, 1, 1.0, top_k=3, temperature=0.9)
    tokens, st = sample(micro_gpt, [1] * N, "toy-copy", seed=0, window=3, **OPTS)
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, joint.numpy()) > 1e-3
    assert chi2_p(counts, unguided.numpy()) < 1e-6
    assert chi2_p(counts, toward(joint.numpy(), unguided.numpy())) < 1e-6
    assert counts[joint.numpy() == 0].sum() == 0
    assert 0 < st["acceptance_rate"] < 1 and st["window_rule"] == "fixed"

    AcceptAll.calls = 0  # 2.5k samples: the drift is gross (chi-square p underflows to 0 at 2k already)
    tokens, st = sample(micro_gpt, [1] * (N // 4), "toy-all", seed=0, window=3, **OPTS)
    assert AcceptAll.calls > 0
    counts = counts_of(tokens, 4)
    assert counts[joint.numpy() == 0].sum() == 0  # the core still never accepts what the target excludes
    assert st["acceptance_rate"] > 0.5
    assert chi2_p(counts, joint.numpy()) < 1e-6  # copies accepted wherever allowed: not the target's distribution



def test_window_auto_serves_a_draft_source_from_outside_vgen(micro_gpt, toys):
    """window=auto (timed, prior, cost tables) keys on the sampler's own options, not on any one source's fields."""
    tokens, st = sample(micro_gpt, [0, 1] * 4, "toy-copy", seed=3, batch_size=4, **OPTS)
    assert tokens.shape == (8, 4) and st["window_rule"] in ("timed", "cached", "prior", "fallback")


def test_a_condition_kind_a_draft_source_and_a_rule_from_outside_vgen_sample_together(tiny_gpt, toys):
    """All three at once: the toy condition kind of tests/test_conditions.py (class ids spelled as words) conditions a
    model the toy sampler (toy source x toy rule) drives; the words reach the model as the class ids they spell."""
    from test_conditions import WordsKind

    from vgen.conditions import register_kind, unregister_kind
    kind = register_kind(WordsKind())
    try:
        cls = type(tiny_gpt)
        tiny_gpt.__class__ = type("WordsGPT", (cls,), {"conditioning": "toy-words"})
        AcceptAll.calls = 0
        toks, st = sample(tiny_gpt, ["one", "three"], "toy-all", seed=4, window=3)
        assert AcceptAll.calls > 0 and "check_tensor" in kind.calls and st["accepted_per_step"] > 1.0
        tiny_gpt.__class__ = cls  # the class model it was: the same tokens for the class ids the words spell
        assert torch.equal(toks, sample(tiny_gpt, [1, 3], "toy-all", seed=4, window=3)[0])
    finally:
        unregister_kind(kind.name)


KINDS_CHILD = """
import json, sys
from vgen.models.loading import list_kinds
before = "vgen.tokenizers" in sys.modules
kinds = list_kinds()
print(json.dumps({"before": before, "after": "vgen.tokenizers" in sys.modules, "vq": "vq" in kinds,
                  "msvq": "var-vqvae" in kinds, "pipeline": "vgen.pipeline" in sys.modules}))
"""


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_kind_lookups_find_every_package_declared_under_the_kinds_entry_points():
    """Model and tokenizer kinds are found through the `vgen.kinds` entry points (pyproject.toml: vgen's own two
    packages; a plugin declares its own there): in a fresh interpreter that imports only the model package, the
    first lookup imports the tokenizers and knows their kinds, with no pipeline imported."""
    import json
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", KINDS_CHILD], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"before": False, "after": True, "vq": True,
                                                             "msvq": True, "pipeline": False}
