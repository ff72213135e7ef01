"""Host round trips inside the decode loops (issue 47), counted on the CPU.

On a GPU every read of a device value on the host (``.item()``, ``.tolist()``, ``int(t)``, ``bool(t)``, boolean
indexing / ``nonzero``) waits for the device, and every tensor built from Python data inside the loop is a
host-to-device copy. Neither shows on a CPU clock, so they are counted here: a dispatch mode sees the aten ops
behind them (``_local_scalar_dense`` / ``item``, ``is_nonzero``, ``nonzero``, ``masked_select``, ``lift_fresh``)
and ``Tensor.tolist`` is wrapped. Each forward pass of the model opens a new interval; the counts of every interval
after the first pass are what the loop costs per pass. The budget: none per AR / ZipAR pass, at most one read (the
accepted counts) and no upload per speculative pass with a fixed window.
"""
import collections
import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vgen.samplers import sample

READS = ("_local_scalar_dense", "aten.item", "is_nonzero", "aten.nonzero", "masked_select")
UPLOADS = ("lift_fresh",)


class HostTrips(TorchDispatchMode):
    """Counts host reads and uploads per interval between forward passes."""

    def __init__(self):
        super().__init__()
        self.intervals = [collections.Counter()]

    def mark(self):
        self.intervals.append(collections.Counter())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if any(r in name for r in READS):
            self.intervals[-1]["reads"] += 1
        elif any(u in name for u in UPLOADS):
            self.intervals[-1]["uploads"] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting(model):
    """Count host trips while ``model`` samples; each ``decode`` / ``decode_features`` call (a forward pass over
    new tokens; a masked model's ``conditions``) opens an interval."""
    trips = HostTrips()
    tolist = torch.Tensor.tolist
    names = [k for k in ("decode", "decode_features", "conditions") if hasattr(model, k)]
    own = {k: model.__dict__.get(k) for k in names}  # methods patched on the instance already (restored after)

    def counted_tolist(self):
        trips.intervals[-1]["reads"] += 1
        return tolist(self)

    def marked(fn):
        def call(*a, **k):
            trips.mark()
            return fn(*a, **k)
        return call

    torch.Tensor.tolist = counted_tolist
    for k in names:
        setattr(model, k, marked(getattr(model, k)))
    try:
        with trips:
            yield trips
    finally:
        torch.Tensor.tolist = tolist
        for k in names:
            if own[k] is None:
                delattr(model, k)
            else:
                setattr(model, k, own[k])


def per_pass(trips):
    """The counts between consecutive passes (the loop), without the setup before the first pass and the
    statistics after the last."""
    return trips.intervals[2:-1]


@pytest.mark.parametrize("name,opts,reads", [
    ("ar", {}, 0),
    ("zipar", dict(window=2), 0),
    ("sjd", dict(window=4), 1),
    ("scd", dict(window=4), 1),
    ("sjd", dict(window=4, init="vertical", coupling="maximal"), 1),
    ("gsd", dict(window=4), 1),
    ("lantern", dict(window=4, delta=0.2), 1),
    ("eagle", dict(window=4), 1),
])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_host_round_trips_per_pass(tiny_gpt, name, opts, reads, device):
    """The budget on the CPU and, where there is one, on a GPU (where each read is a real wait)."""
    import torch.nn.functional as F

    from vgen.models.drafter import Drafter
    model = tiny_gpt.to(device)
    if name in ("gsd", "lantern"):
        opts = dict(opts, codebook=F.normalize(torch.randn(tiny_gpt.vocab_size, 8,
                                                           generator=torch.Generator().manual_seed(0)),
                                               dim=-1).to(device))
    if name == "eagle":
        torch.manual_seed(0)
        opts = dict(opts, draft=Drafter(tiny_gpt.config, "block").eval().to(device))
    with counting(model) as trips:
        tokens, st = sample(model, [0, 1, 2], name, seed=0, cfg_scale=2.0, top_k=8, **opts)
    assert tokens.device.type == device
    loop = per_pass(trips)
    assert len(loop) >= 5  # the loop really ran and was seen pass by pass
    worst = {k: max(c[k] for c in loop) for k in ("reads", "uploads")}
    assert worst == {"reads": reads, "uploads": 0}, loop


