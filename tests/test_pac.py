"""SJD-PAC (sampler=pac): proactive draft trees verified by recursive rejection sampling, with and without the
adaptive continuation; exactness against the enumerated joint of a micro model (with a power check), batching,
prefixes, seeds."""
import pytest
import torch
from exact import chi2_p, counts_of, exact_joint, toward

from vgen.errors import VGenError
from vgen.samplers import sample
from vgen.samplers.speculative.pac import pac_paths

OPTS = dict(cfg_scale=2.0, top_k=3, temperature=0.9)
N = 10_000  # exactness: enough to reject a law a tenth of the way to the unguided one (exact.toward)


@pytest.fixture(scope="module")
def joints(micro_gpt):
    _, joint = exact_joint(micro_gpt, 1, 2.0, top_k=3, temperature=0.9)
    _, unguided = exact_joint(micro_gpt, 1, 1.0, top_k=3, temperature=0.9)
    return joint.numpy(), unguided.numpy()


@pytest.mark.parametrize("window,width,depth,continuation,init", [
    (3, 2, 1, True, "random"), pytest.param(4, 2, 2, False, "random", marks=pytest.mark.slow),
    pytest.param(3, 3, 2, True, "random", marks=pytest.mark.slow),
    pytest.param(4, 3, 1, True, "sample", marks=pytest.mark.slow),
    pytest.param(3, 2, 2, True, "horizontal", marks=pytest.mark.slow)])
def test_pac_matches_the_exact_distribution(micro_gpt, joints, window, width, depth, continuation, init):
    """Lossless: 10k batched pac samples (trees, siblings drawn without replacement, the continuation on and off,
    drafts from several inits; CFG, top-k and temperature on) follow the enumerated joint; the same counts reject
    the unguided one and one a tenth of the way to it (power), and no zero-probability image appears."""
    joint, unguided = joints
    tokens, st = sample(micro_gpt, [1] * N, "pac", seed=0, window=window, tree_width=width, tree_depth=depth,
                        continuation=continuation, init=init, **OPTS)
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, joint) > 1e-3
    assert chi2_p(counts, unguided) < 1e-6 and chi2_p(counts, toward(joint, unguided)) < 1e-6
    assert counts[joint == 0].sum() == 0
    assert st["accepted_per_step"] > 1.0 and st["window"] == window


def test_pac_is_batch_invariant_and_continues_prefixes(micro_gpt):
    """Sample i depends on its seed only: any batch size gives the same bytes; a given prefix is kept."""
    a, _ = sample(micro_gpt, [0, 1, 2, 1, 0], "pac", seed=7, window=3, batch_size=5, **OPTS)
    b, _ = sample(micro_gpt, [0, 1, 2, 1, 0], "pac", seed=7, window=3, batch_size=2, **OPTS)
    assert torch.equal(a, b)
    from vgen.samplers import get_sampler
    s = get_sampler("pac", window=3, **OPTS)
    prefix = torch.tensor([[2], [1], [0]])
    t, _ = s(micro_gpt, torch.tensor([1, 1, 1]), [3, 4, 5], prefix=prefix)
    assert torch.equal(t[:, :1], prefix)


def test_the_tree_is_the_branches_then_the_main_path(micro_gpt):
    assert pac_paths(4, 2, 1) == ((0,), (1,), (0, 0), (0, 0, 0))
    assert pac_paths(4, 2, 2) == ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1), (0, 0, 0))
    assert pac_paths(2, 3, 2) == ((0,), (1,), (2,))  # the tree never branches past the window
    with pytest.raises(VGenError, match="tree_width and tree_depth must be >= 1"):
        sample(micro_gpt, [0], "pac", tree_width=0)
