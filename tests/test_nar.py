"""NAR: the proximity mask, the anti-diagonal order, the step count, and sampling from the model's own
factorisation (exact distributions on a tiny random model)."""
import pytest
import torch
from exact import chi2_p, counts_of, exact_joint, tv

from vgen.errors import VGenError
from vgen.interfaces import NextNeighbourModel, Order, TokenType
from vgen.kernels.proximity import anti_diagonals, average_heads, grid_sources, neighbour_sources, proximity_mask
from vgen.samplers import sample


# ---- mask and order -------------------------------------------------------------------------------------------
def test_proximity_mask_who_sees_whom_on_small_grids():
    m = proximity_mask((3, 3), cond_len=1)
    assert m.shape == (10, 10)
    assert m[0].tolist() == [True] + [False] * 9  # the condition sees only itself
    assert m[1:, 0].all()  # every token sees the condition

    def sees(a, b):  # raster token a attends to raster token b
        return bool(m[1 + a, 1 + b])
    # (0,1)=1 and (1,0)=3 share anti-diagonal 1: they see each other (after raster order too)
    assert sees(1, 3) and sees(3, 1)
    assert sees(4, 0) and sees(4, 1) and sees(4, 3) and sees(4, 2) and sees(4, 6)  # (1,1): diags 0..2
    assert not sees(4, 5) and not sees(4, 7) and not sees(4, 8)  # later diagonals stay hidden
    assert not sees(0, 1) and sees(8, 0) and sees(8, 7)
    # in general: a sees b iff diag(b) <= diag(a)
    for a in range(9):
        for b in range(9):
            assert sees(a, b) == (sum(divmod(b, 3)) <= sum(divmod(a, 3)))
    # a rectangular grid with a 2-position condition: causal among the condition
    r = proximity_mask((2, 3), cond_len=2)
    assert r[:2, :2].tolist() == [[True, False], [True, True]] and not r[:2, 2:].any()
    assert r[2 + 5, 2:].all() and r[2 + 2].tolist()[2:] == [True, True, True, True, True, False]


def test_anti_diagonals_and_neighbour_sources():
    d = anti_diagonals((3, 4))
    assert len(d) == 3 + 4 - 1
    assert [t.tolist() for t in d] == [[0], [1, 4], [2, 5, 8], [3, 6, 9], [7, 10], [11]]
    assert sorted(torch.cat(d).tolist()) == list(range(12))
    right, down = neighbour_sources((3, 4), 1, ((0, 1), (1, 0)))  # diagonal 1 [1, 4] -> diagonal 2 [2, 5, 8]
    assert right.tolist() == [0, 1, -1]  # 2 <- right of 1, 5 <- right of 4, 8 is in the first column
    assert down.tolist() == [-1, 0, 1]  # 2 is in the first row, 5 <- below 1, 8 <- below 4
    with pytest.raises(ValueError, match="next anti-diagonal"):
        neighbour_sources((3, 4), 1, ((1, 1),))


def test_video_grids_three_heads_brute_force():
    """(t, h, w) grids: the same rules in three dimensions, checked against plain loops."""
    import itertools
    shape = (2, 3, 2)
    coords = list(itertools.product(*[range(s) for s in shape]))  # raster order
    m = proximity_mask(shape, cond_len=1)
    for a, ca in enumerate(coords):
        for b, cb in enumerate(coords):
            assert bool(m[1 + a, 1 + b]) == (sum(cb) <= sum(ca))
    d = anti_diagonals(shape)
    assert len(d) == 2 + 3 + 2 - 2
    assert [t.tolist() for t in d] == [[i for i, c in enumerate(coords) if sum(c) == k] for k in range(5)]
    offsets = ((0, 0, 1), (1, 0, 0), (0, 1, 0))  # right, next frame, down
    for k in range(4):
        srcs = neighbour_sources(shape, k, offsets)
        for j, t in enumerate(d[k + 1].tolist()):
            for off, src in zip(offsets, srcs):
                s = tuple(c - o for c, o in zip(coords[t], off))
                want = d[k].tolist().index(coords.index(s)) if s in coords else -1
                assert int(src[j]) == want
    full = grid_sources(shape, offsets)
    for t, c in enumerate(coords):
        for off, src in zip(offsets, full):
            s = tuple(x - o for x, o in zip(c, off))
            assert int(src[t]) == (coords.index(s) if s in coords else -1)
    with pytest.raises(ValueError, match="dimensions"):
        neighbour_sources(shape, 0, ((0, 1),))


