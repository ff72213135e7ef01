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


@pytest.mark.parametrize("window,width,depth,continuation,init,more", [
    (3, 2, 1, True, "random", {}), pytest.param(4, 2, 2, False, "random", {}, marks=pytest.mark.slow),
    pytest.param(3, 3, 2, True, "random", {}, marks=pytest.mark.slow),
    pytest.param(4, 3, 1, True, "sample", {}, marks=pytest.mark.slow),
    pytest.param(3, 2, 2, True, "horizontal", {}, marks=pytest.mark.slow),
    pytest.param(4, 2, 1, True, "random", {"chains": "leaves"}, marks=pytest.mark.slow),
    pytest.param(4, 3, 1, True, "random", {"chains": "leaves", "leaf_chain": 1}, marks=pytest.mark.slow),
    pytest.param(4, 2, 1, True, "random", {"spine": 2, "spine_chain": 1}, marks=pytest.mark.slow),
    pytest.param(4, 2, 1, True, "random", {"restart": "mix", "chains": "leaves"}, marks=pytest.mark.slow),
    pytest.param(4, 2, 1, False, "random", {"restart": "mix", "spine": 2, "spine_chain": 1}, marks=pytest.mark.slow)],
    ids=lambda v: ("-".join(f"{k}={x}" for k, x in v.items()) or "default") if isinstance(v, dict) else None)
def test_pac_matches_the_exact_distribution(micro_gpt, joints, window, width, depth, continuation, init, more):
    """Lossless: 10k batched pac samples (trees, siblings drawn without replacement, the continuation on and off,
    drafts from several inits, a chain after the main path or after every leaf, the leaves' chains cut short by
    ``leaf_chain``, siblings on the main chain (``spine``) with chains, the first position after a rejection drawn from
    the mean after every candidate tried (``restart=mix``); CFG, top-k and temperature on) follow the
    enumerated joint; the same counts reject the unguided one and one a tenth of the way to it (power), and no
    zero-probability image appears."""
    joint, unguided = joints
    tokens, st = sample(micro_gpt, [1] * N, "pac", seed=0, window=window, tree_width=width, tree_depth=depth,
                        continuation=continuation, init=init, **more, **OPTS)
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


def test_restart_mix_draws_otherwise_and_stays_batch_invariant(micro_gpt):
    """restart=mix is not rank0 under another name: from the same seeds its drafts after a rejection differ, so do
    some samples (the law is the same: the exactness cases above); any batch size still gives the same bytes."""
    kw = dict(seed=3, window=4, tree_width=2, tree_depth=1, chains="leaves", **OPTS)
    labels = [0, 1, 2, 1, 0, 2, 1, 0] * 8
    mix, st = sample(micro_gpt, labels, "pac", restart="mix", batch_size=64, **kw)
    rank0, _ = sample(micro_gpt, labels, "pac", batch_size=64, **kw)
    assert not torch.equal(mix, rank0)
    again, _ = sample(micro_gpt, labels, "pac", restart="mix", batch_size=5, **kw)
    assert torch.equal(mix, again)


def test_the_tree_is_the_branches_then_the_main_path(micro_gpt):
    assert pac_paths(4, 2, 1) == ((0,), (1,), (0, 0), (0, 0, 0))
    assert pac_paths(4, 2, 2) == ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1), (0, 0, 0))
    assert pac_paths(2, 3, 2) == ((0,), (1,), (2,))  # the tree never branches past the window
    assert pac_paths(4, 2, 1, "leaves") == ((0,), (1,), (0, 0), (1, 0), (0, 0, 0), (1, 0, 0))  # a chain per leaf
    assert pac_paths(4, 2, 1, "leaves", 1) == ((0,), (1,), (0, 0), (1, 0), (0, 0, 0))  # the other leaves' cut short
    assert pac_paths(4, 2, 1, "main", 1) == pac_paths(4, 2, 1)  # leaf_chain only shortens the leaves' own chains
    assert len(pac_paths(32, 32, 1, "leaves", 6)) == 32 + 31 * 6 + 30
    # spine: a sibling (with a chain of spine_chain drafts) beside each rank-0 draft of the main chain
    assert pac_paths(4, 2, 1, "main", 0, 2, 1) == ((0,), (1,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 1), (0, 1, 0))
    assert len(pac_paths(32, 32, 1, "leaves", 10, 2, 3)) == 32 + 31 * 10 + 30 + 30 * 1 + 27 * 3 + 2 + 1
    with pytest.raises(VGenError, match="tree_width and tree_depth must be >= 1"):
        sample(micro_gpt, [0], "pac", tree_width=0)


