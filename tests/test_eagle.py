"""sampler=eagle: a trained draft head (EAGLE-style) proposes, the target verifies on the shared core.
Exactness (enumerated micro model, chi-square + power), batch invariance, prefixes, relaxed rules' drift,
the drafter's file format and recipe, errors."""
import pytest
import torch
from exact import chi2_p, conditional_tv, counts_of, exact_joint, toward

from vgen.errors import VGenError
from vgen.models.drafter import Drafter, load_drafter, save_drafter
from vgen.samplers import sample

OPTS = dict(cfg_scale=2.0, top_k=3, temperature=0.9)
N = 10_000  # exactness: enough to reject a law a tenth of the way to the unguided one (exact.toward)
DRIFT_N = 20_000  # LANTERN's per-token drift: prefixes seen 400 times


def make_drafter(model, seed=0, scale=1.0, arch="block"):
    """A random draft head for ``model``: its proposals are far from the target's (what exactness must survive)."""
    torch.manual_seed(seed)
    d = Drafter(model.config, arch)
    with torch.no_grad():
        for p in d.parameters():
            if p.dim() > 1:
                p.normal_(0.0, scale / p.shape[1] ** 0.5)
    return d.eval()


@pytest.fixture(scope="module")
def micro(micro_gpt):
    _, joint = exact_joint(micro_gpt, 1, 2.0, top_k=3, temperature=0.9)
    _, unguided = exact_joint(micro_gpt, 1, 1.0, top_k=3, temperature=0.9)
    return micro_gpt, make_drafter(micro_gpt), joint.numpy(), unguided.numpy()


@pytest.mark.slow
@pytest.mark.parametrize("arch,verify,window", [("block", "block", 3), ("block", "block", 4), ("mlp", "block", 3),
                                                ("block", "token", 3)])
def test_eagle_exact_matches_the_enumerated_distribution(micro, arch, verify, window):
    """Lossless, with either head (a block with its own KV cache, or the attention-free one) and either check (the
    chain jointly, or draft by draft): 10k batched samples follow the enumerated joint (CFG, top-k, temperature
    on); the same counts reject the unguided distribution and one a tenth of the way to it (power); no
    zero-probability image."""
    m, d, joint, unguided = micro
    if arch == "mlp":
        d = make_drafter(m, arch="mlp")
    tokens, st = sample(m, [1] * N, "eagle", seed=0, window=window, verify=verify, draft=d, **OPTS)
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, joint) > 1e-3
    assert chi2_p(counts, unguided) < 1e-6 and chi2_p(counts, toward(joint, unguided)) < 1e-6
    assert counts[joint == 0].sum() == 0
    assert st["accepted_per_step"] > 1.0 and 0 < st["acceptance_rate"] <= 1


@pytest.mark.parametrize("arch", ["block", "mlp"])
def test_eagle_is_batch_invariant_and_continues_prefixes(tiny_gpt, arch):
    d = make_drafter(tiny_gpt, seed=1, arch=arch)
    kw = dict(cfg_scale=2.0, top_k=10, window=3, draft=d)
    one = torch.cat([sample(tiny_gpt, [c], "eagle", seed=5 + i, **kw)[0] for i, c in enumerate([0, 1, 2, 1, 0])])
    for bs in (2, 5):
        many, _ = sample(tiny_gpt, [0, 1, 2, 1, 0], "eagle", seed=5, batch_size=bs, **kw)
        assert torch.equal(many, one)
    prefix = one[:, :5]
    cont, _ = sample(tiny_gpt, [0, 1, 2, 1, 0], "eagle", seed=9, batch_size=2, prefix=prefix, **kw)
    assert torch.equal(cont[:, :5], prefix)