def test_average_heads_means_over_the_heads_that_reach():
    shape = (2, 2, 2)
    offsets = ((0, 0, 1), (1, 0, 0), (0, 1, 0))
    torch.manual_seed(0)
    heads = [torch.randn(2, 8, 5) for _ in offsets]
    got = average_heads(heads, [s[1:] for s in grid_sources(shape, offsets)])
    for t in range(1, 8):
        c = divmod(t, 4)[0], divmod(t % 4, 2)[0], t % 2
        parts = []
        for off, hl in zip(offsets, heads):
            s = tuple(x - o for x, o in zip(c, off))
            if min(s) >= 0:
                parts.append(hl[:, s[0] * 4 + s[1] * 2 + s[2]])
        torch.testing.assert_close(got[:, t - 1], sum(parts) / len(parts))
    assert torch.equal(got[:, 6], (heads[0][:, 6] + heads[1][:, 3] + heads[2][:, 5]) / 3)  # token (1,1,1)


class _VideoHeads(torch.nn.Module):
    """A stand-in next-neighbour model on a (t, h, w) grid with three heads (right, next frame, down): each
    head at token p puts its mass on (p's token + head number + 1) mod V, so greedy decoding is predictable."""
    token_shape = (3, 2, 4)
    neighbour_offsets = ((0, 0, 1), (1, 0, 0), (0, 1, 0))
    order = Order.NEXT_NEIGHBOUR
    token_type = TokenType.codes(7)
    vocab_size, num_classes, cond_len = 7, 2, 1
    seq_len = 24

    def __init__(self):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.seen = []

    def null_cond(self, cond):
        return torch.full_like(cond, self.num_classes)

    def new_cache(self, batch_size):
        from vgen.kernels.kv_cache import KVCache
        return KVCache(1, batch_size, 1, 1 + self.seq_len, 2, torch.float32, "cpu")

    def prefill(self, cond, cache):
        return torch.nn.functional.one_hot(cond % self.vocab_size, self.vocab_size).float() * 10

    def decode_neighbours(self, tokens, input_pos, cache):
        self.seen.append(input_pos.tolist())
        return tuple(torch.nn.functional.one_hot((tokens + k + 1) % self.vocab_size, self.vocab_size).float() * 10
                     for k in range(3))


def test_nar_sampler_runs_video_grids_with_a_time_head():
    """The sampler takes the grid and the heads from the model: t + h + w - 2 passes, one diagonal each."""
    import itertools
    m = _VideoHeads()
    assert isinstance(m, NextNeighbourModel)  # the Protocol is all the sampler needs
    tokens, st = sample(m, [1], "nar", top_k=1, cfg_scale=1.0)
    shape = m.token_shape
    assert st["forward_passes"] == 3 + 2 + 4 - 2 == len(m.seen) + 1
    coords = list(itertools.product(*[range(s) for s in shape]))
    assert st["step_map"][0].tolist() == [sum(c) for c in coords]
    assert [p for p in m.seen] == [[1 + t for t in d.tolist()] for d in anti_diagonals(shape)[:-1]]
    # greedy: a token reached by one head k is its source + k + 1; with several heads the averaged logits tie
    # and argmax takes the lowest token value among them
    want = {(0, 0, 0): 1}
    for c in sorted(coords, key=sum)[1:]:
        cands = [(want[s] + k + 1) % 7 for k, off in enumerate(m.neighbour_offsets)
                 if min(s := tuple(x - o for x, o in zip(c, off))) >= 0]
        want[c] = min(cands)
    assert tokens[0].tolist() == [want[c] for c in coords]


# ---- sampler ------------------------------------------------------------------------------------------------
def test_nar_takes_h_plus_w_minus_1_passes_at_any_batch_size():
    from vgen.models import build
    torch.manual_seed(0)
    m = build("nar", dim=32, n_layer=1, n_head=2, vocab_size=16, num_classes=2, block_size=256).eval()
    for n, bs in ((1, None), (3, None)):
        tokens, st = sample(m, [0] * n, "nar", seed=0, batch_size=bs)
        assert st["forward_passes"] == 31 and tokens.shape == (n, 256)
        assert torch.equal(st["step_map"][0].view(16, 16), torch.arange(16)[:, None] + torch.arange(16)[None, :])
        assert st["accepted_per_step"] == pytest.approx(256 / 31)