def test_trees_parse_and_refuse_bad_ones(micro_gpt):
    from vgen.samplers import get_sampler
    assert get_sampler("pac").timed_widths() == [8, "2x1"]  # the default tree at max_window, and 2 x 1 there
    assert get_sampler("pac", max_window=4, trees="2x1, 3x2,2x1").timed_widths() == [4, "2x1"]  # its own tree once
    assert get_sampler("pac", trees="").timed_widths() == [8]
    with pytest.raises(VGenError, match="trees must look like '2x1,3x1'"):
        sample(micro_gpt, [0], "pac", trees="2by1")
    with pytest.raises(VGenError, match="a tree of width 9 and depth 3 with chains=main at window 4 has 819 nodes"):
        sample(micro_gpt, [0], "pac", trees="2x1,9x3")  # the micro model's 4 tokens bound the window
    from vgen.samplers.pac import PacOptions
    with pytest.raises(VGenError, match="a tree of width 6 and depth 1 with chains=leaves at window 128 has 762 nod"):
        PacOptions(window=128, tree_width=6, tree_depth=1, chains="leaves").validate()
    PacOptions(window=128, tree_width=6, tree_depth=1, chains="leaves", leaf_chain=8).validate()  # 6 + 5 * 8 + 126
    with pytest.raises(VGenError, match="width 64 and depth 1 with chains=leaves, leaf_chain=8 at window 32 has 598 "):
        PacOptions(window=32, tree_width=64, tree_depth=1, chains="leaves", leaf_chain=8).validate()
    with pytest.raises(VGenError, match="leaf_chain must be >= 0"):
        PacOptions(leaf_chain=-1).validate()
    with pytest.raises(VGenError, match="leaf_chain=4 caps the chains on the leaves off the main path: it needs "
                       "chains=leaves"):
        PacOptions(leaf_chain=4).validate()
    with pytest.raises(VGenError, match="spine must be >= 1"):
        PacOptions(spine=0).validate()
    with pytest.raises(VGenError, match="spine_chain=2 is the chain after each sibling on the main path: it needs "
                       "spine >= 2"):
        PacOptions(spine_chain=2).validate()
    with pytest.raises(VGenError, match="leaf_chain=10, spine=3, spine_chain=3 at window 32 has 600 nodes"):
        PacOptions(window=32, tree_width=32, tree_depth=1, chains="leaves", leaf_chain=10, spine=3,
                   spine_chain=3).validate()


def test_timed_choice_takes_a_tree_among_widths():
    """The timed rule's keys may name a sampler's other candidates (pac's trees): the best qualified one wins."""
    from vgen.samplers.speculative.widths import timed_choice
    ar = [100, 100, 100]
    assert timed_choice({1: ar, 8: [104, 105, 103], "2x1": [130, 128, 131]}) == "2x1"
    assert timed_choice({1: ar, 8: [140, 139, 141], "2x1": [130, 128, 131]}) == 8
    assert timed_choice({1: ar, 8: [90, 91, 92], "2x1": [99, 101, 100]}) == 1


def test_window_auto_times_the_narrower_trees_and_runs_the_chosen_one(tiny_gpt, tmp_path, monkeypatch):
    """window=auto times AR's loop, this tree and each of ``trees`` at max_window once (cached, the tree's key
    its name); the job runs the chosen tree at max_window, its tokens that fixed tree's, and the stats name it."""
    import json

    from vgen.samplers.speculative import widths
    monkeypatch.setenv("VGEN_CACHE", str(tmp_path))
    kw = dict(top_k=10, cfg_scale=2.0, max_window=3, tree_width=3, tree_depth=2)
    first, st = sample(tiny_gpt, [0, 1], "pac", seed=2, trees="2x1", **kw)
    (speeds,) = json.loads((tmp_path / "spec_speed.json").read_text()).values()
    assert set(speeds) == {"1", "3", "2x1"} and all(min(v) > 0 for v in speeds.values())
    chosen = widths.timed_choice({int(w) if w.isdigit() else w: v for w, v in speeds.items()})
    tree = {1: None, 3: (3, 2), "2x1": (2, 1)}[chosen]
    assert st.get("tree") == (None if tree is None else f"{tree[0]}x{tree[1]}")
    assert st["window"] == (1 if tree is None else 3)
    monkeypatch.setattr(widths, "timed_choice", lambda speeds, final=True: "2x1")  # the narrow tree, whatever ran
    narrow, st = sample(tiny_gpt, [0, 1], "pac", seed=2, trees="2x1", **kw)
    fixed, st_fixed = sample(tiny_gpt, [0, 1], "pac", seed=2, **{**kw, "window": 3, "tree_width": 2, "tree_depth": 1})
    assert torch.equal(narrow, fixed) and st["tree"] == st_fixed["tree"] == "2x1" and st["window"] == 3
    assert st["window_rule"] == "cached" and st["forward_passes"] == st_fixed["forward_passes"]


@pytest.mark.parametrize("paths", [pac_paths(4, 3, 2), pac_paths(5, 3, 1, "main", 0, 2, 1)])
def test_each_candidate_follows_the_proposal_it_is_verified_with(paths):
    """The verification is exact only if each node's token follows the proposal handed to it: averaged over draws,
    a node's token frequencies equal its proposals' mean (siblings drawn without replacement: rank r's proposal
    depends on ranks 0..r-1), a token with no mass is never a candidate, and siblings never repeat; columns of
    different widths (a spine's) alike."""
    from vgen.kernels.tree import static_tree
    from vgen.samplers.speculative.pac import PacTables, candidates
    torch.manual_seed(0)
    t = PacTables(static_tree(paths, "cpu"), "cpu")
    B, V, J = 40_000, 5, t.columns
    base = torch.softmax(2 * torch.randn(1, J, V), -1) * (torch.arange(V) != 4)  # token 4: no mass
    base = (base / base.sum(-1, keepdim=True)).expand(B, J, V)
    rank0 = torch.multinomial(base[0], B, replacement=True).T  # (B, J): rank 0 follows base
    toks, props = candidates(base, rank0, torch.rand(B, t.rank_uniforms), t)
    freq = torch.nn.functional.one_hot(toks, V).float().mean(0)  # (N, V)
    assert (freq - props.mean(0)).abs().max() < 0.01  # 40k draws: a frequency's standard error is under 0.0025
    assert freq[:, 4].sum() == 0
    parent, rank = t.tree.parent[1:].tolist(), [p[-1] for p in t.tree.paths]
    for a in range(len(rank)):
        for b in range(a):
            if parent[a] == parent[b]:  # siblings
                assert (toks[:, a] != toks[:, b]).all()