@pytest.mark.slow
def test_eagle_relaxed_rules_move_mass_within_their_bounds(micro):
    """accept=lantern / gsd plug into the same pass: they accept more than exact, never emit a zero-probability
    image, and LANTERN's per-token drift stays within delta (plus sampling noise)."""
    import torch.nn.functional as F
    m, d, joint, _ = micro
    cb = F.normalize(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    n = {"lantern": DRIFT_N, "gsd": 3000}  # GSD's rule has its own drift tests (test_speculative.py): here it plugs in
    # exact acceptance from 3k samples (0.336; 0.343 from 20k, 15 s more): LANTERN's 0.353, GSD's 0.444
    _, ex = sample(m, [1] * 3000, "eagle", seed=0, window=3, draft=d, **OPTS)
    for accept, extra in (("lantern", dict(delta=0.2)), ("gsd", dict(d_threshold=4.0))):
        tokens, st = sample(m, [1] * n[accept], "eagle", seed=0, window=3, draft=d, codebook=cb, accept=accept,
                            **extra, **OPTS)
        counts = counts_of(tokens, 4)
        assert counts[joint == 0].sum() == 0
        assert st["acceptance_rate"] > ex["acceptance_rate"]
        if accept == "lantern":
            mean_tv, worst = conditional_tv(m, tokens, 1, 2.0, top_k=3, temperature=0.9)
            assert mean_tv <= 0.2 + 0.02, (mean_tv, worst)


@pytest.mark.slow
def test_eagle_compiled_step_gives_the_eager_tokens(tiny_gpt):
    d = make_drafter(tiny_gpt, seed=1)
    kw = dict(cfg_scale=2.0, top_k=10, window=3, draft=d)
    eager, _ = sample(tiny_gpt, [0, 1, 2], "eagle", seed=2, **kw)
    comp, _ = sample(tiny_gpt, [0, 1, 2], "eagle", seed=2, compile=True, **kw)
    assert torch.equal(eager, comp)


def test_draft_distribution_is_the_targets_filter_over_its_top_k():
    """The drafts' distribution (``draft_dist`` + ``dense``) is ``window_target``'s (guidance, its interval,
    temperature, top-k) for tie-free logits; draws land on tokens with mass in proportion to it (a two-sample check
    against the probabilities, and against a wrong one for power); a k-th-place tie keeps exactly k tokens; with
    top-p it is window_target's own."""
    from exact import chi2_p

    from vgen.kernels.verify import window_target
    from vgen.samplers.speculative.head import dense, draft_dist, draw
    g = torch.Generator().manual_seed(0)
    V = 50
    logits = torch.randn(4, 3, V, generator=g) * 2  # rows [cond; uncond] of 2 samples, 3 positions
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for kw in (dict(cfg_scale=2.0, cfg_interval=-1, temperature=1.0, top_k=7, top_p=1.0),
               dict(cfg_scale=3.0, cfg_interval=3, temperature=0.8, top_k=5, top_p=1.0),
               dict(cfg_scale=2.0, cfg_interval=-1, temperature=1.0, top_k=7, top_p=0.9)):
        want = window_target(logits, idx, True, **kw)
        probs, ids = draft_dist(logits, idx, True, **kw)
        assert (ids is None) == (kw["top_p"] < 1.0)
        torch.testing.assert_close(dense(probs, ids, V), want)
    kw = dict(cfg_scale=2.0, cfg_interval=-1, temperature=0.9, top_k=6, top_p=1.0)
    probs, ids = draft_dist(logits[:, :1], idx[:, :1], True, **kw)
    q = dense(probs, ids, V)[0, 0].double()
    n = 40_000
    u = torch.rand(n, generator=g)
    x = draw(probs[:1, 0].expand(n, -1), ids[:1, 0].expand(n, -1), u)
    counts = torch.bincount(x, minlength=V).double()
    assert counts[q == 0].sum() == 0
    keep = q > 0
    assert chi2_p(counts[keep].numpy(), q[keep].numpy()) > 1e-3
    assert chi2_p(counts[keep].numpy(), q[keep].flip(0).numpy()) < 1e-6
    # the tail: entries with no mass (underflow) are never drawn, at either end of the uniforms' range
    tail = torch.tensor([[0.7, 0.3, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    edge = torch.tensor([0.0, 0.3, 0.75, 1.0 - 2.0 ** -24])
    got = draw(tail[:, None].expand(-1, 4, -1), torch.arange(4).expand(2, 4, 4) + 10, edge.expand(2, 4))
    assert got.tolist() == [[10, 10, 11, 11], [10, 10, 10, 10]]
    tie = torch.zeros(1, 1, V)
    tie[..., :3] = 1.0  # three tokens tied at the top: top-2 keeps two of them
    probs, ids = draft_dist(tie, idx[:1, :1], False, 1.0, -1, 1.0, 2, 1.0)
    assert (dense(probs, ids, V) > 0).sum() == 2 and probs.sum().item() == pytest.approx(1.0)


def test_drafter_file_round_trip_and_refusals(tmp_path, tiny_gpt, micro_gpt):
    d = make_drafter(tiny_gpt, seed=2)
    save_drafter(d, tmp_path / "d.safetensors")
    back = load_drafter(tmp_path / "d.safetensors")
    for k, v in d.state_dict().items():
        assert torch.equal(back.state_dict()[k], v.half().float())
    a, _ = sample(tiny_gpt, [0, 1], "eagle", seed=3, window=3, draft=back, cfg_scale=2.0)
    assert a.shape == (2, 16)
    with pytest.raises(VGenError, match="trained for a target with dim=64"):
        sample(micro_gpt, [0], "eagle", seed=0, window=3, draft=back)
    with pytest.raises(VGenError, match="needs a draft head"):
        sample(tiny_gpt, [0], "eagle", seed=0, window=3)
    with pytest.raises(VGenError, match="accept"):
        sample(tiny_gpt, [0], "eagle", seed=0, window=3, draft=back, accept="nope")
    (tmp_path / "x.safetensors").write_bytes(b"not a file")
    with pytest.raises(VGenError, match="not a readable safetensors"):
        load_drafter(tmp_path / "x.safetensors")
    with pytest.raises(VGenError, match="not found"):
        load_drafter(tmp_path / "nope.safetensors")


@pytest.mark.parametrize("arch", ["block", "mlp"])
def test_inference_head_is_the_heads_function(tiny_gpt, arch):
    """The sampler's few-op head (folded weights, tables) computes forward's states, cache writes and the target's
    logits, with per-sample positions, a prefilled cache and an explicit mask (as tree drafting passes), up to
    float rounding; a different head differs."""
    m = tiny_gpt
    d = make_drafter(m, seed=3, arch=arch)
    fast = d.inference(m)
    torch.manual_seed(0)
    rows, S = 4, 3
    feats, x = torch.randn(rows, S, m.config.dim), torch.randint(0, m.vocab_size, (rows, S))
    pos = m.cond_len + torch.tensor([[0, 1, 2], [5, 6, 7], [2, 3, 4], [9, 10, 11]])
    c1, c2 = d.new_cache(m, rows), fast.new_cache(m, rows)
    pre = torch.randn(rows, 2, m.config.dim), torch.randint(0, m.vocab_size, (rows, 2))
    p0 = m.cond_len + torch.tensor([[3, 4]]).expand(rows, -1)
    d(m, *pre, p0, c1)
    fast(m, *pre, p0, c2)  # both caches hold the same earlier slots
    a, b = d(m, feats, x, pos, c1), fast(m, feats, x, pos, c2)
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.logits(m, a), m.head(a), atol=1e-5, rtol=1e-5)
    other = make_drafter(m, seed=4, arch=arch).inference(m)
    assert not torch.allclose(other(m, feats, x, pos, other.new_cache(m, rows)), a, atol=1e-3)
    if arch == "block":  # the same keys and values written; an explicit mask (a tree's) is honoured alike
        torch.testing.assert_close(c2.k[0], c1.k[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(c2.v[0], c1.v[0], atol=1e-5, rtol=1e-5)
        mask = c1.causal_mask(pos) & (torch.rand(rows, 1, S, c1.max_len) < 0.7)
        mask |= (c1.slots == pos[..., None])[:, None]  # every query sees its own slot
        a, b = d(m, feats, x, pos, c1, attn_mask=mask), fast(m, feats, x, pos, c2, attn_mask=mask)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(a, d(m, feats, x, pos, c1), atol=1e-4)  # the mask changed what was read


@pytest.mark.parametrize("arch", ["block", "mlp"])
def test_rollout_depth_k_is_the_heads_kth_chained_call(tiny_gpt, arch):
    """The training rollout (EAGLE-3's training-time test) at depth k, slot j, equals what the sampler computes:
    the head caught up on target states through slot j-k+1 (one call with its cache), then k-1 chained calls each
    fed the previous output; depth 1 is forward; depth 2 differs from depth 1 (the feed is the head's own)."""
    m = tiny_gpt
    d = make_drafter(m, seed=5, arch=arch)
    torch.manual_seed(1)
    B, S, K = 2, min(9, m.seq_len), 3
    feats, x = torch.randn(B, S, m.config.dim), torch.randint(0, m.vocab_size, (B, S))
    pos = m.cond_len + torch.arange(S)
    with torch.no_grad():
        outs = d.rollout(m, feats, x, pos, K)
        assert len(outs) == K and all(o.shape == feats.shape for o in outs)
        torch.testing.assert_close(outs[0], d(m, feats, x, pos))
        for k in range(2, K + 1):
            for j in range(k - 1, S):
                t = j - k + 1
                c = d.new_cache(m, B)
                g = d(m, feats[:, :t + 1], x[:, :t + 1], pos[:t + 1], c)[:, -1:]
                for s in range(t + 1, j + 1):
                    g = d(m, g, x[:, s:s + 1], pos[s:s + 1], c)
                torch.testing.assert_close(outs[k - 1][:, j], g[:, 0], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(outs[1][:, 1:], outs[0][:, 1:], atol=1e-3)
    if arch == "block":  # the head's cache never reads the condition's slots, which nobody writes (training does not)
        c = d.new_cache(m, 1)
        mask = c.causal_mask(pos)[0, 0]  # (S, slots)
        assert not mask[:, :m.cond_len].any()
        assert mask[:, m.cond_len:m.cond_len + S].equal(torch.ones(S, S).tril().bool())


def test_acceptance_loss_is_what_the_exact_rule_accepts_and_trains_it(tiny_gpt):
    """The recipe's ``accept_weight`` term: ``acceptance`` is sum_x min(p, q) of the guided, filtered distributions
    (1 for the target's own logits; equal to a direct computation from the sampler's ``window_target``), and a few
    steps on ``tv`` alone raise it on that batch at every depth (the gradient reaches the head through guidance
    and the top-k filter)."""
    from vgen.kernels.verify import window_target
    from vgen.models.drafter import target_features
    from vgen.train.drafter import acceptance, drafter_losses, sampling_kwargs
    m = tiny_gpt
    for p in m.parameters():
        p.requires_grad_(False)
    sampling = {"cfg_scale": 2.0, "top_k": 8, "temperature": 0.9}
    kw = sampling_kwargs(sampling)
    torch.manual_seed(0)
    B, L = 6, m.seq_len
    codes, labels = torch.randint(0, m.vocab_size, (B, L)), torch.randint(0, m.num_classes, (B,))
    feats = torch.stack([target_features(m, codes, labels), target_features(m, codes, m.null_cond(labels))], 1)
    d = make_drafter(m, seed=5).train()
    r = drafter_losses(d, m, feats, codes, depths=2, sampling=sampling)
    lq, lp = r["logits_q"][1], r["logits_p"][1]
    torch.testing.assert_close(acceptance(lp, lp, 1, kw), torch.ones(B, L - 2))
    idx = torch.arange(2, L, dtype=torch.long).expand(B, -1)
    direct = torch.minimum(window_target(lp, idx, **kw), window_target(lq, idx, **kw)).sum(-1)
    torch.testing.assert_close(acceptance(lq, lp, 1, kw), direct)
    before = [float(acceptance(q, p, k, kw).mean().detach()) for k, (q, p) in enumerate(zip(r["logits_q"], r["logits_p"]))]
    opt = torch.optim.Adam(d.parameters(), lr=3e-3)
    for _ in range(25):
        opt.zero_grad()
        drafter_losses(d, m, feats, codes, depths=2, sampling=sampling)["tv"].backward()
        opt.step()
    r = drafter_losses(d, m, feats, codes, depths=2, sampling=sampling)
    after = [float(acceptance(q, p, k, kw).mean().detach()) for k, (q, p) in enumerate(zip(r["logits_q"], r["logits_p"]))]
    assert all(a > b + 0.05 for a, b in zip(after, before)), (before, after)
    assert abs(float(r["tv"].detach()) - (1 - (after[0] + 0.8 * after[1]) / 1.8)) < 1e-5  # depth weights 1, 0.8


def test_attention_free_head_keeps_no_cache_and_its_file_says_so(tmp_path, tiny_gpt):
    """arch=mlp: no KV cache, a state that depends only on its own slot's (feature, token) pair (so drafting a
    chain or a tree cannot read a stale slot), a file that loads back as mlp; files without the arch field load
    as a block (drafters written before it); unknown archs are refused in one line."""
    from vgen.models.drafter import ARCHS
    d = make_drafter(tiny_gpt, seed=3, arch="mlp")
    assert not d.attends and d.new_cache(tiny_gpt, 2) is None and ARCHS == ("block", "mlp")
    assert make_drafter(tiny_gpt).attends
    f = torch.randn(2, 5, tiny_gpt.config.dim)
    x = torch.randint(0, tiny_gpt.vocab_size, (2, 5))
    pos = torch.arange(5)
    whole = d(tiny_gpt, f, x, pos)
    last = d(tiny_gpt, f[:, -1:], x[:, -1:], pos[-1:])
    torch.testing.assert_close(whole[:, -1:], last)
    save_drafter(d, tmp_path / "m.safetensors")
    back = load_drafter(tmp_path / "m.safetensors")
    assert back.arch == "mlp" and set(back.state_dict()) == set(d.state_dict())
    a, st = sample(tiny_gpt, [0, 1], "eagle", seed=3, window=3, draft=back, cfg_scale=2.0, tree="2,1")
    assert a.shape == (2, 16) and st["accepted_per_step"] >= 1.0
    from vgen.io import read_safetensors, save_safetensors
    block = make_drafter(tiny_gpt)
    save_drafter(block, tmp_path / "b.safetensors")
    state, meta = read_safetensors(tmp_path / "b.safetensors", "")
    save_safetensors(state, tmp_path / "old.safetensors", metadata={k: v for k, v in meta.items() if k != "arch"})
    assert load_drafter(tmp_path / "old.safetensors").arch == "block"
    save_safetensors(state, tmp_path / "odd.safetensors", metadata={**meta, "arch": "rnn"})
    with pytest.raises(VGenError, match="arch 'rnn'"):
        load_drafter(tmp_path / "odd.safetensors")
    with pytest.raises(VGenError, match="unknown drafter arch"):
        Drafter(tiny_gpt.config, "rnn")


def codes_folder(folder, model, n_train: int, n_test: int):
    """A folder the recipe's ``codes=`` takes (codes_train.pt / codes_test.pt) of ``model``'s own AR samples."""
    folder.mkdir()
    for split, n, seed in (("train", n_train, 0), ("test", n_test, 1000)):
        labels = torch.arange(n) % 4
        toks, _ = sample(model, labels, "ar", seed=seed, cfg_scale=2.0, top_k=8)
        torch.save({"codes": toks.to(torch.int16), "labels": labels}, folder / f"codes_{split}.pt")
    return folder


def test_drafter_recipe_learns_resumes_installs_and_the_pipeline_samples(tmp_path, tiny_pipeline, tiny_var_pipeline):
    """`vgen train recipe=drafter` on a folder of cached codes (the official-checkpoint path): the head learns (held-out
    one-step acceptance above an untrained head's), resumes, installs next to the pipeline, and the pipeline's
    eagle sampler then runs with it; bad inputs are refused before a run folder exists."""
    import json

    import vgen
    from vgen.train.common import RunDir
    from vgen.train.drafter import DrafterTrainConfig, cached_features, evaluate, train_drafter
    pipe = vgen.load_pipeline(str(tiny_pipeline))
    codes = codes_folder(tmp_path / "codes", pipe.model, 96, 16)
    cfg = DrafterTrainConfig(out=str(tmp_path / "run"), model=str(tiny_pipeline), codes=str(codes), n_train=96,
                             n_test=16, steps=40, batch_size=8, save_every=20, warmup=2, lr=3e-3, install=True)
    m = train_drafter(cfg)
    te = torch.load(codes / "codes_test.pt", weights_only=True)
    feats = cached_features(RunDir(tmp_path / "run"), pipe.model, te["codes"], te["labels"], "test")  # the cache
    torch.manual_seed(0)
    untrained = evaluate(Drafter(pipe.model.config).eval(), pipe.model, feats, te["codes"].long(),
                         pipe.card.sampling)
    assert m["test_acceptance"] > untrained["test_acceptance"] + 0.05, (m, untrained)
    cfg.steps = 50
    train_drafter(cfg)
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r.get("final")] == [40, 50]
    card = json.loads((tiny_pipeline / "pipeline.json").read_text())
    assert card["drafter"] == "drafter.safetensors" and (tiny_pipeline / "drafter.safetensors").is_file()
    g = vgen.load_pipeline(str(tiny_pipeline)).generate([0, 3], sampler="eagle", seed=1, window=3)
    assert g.tokens.shape == (2, 16) and g.stats["accepted_per_step"] >= 1.0
    for bad, msg in ((dict(codes=str(tmp_path / "nope")), "is not a folder"),
                     (dict(model=str(tiny_var_pipeline)), "not a next-token model over codes"),
                     (dict(arch="rnn"), "not a drafter architecture")):
        out = tmp_path / "refused"
        with pytest.raises(VGenError, match=msg):
            train_drafter(DrafterTrainConfig(**{**dict(out=str(out), model=str(tiny_pipeline), codes=str(codes)),
                                                **bad}))
        assert not out.exists()


def test_drafter_recipe_self_samples_are_the_targets_own_and_resume(tmp_path, tiny_pipeline):
    """``self_samples``: the sequences are exactly the pipeline's own samples (seed i per sequence, whatever the
    chunking), a stopped run extends its cache instead of starting over, and the recipe trains on them and logs the
    held-out numbers on the target's samples beside the crops' ones; a negative count is refused."""
    import vgen
    from vgen.train.common import RunDir
    from vgen.train.drafter import DrafterTrainConfig, self_codes, train_drafter
    pipe = vgen.load_pipeline(str(tiny_pipeline))
    run = RunDir(tmp_path / "cache")
    c5, l5 = self_codes(run, pipe, 5, 100, "s", chunk=2)  # chunks 2, 2, 1
    assert torch.load(run.path / "s.pt", weights_only=True)["codes"].shape[0] == 5
    c8, l8 = self_codes(run, pipe, 8, 100, "s", chunk=2)  # resumes at 5
    k = pipe.model.num_classes
    ref = pipe.generate([i % k for i in range(8)], seed=100, batch_size=8, compile=False)
    assert torch.equal(c8.long(), ref.tokens) and torch.equal(l8, ref.labels.long()) and torch.equal(c8[:5], c5)
    assert c8.dtype == torch.int16 and not torch.equal(c8[0], c8[k])  # same class, other seed: other sequence

    codes = codes_folder(tmp_path / "codes", pipe.model, 32, 8)
    cfg = DrafterTrainConfig(out=str(tmp_path / "run"), model=str(tiny_pipeline), codes=str(codes), n_train=32,
                             n_test=8, steps=4, batch_size=8, save_every=2, warmup=1, self_samples=16)
    m = train_drafter(cfg)
    assert {"test_acceptance", "self_test_acceptance"} <= set(m) and 0 < m["self_test_acceptance"] <= 1
    d = torch.load(tmp_path / "run" / "self_train.pt", weights_only=True)
    assert d["codes"].shape == (16, pipe.model.seq_len)
    assert torch.load(tmp_path / "run" / "self_test.pt", weights_only=True)["codes"].shape[0] == 8
    out = tmp_path / "refused"
    with pytest.raises(VGenError, match="self_samples must be >= 0"):
        train_drafter(DrafterTrainConfig(out=str(out), model=str(tiny_pipeline), codes=str(codes), self_samples=-1))
    assert not out.exists()


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_drafter_recipe_trains_chained_depths_from_an_init(tmp_path, tiny_pipeline):
    """``depths=3`` (EAGLE-3's training-time test) fine-tuning a depth-1 head (``init=``) logs the acceptance of the
    chained depths and raises depth 2's and 3's above what the same steps of teacher forcing alone reach from the
    same head; the run starts from the init's weights; bad depths and a head of another arch are refused."""
    import json

    import vgen
    from vgen.train.common import RunDir
    from vgen.train.drafter import DrafterTrainConfig, cached_features, evaluate, train_drafter
    pipe = vgen.load_pipeline(str(tiny_pipeline))
    codes = codes_folder(tmp_path / "codes", pipe.model, 96, 16)
    base = dict(model=str(tiny_pipeline), codes=str(codes), n_train=96, n_test=16, batch_size=8, warmup=2, lr=3e-3)
    train_drafter(DrafterTrainConfig(out=str(tmp_path / "d1"), steps=30, save_every=30, **base))
    init = str(tmp_path / "d1" / "drafter.safetensors")
    runs = {}
    for depths in (1, 3):
        out = tmp_path / f"ft{depths}"
        runs[depths] = train_drafter(DrafterTrainConfig(out=str(out), steps=40, save_every=40, init=init,
                                                        depths=depths, **base))
    start = train_drafter(DrafterTrainConfig(out=str(tmp_path / "zero"), steps=0, save_every=1, init=init,
                                             depths=3, **base))
    log = json.loads((tmp_path / "d1" / "log.jsonl").read_text().splitlines()[-1])
    assert abs(start["test_acceptance"] - log["test_acceptance"]) < 1e-6  # step 0 is the init's head
    assert {"test_acceptance_d2", "test_acceptance_d3"} <= set(runs[3]) and "test_acceptance_d2" not in runs[1]
    assert start["test_acceptance_d2"] < start["test_acceptance"]  # chained drafts are worse, before training them
    te = torch.load(codes / "codes_test.pt", weights_only=True)
    feats = cached_features(RunDir(tmp_path / "ft1"), pipe.model, te["codes"], te["labels"], "test")
    tf = evaluate(load_drafter(tmp_path / "ft1" / "drafter.safetensors"), pipe.model, feats, te["codes"].long(),
                  pipe.card.sampling, depths=3)  # the teacher-forced run's head, scored at depths 2, 3
    assert abs(tf["test_acceptance"] - runs[1]["test_acceptance"]) < 1e-6
    for k in ("test_acceptance_d2", "test_acceptance_d3"):
        assert runs[3][k] > max(start[k], tf[k]) + 0.01, (k, runs[3], tf, start)
    # accept_weight: the same fine-tuning plus the acceptance term, which the recipe logs and lowers (from this
    # weak a head it does not beat the run above held out: it fine-tunes a good head, docs/zoo.md)
    train_drafter(DrafterTrainConfig(out=str(tmp_path / "tv"), steps=40, save_every=40, init=init, depths=3,
                                     accept_weight=1.0, **base))
    tvs = [json.loads(x)["tv"] for x in (tmp_path / "tv" / "log.jsonl").read_text().splitlines() if "tv" in x]
    assert len(tvs) == 4 and tvs[-1] < tvs[0] - 0.1, tvs
    for bad, msg in ((dict(depths=0), "depths must be >= 1"), (dict(depth_decay=0.0), "depth_decay in"),
                     (dict(init=init, arch="mlp"), "holds a 'block' head but arch=mlp"),
                     (dict(accept_weight=-1.0), "accept_weight")):
        out = tmp_path / "refused"
        with pytest.raises(VGenError, match=msg):
            train_drafter(DrafterTrainConfig(out=str(out), **{**base, **bad}))
        assert not out.exists()


def test_train_cli_takes_the_target_as_model_and_refuses_bad_targets(tmp_path, tiny_var_pipeline, capsys,
                                                                     monkeypatch):
    from vgen.cli import main
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out = work / "run"
    with pytest.raises(SystemExit) as e:
        main(["train", "recipe=drafter", f"model={tiny_var_pipeline}", f"recipe.out={out}"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "not a next-token model over codes" in err and len(err.splitlines()) == 1, err
    assert not any(work.iterdir())  # refused: nothing written


@pytest.mark.slow
def test_shipped_draft_head_accepts_far_more_than_jacobi_drafts():
    """photos-gpt ships a trained head (vgen/zoo/photos-gpt/drafter.safetensors): at window 4 it decides 3.0 tokens
    per pass on this model (measured on 8 images), SJD's Jacobi drafts about 1.6."""
    import vgen
    if "photos-gpt" not in vgen.list_models():
        pytest.skip("zoo weights not installed")
    pipe = vgen.load_pipeline("photos-gpt")
    assert pipe.card.drafter == "drafter.safetensors"
    labels = [0, 5, 9, 14]
    e = pipe.generate(labels, sampler="eagle", seed=0, window=4, batch_size=4)
    s = pipe.generate(labels, sampler="sjd", seed=0, window=4, init="vertical", batch_size=4)
    assert e.stats["accepted_per_step"] > 2.2, e.stats["accepted_per_step"]
    assert e.stats["accepted_per_step"] > s.stats["accepted_per_step"] + 0.5
    # a wide window under LANTERN's rule at eagle's default delta (0.2): most drafts pass (5.25 tokens per pass on
    # these 4 images, 5.55 on the bench's 8), more than the exact rule at the same window (4.17) or delta 0.1 (4.61)
    wide = dict(sampler="eagle", seed=0, window=8, batch_size=4)
    ex, lt = pipe.generate(labels, verify="token", **wide), pipe.generate(labels, accept="lantern", **wide)
    lt1 = pipe.generate(labels, accept="lantern", delta=0.1, **wide)
    assert lt.stats["accepted_per_step"] > 5.0, lt.stats["accepted_per_step"]
    assert lt.stats["accepted_per_step"] > max(ex.stats["accepted_per_step"], lt1.stats["accepted_per_step"]) + 0.4
    # the exact rule's default, block verification, keeps more of a long chain than draft-by-draft checks (4.57
    # against 4.17 tokens per pass at window 8 on these 4 images; 3.01 against 2.91 at window 4)
    bl = pipe.generate(labels, **wide)
    assert bl.stats["accepted_per_step"] > ex.stats["accepted_per_step"] + 0.25, bl.stats["accepted_per_step"]


def test_window_auto_times_windows_to_4_then_6_and_8():
    from vgen.samplers import get_sampler
    widths = {m: get_sampler("eagle", max_window=m).timed_widths() for m in (2, 3, 5, 8, 10)}
    assert widths == {2: [2], 3: [2, 3], 5: [2, 3, 4, 5], 8: [2, 3, 4, 6, 8], 10: [2, 3, 4, 6, 8, 10]}
    assert get_sampler("eagle").timed_widths() == [2, 3, 4, 6, 8]  # the default max_window
    assert get_sampler("eagle", tree="3,2,1").timed_widths() == [16]  # a tree: its own window only


def test_window_auto_times_ar_and_each_window_once_per_job_batch(tiny_gpt, tmp_path, monkeypatch):
    """window=auto: AR's loop and windows 2..max_window are timed once (cached per batch size); the job then runs
    the fastest window, whose tokens are that fixed window's, or AR's loop (AR's tokens) when none beats it."""
    import json

    from vgen.samplers.speculative import widths as speculative
    monkeypatch.setenv("VGEN_CACHE", str(tmp_path))
    d = make_drafter(tiny_gpt, seed=1)
    kw = dict(cfg_scale=2.0, top_k=10, draft=d)
    auto, st = sample(tiny_gpt, [0, 1, 2], "eagle", seed=4, max_window=3, **kw)
    table = json.loads((tmp_path / "spec_speed.json").read_text())
    (speeds,) = table.values()
    assert set(speeds) == {"1", "2", "3"} and all(min(v) > 0 for v in speeds.values())
    best = speculative.timed_choice({int(w): v for w, v in speeds.items()})
    if best > 1:
        want, _ = sample(tiny_gpt, [0, 1, 2], "eagle", seed=4, window=best, **kw)
    else:
        want, _ = sample(tiny_gpt, [0, 1, 2], "ar", seed=4, cfg_scale=2.0, top_k=10)
    assert torch.equal(auto, want)
    monkeypatch.setattr(speculative, "TIMED_MARGIN", 1e9)  # nothing can pay: AR's loop, AR's tokens, no new timing
    ar_loop, st = sample(tiny_gpt, [0, 1, 2], "eagle", seed=4, max_window=3, **kw)
    ar, _ = sample(tiny_gpt, [0, 1, 2], "ar", seed=4, cfg_scale=2.0, top_k=10)
    assert torch.equal(ar_loop, ar) and st["mean_window"] == 1.0
    assert json.loads((tmp_path / "spec_speed.json").read_text()) == table


def test_eagle_small_jobs_skip_the_timing(tiny_gpt, tmp_path, monkeypatch):
    """eagle window=auto in a job smaller than TIMED_JOB_RATIO x the timing's samples, as sjd: no timing (nothing
    cached), the prior's chain width or AR's loop (its tokens exactly), or with a tree the tree or AR's loop; a job
    that repays it is timed."""
    from vgen.samplers.base import sampling_job
    from vgen.samplers.speculative import widths
    monkeypatch.setenv("VGEN_CACHE", str(tmp_path))
    from vgen.samplers.speculative import prior
    monkeypatch.setattr(widths, "TIMED_JOB_RATIO", 4)
    monkeypatch.setattr(prior, "PRIOR_BUDGET", 1e6)  # as a long job's budget (the tiny model's 32 tokens are short)
    kw = dict(cfg_scale=2.0, top_k=10, draft=make_drafter(tiny_gpt, seed=1))

    def as_chosen(st, **more):
        if st["window"] == 1:
            return sample(tiny_gpt, [0, 1], "ar", seed=2, cfg_scale=2.0, top_k=10)[0]
        return sample(tiny_gpt, [0, 1], "eagle", seed=2, window=st["window"], **more, **kw)[0]
    small, st = sample(tiny_gpt, [0, 1], "eagle", seed=2, **kw)
    assert st["window_rule"] == "prior" and st["window"] in (1, 2, 3, 4, 6, 8)
    assert torch.equal(small, as_chosen(st))
    tree, st = sample(tiny_gpt, [0, 1], "eagle", seed=2, tree="2,1", **kw)
    assert st["window_rule"] == "prior" and st["window"] in (1, 5)  # the tree's 4 nodes + 1, or AR's loop
    assert torch.equal(tree, as_chosen(st, tree="2,1"))
    assert not (tmp_path / "spec_speed.json").exists()
    with sampling_job(widths.TIMED_JOB_RATIO * widths.timing_samples([2, 3], 2), 2):
        _, st = sample(tiny_gpt, [0, 1], "eagle", seed=2, max_window=3, **kw)
    assert (tmp_path / "spec_speed.json").exists() and st["window_rule"] == "timed"


# ---- static trees ------------------------------------------------------------------------------------------------

def test_tree_shapes_parse_and_refuse_bad_ones():
    from vgen.kernels.tree import LANTERN_PP, StaticTree, parse_tree
    t = StaticTree.build(parse_tree("lantern++"))
    assert t.size == 25 == len(LANTERN_PP) and t.depth_max == 5
    assert t.n_children[0] == 4 and [len(level[0]) for level in t.levels] == [4, 8, 8, 3, 2]
    full = parse_tree("3,2,1")
    assert len(full) == 3 + 6 + 6 and full[:3] == ((0,), (1,), (2,)) and parse_tree("3-2-1") == full
    assert parse_tree("0|1|0.0") == ((0,), (1,), (0, 0))
    # the ancestor table: (0, 0, 0) sees the root, (0,), (0, 0) and itself only
    t = StaticTree.build(parse_tree("2,2,1"))
    i = 1 + t.paths.index((0, 0, 0))
    assert t.anc[i].nonzero().flatten().tolist() == [0, 1 + t.paths.index((0,)), 1 + t.paths.index((0, 0)), i]
    for bad in ("0|0.1", "0|2", "0|0|1", "x", "3,0"):
        with pytest.raises(VGenError, match="tree"):
            parse_tree(bad)


@pytest.mark.parametrize("children", ["sample", "top"])
def test_tree_verification_keeps_the_target_distribution_per_node(children):
    """The multi-candidate rule alone, enumerated: a root with three candidates proposed from a q far from p (i.i.d.
    draws, or q's three most likely tokens as one-hot proposals); over 200k uniforms the decided first token follows
    p (chi-square), and a wrong target (q) is rejected by the same counts (power)."""
    from vgen.kernels.tree import StaticTree, parse_tree, tree_verify
    from vgen.samplers.speculative.rules import TokenRule
    g = torch.Generator().manual_seed(0)
    V, B = 6, 200_000
    p = torch.tensor([0.05, 0.3, 0.0, 0.25, 0.3, 0.1])
    qd = torch.tensor([0.4, 0.05, 0.3, 0.05, 0.1, 0.1])
    t = StaticTree.build(parse_tree("3"))
    if children == "sample":
        x = torch.multinomial(qd, 3 * B, replacement=True, generator=g).view(B, 3)
        q = qd.expand(B, 3, V)
    else:
        x = qd.topk(3).indices.expand(B, 3)
        q = torch.nn.functional.one_hot(x, V).float()
    pp = torch.cat([p.expand(B, 1, V), torch.full((B, 3, V), 1.0 / V)], 1)  # after each (leaf) node: anything
    path, k, tok = tree_verify(t, pp, q, x, torch.ones(B, 3, dtype=torch.bool), torch.rand(B, 3, generator=g),
                               torch.rand(B, generator=g), TokenRule())
    first = torch.where(k > 0, x.gather(1, (path[:, 0] - 1).clamp_min(0)[:, None]).squeeze(1), tok)
    counts = torch.bincount(first, minlength=V).double()
    assert counts[2] == 0  # p(2) = 0: never decided
    expect = p.double() * B
    m = expect > 0
    chi2 = ((counts[m] - expect[m]) ** 2 / expect[m]).sum()
    assert chi2 < 20.5, chi2  # 5 degrees of freedom: p = 0.001
    wrong = qd.double() * B
    assert ((counts - wrong) ** 2 / wrong).sum() > 1000
    assert 0.3 < (k > 0).double().mean() < 1.0  # some candidate is accepted often, not always


def test_tree_of_one_child_per_node_is_the_chain(tiny_gpt):
    """A tree with one child per node (``1,1``) verifies, keeps and drafts exactly as the chain of the same depth
    (window 3) checked draft by draft, as a tree's nodes are: the scratch slots, the tree masks and the moved cache
    entries change nothing but the arithmetic's order, so (almost) every token agrees."""
    d = make_drafter(tiny_gpt, seed=1)
    kw = dict(cfg_scale=2.0, top_k=10, draft=d)
    chain, cs = sample(tiny_gpt, [0, 1, 2, 3] * 2, "eagle", seed=7, window=3, verify="token", **kw)
    tree, ts = sample(tiny_gpt, [0, 1, 2, 3] * 2, "eagle", seed=7, tree="1,1", window=2, **kw)
    assert (chain == tree).float().mean() > 0.97
    assert len(ts["accepted_by_depth"]) == 2 and 0 <= ts["accepted_by_depth"][1] <= ts["accepted_by_depth"][0] <= 1
    assert ts["accepted_by_depth"][0] > 0 and cs["accepted_by_depth"] == pytest.approx(ts["accepted_by_depth"],
                                                                                       abs=0.05)


@pytest.mark.parametrize("children", ["sample", "top"])
def test_tree_drafting_is_batch_invariant_and_continues_prefixes(tiny_gpt, children):
    d = make_drafter(tiny_gpt, seed=1)
    kw = dict(cfg_scale=2.0, top_k=10, tree="2,2,1", window=2, children=children, draft=d)
    one = torch.cat([sample(tiny_gpt, [c], "eagle", seed=5 + i, **kw)[0] for i, c in enumerate([0, 1, 2, 1, 0])])
    many, st = sample(tiny_gpt, [0, 1, 2, 1, 0], "eagle", seed=5, batch_size=2, **kw)
    assert torch.equal(many, one)
    assert st["accepted_per_step"] > 1.0
    cont, _ = sample(tiny_gpt, [0, 1, 2, 1, 0], "eagle", seed=9, batch_size=3, prefix=one[:, :5], **kw)
    assert torch.equal(cont[:, :5], one[:, :5])


@pytest.mark.slow
@pytest.mark.parametrize("children", ["sample", "top"])
def test_eagle_tree_exact_matches_the_enumerated_distribution(micro, children):
    """Lossless with a tree (two children per node, depth 2, a random head far from the target): 10k batched
    samples (5k with top children) follow the enumerated joint; the unguided one is rejected (power)."""
    m, d, joint, unguided = micro
    n = N if children == "sample" else N // 2  # (both also checked per node over 200k draws, above)
    tokens, st = sample(m, [1] * n, "eagle", seed=0, tree="2,2", window=2, children=children, draft=d, **OPTS)
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, joint) > 1e-3
    assert chi2_p(counts, unguided) < 1e-6
    assert counts[joint == 0].sum() == 0
    assert st["accepted_per_step"] > 1.0


def _chain_law(V, gamma, seed):
    """A toy context-dependent target M_b and drafter M_s over V tokens (each with some zero-probability tokens, as
    top-k leaves), as tables keyed by prefix."""
    import itertools
    g = torch.Generator().manual_seed(seed)

    def dist():
        d = torch.rand(V, generator=g, dtype=torch.float64) ** 2
        if torch.rand(1, generator=g) < 0.3:
            d[torch.randint(V, (1,), generator=g)] = 0.0
        return d / d.sum()
    prefixes = [t for n in range(gamma + 1) for t in itertools.product(range(V), repeat=n)]
    return {t: dist() for t in prefixes}, {t: dist() for t in prefixes}


def _emitted_law(Mb, Ms, V, gamma, scale_residual=True):
    """The exact law of the first gamma + 1 tokens when block verification's output (the kept drafts, then the
    residual's token) is continued by the target: every draft chain enumerated, the kept prefix's probability from
    the kernel's h (the longest i with u_i < h_i), the residual norm(max(0, w_i p_i - q_i)). Also E[drafts kept]
    under block and token-by-token verification."""
    import itertools

    from vgen.kernels.verify import block_accepts
    law, e_block, e_token = {}, 0.0, 0.0
    for X in itertools.product(range(V), repeat=gamma):
        pq = 1.0
        for i in range(gamma):
            pq *= float(Ms[X[:i]][X[i]])
        if pq == 0:
            continue
        p = torch.stack([Mb[X[:i]] for i in range(gamma + 1)])[None]
        q = torch.stack([Ms[X[:i]] for i in range(gamma)])[None]
        x = torch.tensor(X)[None]
        px, qx = p[:, :-1].gather(-1, x[..., None])[..., 0], q.gather(-1, x[..., None])[..., 0]
        _, _, w, h = block_accepts(p, q, px, qx, torch.ones_like(x, dtype=torch.bool), torch.zeros_like(px),
                                   weights=True)
        w, h = [1.0] + w[0].tolist(), [1.0] + h[0].tolist()
        ratio = (px / qx).clamp_max(1.0)[0].tolist()
        for tau in range(gamma + 1):
            pt = h[tau]
            for j in range(tau + 1, gamma + 1):
                pt *= 1.0 - h[j]
            e_block += pq * pt * tau
            kept = 1.0  # token by token: the first tau drafts pass, the next one (if any) fails
            for a in ratio[:tau]:
                kept *= a
            e_token += pq * tau * kept * (1.0 - ratio[tau] if tau < gamma else 1.0)
            if pt == 0:
                continue
            qt = Ms[X[:tau]] if tau < gamma else torch.zeros(V, dtype=torch.float64)
            res = ((w[tau] if scale_residual else 1.0) * Mb[X[:tau]] - qt).clamp_min(0.0)
            res = res / res.sum()
            for y in range(V):
                head = X[:tau] + (y,)
                if res[y] == 0:
                    continue
                for tail in itertools.product(range(V), repeat=gamma - tau):
                    z, pz = head + tail, pq * pt * float(res[y])
                    for i in range(tau + 1, gamma + 1):
                        pz *= float(Mb[z[:i]][z[i]])
                    law[z] = law.get(z, 0.0) + pz
    return law, e_block, e_token


@pytest.mark.parametrize("V,gamma,seed", [(3, 2, 0), (3, 3, 2), (4, 3, 0)])
def test_block_verification_is_exact_enumerated_and_never_keeps_fewer_drafts(V, gamma, seed):
    """Block verification, enumerated over every draft chain (V = 3-4, chains of 2-3 drafts, context-dependent toy
    target and drafter with zero-probability tokens): the emitted tokens continued by the target have the target's
    joint law to 1e-12; the same enumeration without the residual's weight w does not (power); and it keeps at
    least as many drafts in expectation as token-by-token verification, strictly more here."""
    import itertools
    Mb, Ms = _chain_law(V, gamma, seed)
    law, e_block, e_token = _emitted_law(Mb, Ms, V, gamma)
    target = {}
    for z in itertools.product(range(V), repeat=gamma + 1):
        pz = 1.0
        for i in range(gamma + 1):
            pz *= float(Mb[z[:i]][z[i]])
        target[z] = pz
    err = max(abs(law.get(z, 0.0) - pz) for z, pz in target.items())
    assert err < 1e-12, err
    wrong, _, _ = _emitted_law(Mb, Ms, V, gamma, scale_residual=False)
    assert max(abs(wrong.get(z, 0.0) - pz) for z, pz in target.items()) > 1e-3
    assert e_block > e_token + 0.02, (e_block, e_token)  # measured +0.03 to +0.10 drafts


def test_block_verification_keeps_the_longest_prefix_under_its_h():
    """The kernel's draw: k is the longest prefix i with u_i < h_i; over 200k uniforms for one chain, P(k = i) =
    h_i prod_(j > i) (1 - h_j); a draft past the image ends the block (h = w at the draft before it)."""
    from vgen.kernels.verify import block_accepts
    Mb, Ms = _chain_law(4, 3, 5)
    X = (1, 2, 0)
    while any(float(Ms[X[:i]][X[i]]) == 0 for i in range(3)):  # a chain the drafter can draw
        X = tuple((t + 1) % 4 for t in X)
    B = 200_000
    p = torch.stack([Mb[X[:i]] for i in range(4)])[None].expand(B, -1, -1)
    q = torch.stack([Ms[X[:i]] for i in range(3)])[None].expand(B, -1, -1)
    x = torch.tensor(X)[None].expand(B, -1)
    px, qx = p[:, :-1].gather(-1, x[..., None])[..., 0], q.gather(-1, x[..., None])[..., 0]
    u = torch.rand(B, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    k, scale, w, h = block_accepts(p, q, px, qx, torch.ones_like(x, dtype=torch.bool), u, weights=True)
    h = [1.0] + h[0].tolist()
    law = [h[i] * float(torch.tensor([1 - h[j] for j in range(i + 1, 4)], dtype=torch.float64).prod())
           for i in range(4)]
    counts = torch.bincount(k, minlength=4).double()
    expect = torch.tensor(law, dtype=torch.float64) * B
    m = expect > 0
    assert ((counts[m] - expect[m]) ** 2 / expect[m]).sum() < 16.3  # 3 degrees of freedom: p = 0.001
    assert torch.equal(scale, torch.cat([torch.ones(B, 1, dtype=w.dtype), w], 1).gather(1, k[:, None])[:, 0])
    inside = torch.tensor([[True, True, False]]).expand(B, -1)
    qi = torch.where(inside[..., None], q, 0.0)
    _, _, w2, h2 = block_accepts(p, qi, px, qx, inside, u, weights=True)
    assert torch.allclose(h2[0, 1], w2[0, 1]) and h2[0, 2] == 0