def test_the_counter_sees_a_read_and_an_upload(tiny_gpt):
    """Power: a `.item()` and a tensor built from a Python list inside the loop are counted."""
    step = tiny_gpt.decode

    def leaky(*a, **k):
        out = step(*a, **k)
        float(out[0, 0, 0].item())
        torch.tensor([1, 2])
        return out

    tiny_gpt.decode = leaky
    try:
        with counting(tiny_gpt) as trips:
            sample(tiny_gpt, [0], "ar", seed=0)
    finally:
        del tiny_gpt.decode
    loop = per_pass(trips)
    assert all(c["reads"] >= 1 and c["uploads"] >= 1 for c in loop)


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_continuous_ar_makes_no_round_trip_per_token():
    """AR over continuous tokens (a CAR model: the transformer step, then the diffusion head per token): no host read
    and no upload per token (the head's guidance and temperature constants are made once per device)."""
    from test_continuous import tiny_car
    model = tiny_car(0)
    with counting(model) as trips:
        tokens, _ = sample(model, [0, 1], "ar", seed=0, cfg_scale=2.0, num_sampling_steps=4)
    loop = per_pass(trips)
    assert len(loop) >= 5
    assert {k: max(c[k] for c in loop) for k in ("reads", "uploads")} == {"reads": 0, "uploads": 0}, loop


@pytest.mark.parametrize("rule", [pytest.param("exact", marks=pytest.mark.slow), "path"])
def test_cspd_reads_the_host_once_per_round_besides_its_redraws(monkeypatch, rule):
    """CSpD, per round (between the target's passes): one host read, every row's accepted count, plus one per chunk
    of residual proposals (exact rule) or of candidate paths (path rule) where a row was rejected (the rejected rows
    draw together, each from its own CPU generator), and no upload. Before, a round of the exact rule read the host
    22 times and uploaded once (micro models, this setting)."""
    import vgen.samplers.cspd as cspd
    from vgen.models.car import CAR, CARConfig

    def micro(seed):  # a 4 x 4 grid of 2-D tokens: enough rounds to see the loop
        torch.manual_seed(seed)
        m = CAR(CARConfig(dim=32, n_layer=1, n_head=2, num_classes=2, block_size=16, token_channels=2,
                          diffloss_d=1, diffloss_w=32, num_sampling_steps=6)).eval()
        g = torch.Generator().manual_seed(seed + 100)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn(p.shape, generator=g) / max(1, p.shape[-1]) ** 0.5)
        return m

    target, draft = micro(0), micro(1)
    name = "residual_draw" if rule == "exact" else "residual_path_draw"
    real = getattr(cspd, name)

    def counted(*a, **k):
        before = trips.intervals[-1]["reads"]
        out = real(*a, **k)
        trips.intervals[-1]["redraw_reads"] += trips.intervals[-1]["reads"] - before
        return out

    monkeypatch.setattr(cspd, name, counted)
    with counting(target) as trips:
        sample(target, [1, 0, 1, 1], sampler="cspd", draft=draft, seed=0, stop_sigma=0.3, clip_x0=3.0, num_draft=3,
               prefill_ratio=0.0, rule=rule)
    loop = per_pass(trips)
    assert len(loop) >= 3
    assert all(c["reads"] - c["redraw_reads"] == 1 and c["uploads"] == 0 for c in loop), loop
    assert any(c["redraw_reads"] >= 1 for c in loop)  # rows were rejected and redrawn in the rounds seen


def test_mar_makes_no_round_trip_per_pass():
    """MAR's passes (the encoder drops the unknown tokens by the schedule's count; the head's constants are made once):
    no host read and no upload per pass."""
    from test_mar import TINY

    from vgen.models import build
    torch.manual_seed(0)
    model = build("mar", **TINY).eval()
    with counting(model) as trips:
        sample(model, [0, 1], "mar", seed=0, cfg_scale=2.0, num_iter=8)
    loop = per_pass(trips)
    assert len(loop) >= 5
    assert {k: max(c[k] for c in loop) for k in ("reads", "uploads")} == {"reads": 0, "uploads": 0}, loop


