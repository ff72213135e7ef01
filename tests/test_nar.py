"""NAR: the proximity mask, the anti-diagonal order, the step count, and sampling from the model's own
factorisation (exact distributions on a tiny random model)."""
import pytest
import torch

from exact import chi2_p, counts_of, exact_joint, tv
from vgen.errors import VGenError
from vgen.kernels.proximity import anti_diagonals, neighbour_sources, proximity_mask
from vgen.samplers import sample


# ---- mask and order -------------------------------------------------------------------------------------------
def test_proximity_mask_who_sees_whom_on_small_grids():
    m = proximity_mask(3, 3, cond_len=1)
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
    r = proximity_mask(2, 3, cond_len=2)
    assert r[:2, :2].tolist() == [[True, False], [True, True]] and not r[:2, 2:].any()
    assert r[2 + 5, 2:].all() and r[2 + 2].tolist()[2:] == [True, True, True, True, True, False]


def test_anti_diagonals_and_neighbour_sources():
    d = anti_diagonals(3, 4)
    assert len(d) == 3 + 4 - 1
    assert [t.tolist() for t in d] == [[0], [1, 4], [2, 5, 8], [3, 6, 9], [7, 10], [11]]
    assert sorted(torch.cat(d).tolist()) == list(range(12))
    right, down = neighbour_sources(3, 4, 1, ((0, 1), (1, 0)))  # diagonal 1 [1, 4] -> diagonal 2 [2, 5, 8]
    assert right.tolist() == [0, 1, -1]  # 2 <- right of 1, 5 <- right of 4, 8 is in the first column
    assert down.tolist() == [-1, 0, 1]  # 2 is in the first row, 5 <- below 1, 8 <- below 4
    with pytest.raises(ValueError, match="next anti-diagonal"):
        neighbour_sources(3, 4, 1, ((1, 1),))


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


@pytest.mark.parametrize("cfg,opts", [(1.0, {}), (2.0, {"top_k": 3, "temperature": 0.9})])
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
def test_nar_pipeline_and_cli_sample(tiny_nar_pipeline, tmp_path, capsys):
    import json

    from vgen.cli import main
    from vgen.pipeline import Pipeline
    pipe = Pipeline.from_pretrained(str(tiny_nar_pipeline))
    assert pipe.card["generation"] == "next-neighbour"
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