def test_nar_seeds_are_per_sample_and_stats(tiny_nar):
    a, st = sample(tiny_nar, [0, 1, 2, 3], "nar", seed=5, cfg_scale=2.0, top_k=8)
    b, _ = sample(tiny_nar, [2], "nar", seed=7, cfg_scale=2.0, top_k=8)
    assert torch.equal(a[2], b[0])
    c, _ = sample(tiny_nar, [0, 1, 2, 3], "nar", seed=5, cfg_scale=2.0, top_k=8, batch_size=3)
    assert torch.equal(a, c)
    assert st["forward_passes"] == 7 and st["tokens"] == 64 and st["kv_cache_bytes"] > 0 and st["nll"] > 0
    d, _ = sample(tiny_nar, [0, 1, 2, 3], "nar", seed=6, cfg_scale=2.0, top_k=8)
    assert not torch.equal(a, d)


def test_nar_refuses_wrong_models_and_bad_options(tiny_nar, tiny_gpt):
    with pytest.raises(VGenError, match="next-neighbour model: use one of nar"):
        sample(tiny_nar, [0], "ar")
    with pytest.raises(VGenError, match="sampler 'nar' does next-neighbour generation"):
        sample(tiny_gpt, [0], "nar")
    with pytest.raises(VGenError, match="top_k"):
        sample(tiny_nar, [0], "nar", top_k=99)
    with pytest.raises(VGenError, match="class id 9 out of range"):
        sample(tiny_nar, [9], "nar")
    with pytest.raises(TypeError, match="decode_neighbours"):
        tiny_nar.decode(torch.zeros(1, 1, dtype=torch.long), torch.tensor([1]), tiny_nar.new_cache(1))


@pytest.fixture(scope="module")
def micro_nar():
    """vocab 4, 2x2 grid: 256 images, exact distribution enumerable; both heads informative."""
    from vgen.models import build
    torch.manual_seed(11)
    m = build("nar", dim=32, n_layer=1, n_head=2, vocab_size=4, num_classes=3, block_size=4)
    torch.nn.init.normal_(m.output.weight, std=0.2)
    torch.nn.init.normal_(m.medusa_output.weight, std=0.2)
    torch.nn.init.normal_(m.cls_embedding.embedding_table.weight, std=1.0)
    return m.eval()


@pytest.mark.parametrize("cfg,opts", [pytest.param(1.0, {}, marks=pytest.mark.slow),
                                      (2.0, {"top_k": 3, "temperature": 0.9})])
def test_nar_sampler_draws_from_the_models_own_factorisation(micro_nar, cfg, opts):
    """P(x) = p(x00 | c) * p(x01 | x00, c) p(x10 | x00, c) * p(x11 | x00, x01, x10, c): the teacher-forced NAR
    logits (proximity mask, heads averaged) give every factor; the cached one-diagonal-per-pass sampler must
    draw from exactly this joint."""
    seqs, joint = exact_joint(micro_nar, 1, cfg, **opts)
    assert abs(float(joint.sum()) - 1) < 1e-4
    p = joint.double().numpy()
    assert (p > 1e-3).sum() > 20  # not a near-deterministic model: the test has power
    n = 20000
    tokens, st = sample(micro_nar, [1] * n, "nar", seed=0, cfg_scale=cfg, batch_size=5000, **opts)
    assert st["forward_passes"] == 3 * 4  # 3 passes per batch of 5000
    counts = counts_of(tokens, 4)
    assert chi2_p(counts, p) > 1e-3
    assert tv(counts, p) < 0.05
    _, other = exact_joint(micro_nar, 0, cfg, **opts)  # and not some other distribution
    assert chi2_p(counts, other.double().numpy()) < 1e-6


def test_nar_joint_uses_both_heads(micro_nar):
    """Zeroing the down head changes the joint: interior tokens really average both heads."""
    seqs, joint = exact_joint(micro_nar, 1, 1.0)
    w = micro_nar.medusa_output.weight.detach().clone()
    try:
        with torch.no_grad():
            micro_nar.medusa_output.weight.zero_()
        _, joint0 = exact_joint(micro_nar, 1, 1.0)
    finally:
        with torch.no_grad():
            micro_nar.medusa_output.weight.copy_(w)
    assert 0.5 * float((joint - joint0).abs().sum()) > 0.05