def tensors_in(obj, seen=None):
    """Every tensor reachable from a step's argument (through tuples, lists, dicts and objects' attributes; an
    nn.Module's parameters and buffers are the graph's own static inputs and are not walked)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or obj is None or isinstance(obj, (int, float, str, bool, torch.nn.Module, type)):
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not callable(obj):
        items = list(vars(obj).values())
    else:
        return []
    return [t for x in items for t in tensors_in(x, seen)]


class StepRecorder:
    """Stands in for `compiled`: calls the step as it is and records, per call, the tensors it is given that are not
    static addresses (CUDA graphs would copy each into the graph) and the tensors it returns (cloned out)."""

    def __init__(self):
        self.calls = []

    def __call__(self, fn, **kw):
        def step(*args, **kwargs):
            given = tensors_in([args, kwargs])
            out = fn(*args, **kwargs)
            copied = [t for t in given if getattr(t, "_dynamo_static_input_type", None) is None]
            self.calls.append({"copied_in": len(copied), "shapes": [tuple(t.shape) for t in copied],
                               "cloned_out": len(tensors_in(out)), "addresses": [t.data_ptr() for t in given]})
            return out
        return step


SOURCES = [
    ("ar", {}),
    ("ar", dict(draw="gumbel")),
    ("zipar", dict(window=2)),
    ("sjd", dict(window=4)),
    ("scd", dict(window=4)),
    ("sjd", dict(window=4, init="vertical", coupling="maximal")),
    ("gsd", dict(window=4)),
    ("lantern", dict(window=4, delta=0.2)),
    ("eagle", dict(window=4)),
    ("eagle", dict(tree="2,2", window=4)),
    ("pac", dict(window=4, tree_width=2, tree_depth=2)),
    ("pac", dict(window=4, tree_width=2, tree_depth=1, chains="leaves", restart="mix")),
    ("sps", dict(window=4, draft="self@int8")),
]


@pytest.mark.parametrize("name,opts", SOURCES)
def test_a_compiled_pass_copies_nothing_in_clones_nothing_out_and_reads_once(tiny_gpt, monkeypatch, name, opts):
    """The budget for a compiled step, counted on the CPU with its device made static (as CUDA is): per
    pass, every tensor the step is given is a static address, the same one at every pass (a CUDA graph reads and
    updates it where it lies: nothing is copied in), the step returns no tensor (nothing is cloned out), and the
    host reads the counts once (none for AR and ZipAR). A second run gets the first one's addresses back (pooled), and
    both give the bytes of a run on an ordinary device."""
    import copy

    import torch.nn.functional as F

    import vgen.samplers.ar as ar
    import vgen.samplers.speculative.scheduler as scheduler
    import vgen.samplers.zipar as zipar
    from vgen.kernels import kv_cache
    from vgen.models.drafter import Drafter
    kw = dict(seed=0, cfg_scale=2.0, top_k=8, **opts)
    model = copy.deepcopy(tiny_gpt)
    if name in ("gsd", "lantern"):
        kw["codebook"] = F.normalize(torch.randn(model.vocab_size, 8, generator=torch.Generator().manual_seed(0)),
                                     dim=-1)
    if name == "eagle":
        torch.manual_seed(0)
        kw["draft"] = Drafter(model.config, "block").eval()
    if name == "sps":  # a draft model without a pipeline: the model's own int8 copy
        from vgen.kernels.quant import quantize_model
        kw["draft"] = copy.deepcopy(model)
        quantize_model(kw["draft"], "int8")
    plain, _ = sample(model, [0, 1, 2], name, **kw)
    monkeypatch.setattr(kv_cache, "STATIC_DEVICES", ("cpu",))
    monkeypatch.setattr(kv_cache, "_POOL", {})
    monkeypatch.setattr(kv_cache, "_BUFFERS", {})
    rec = StepRecorder()
    monkeypatch.setattr(scheduler, "compiled", rec)
    monkeypatch.setattr(zipar, "compiled", rec)
    monkeypatch.setattr(ar, "compiled", rec)
    with counting(model) as trips:
        first, _ = sample(model, [0, 1, 2], name, compile=True, **kw)
    assert len(rec.calls) >= 3, name  # the compiled step ran, pass by pass
    assert {c["copied_in"] for c in rec.calls} == {0}, rec.calls[0]["shapes"]
    assert {c["cloned_out"] for c in rec.calls} == {0}
    assert all(c["addresses"] == rec.calls[0]["addresses"] for c in rec.calls)
    reads = max(c["reads"] for c in per_pass(trips))
    assert reads == (0 if name in ("ar", "zipar") else 1)
    # the next run reuses the pooled state (the same addresses: recorded graphs replay) and gives the same bytes
    n = len(rec.calls)
    again, _ = sample(model, [0, 1, 2], name, compile=True, **kw)
    assert rec.calls[n]["addresses"] == rec.calls[0]["addresses"]
    assert torch.equal(first, plain) and torch.equal(again, plain)


def test_the_step_recorder_sees_a_copy_and_a_clone():
    """Power: a tensor made for each call (not static) and a returned tensor are counted."""
    rec = StepRecorder()
    step = rec(lambda state, x: x + state)
    state = torch.zeros(2)
    torch._dynamo.mark_static_address(state, guard=False)
    step(state, torch.ones(2))
    assert rec.calls[0]["copied_in"] == 1 and rec.calls[0]["cloned_out"] == 1