# ---- pipeline and CLI ------------------------------------------------------------------------------------
@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_nar_pipeline_and_cli_sample(tiny_nar_pipeline, tmp_path, capsys):
    import json

    from vgen.cli import main
    from vgen.pipeline import Pipeline
    pipe = Pipeline.from_pretrained(str(tiny_nar_pipeline))
    assert pipe.card.order == "next-neighbour"
    g = pipe.generate([0, 1], seed=3)  # the model's own sampler (nar) by default
    assert g.images.shape[:2] == (2, 3) and g.images.dtype == torch.uint8 and g.stats["forward_passes"] == 7
    with pytest.raises(VGenError, match="use one of nar"):
        pipe.generate([0], sampler="sjd")
    out = tmp_path / "out"
    main(["sample", f"model.path={tiny_nar_pipeline}", "num_samples=2", f"outdir={out}"])
    stats = json.loads((out / "stats.json").read_text())
    assert stats["sampler"] == "nar" and stats["forward_passes"] == 7
    main(["sample", f"model.path={tiny_nar_pipeline}", "sampler=nar", "sampler.top_k=4", "num_samples=1",
          f"outdir={tmp_path / 'out2'}"])
    with pytest.raises(SystemExit):
        main(["sample", f"model.path={tiny_nar_pipeline}", "sampler=sjd", "num_samples=1", f"outdir={tmp_path / 'o3'}"])
    err = capsys.readouterr().err
    assert "sampler 'sjd' does next-token generation but this model (tinynar) is a next-neighbour model" in err
    assert not list((tmp_path / "o3").glob("*.png"))  # refused before any sampling


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_bench_takes_nar_ratios_from_the_compare_to_model(tiny_pipeline, tiny_nar, tiny_vq, tmp_path):
    """A NAR has no AR of its own: its speed-up and pass reduction come from the model its card names, and no
    drift is reported across two different models."""
    import json

    from vgen.cli import main
    from vgen.pipeline import save_pipeline
    nar = save_pipeline(tmp_path / "tinynar2", tiny_nar, tiny_vq, model_kind="nar", class_names=list("abcd"),
                        sampling={"cfg_scale": 2.0, "top_k": 8}, extra={"compare_to": str(tiny_pipeline)})
    out = tmp_path / "bench"
    main(["bench", f"models=[{tiny_pipeline},{nar}]", "samplers=[ar,nar]", "batch_sizes=[2]",
                 "repeats=1", "compile=false", "num_samples=2", "baseline=false", f"outdir={out}"])
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert {(r["model"], r["sampler"]) for r in rows} == {(str(tiny_pipeline), "ar"), (str(nar), "nar")}
    ar = next(r for r in rows if r["sampler"] == "ar")
    n = next(r for r in rows if r["sampler"] == "nar")
    assert n["forward_passes"] == 7 and n["pass_reduction"] == ar["forward_passes"] / 7 == 16 / 7
    assert n["speedup_vs_ar"] == ar["seconds"] / n["seconds"]
    assert "nll_excess" in ar and "nll_excess" not in n



@pytest.mark.parametrize("interval", [0, 2, 6])
def test_cfg_interval_means_the_same_for_ar_and_nar(tiny_gpt, tiny_nar, interval):
    """cfg_interval is LlamaGen's rule for every sampler: token t is guided iff t <= cfg_interval + 1. Checked
    greedily against teacher forcing on the generated tokens (the guided logits where the rule says so, the
    conditional ones elsewhere), for the raster AR sampler and per token of NAR's diagonals."""
    from vgen.samplers import sample
    for model, name in ((tiny_gpt, "ar"), (tiny_nar, "nar")):
        toks, _ = sample(model, [2, 1], name, seed=0, cfg_scale=5.0, cfg_interval=interval, top_k=1)
        cond = torch.tensor([2, 1])
        with torch.no_grad():
            lc, lu = model(toks, cond), model(toks, model.null_cond(cond))
        guided = (torch.arange(toks.shape[1]) <= interval + 1)[None, :, None]
        want = torch.where(guided, lu + 5.0 * (lc - lu), lc).argmax(-1)
        assert torch.equal(toks, want), name
        # power: past the interval, guided and conditional choices differ somewhere, so ignoring the rule fails
        late = ~guided[..., 0].expand_as(toks)
        assert ((lu + 5.0 * (lc - lu)).argmax(-1) != lc.argmax(-1))[late].any(), name
