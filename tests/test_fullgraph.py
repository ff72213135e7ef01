"""The decode steps compile as one graph each (issue 47): `torch.compile(..., fullgraph=True)` raises on any graph
break, and a graph break is where a hidden host sync (a `.item()`, a Python branch on a tensor) would sit. Dynamo's
tracing is what is checked (backend "eager": no inductor build), on the CPU; the tokens must equal the eager
step's. `pytest -k fullgraph` selects these."""
import pytest
import torch

import vgen.samplers.ar
import vgen.samplers.pjd
import vgen.samplers.speculative.scheduler
import vgen.samplers.zipar
from vgen.samplers import sample

COMPILED = []  # the step functions handed to fullgraph (each test checks that its step really went through it)


def fullgraph(fn, dynamic=False, device="cpu"):
    import torch._dynamo
    torch._dynamo.reset()
    COMPILED.append(fn.__name__)
    return torch.compile(fn, fullgraph=True, backend="eager", dynamic=dynamic)


SLOW = pytest.mark.slow  # quick loop: one step of each kind (AR's, the rows', the speculative core's)
CASES = [
    ("ar", vgen.samplers.ar, {}),
    pytest.param("ar", vgen.samplers.ar, dict(draw="gumbel"), marks=SLOW),
    pytest.param("zipar", vgen.samplers.zipar, dict(window=2), marks=SLOW),
    pytest.param("pjd", vgen.samplers.pjd, dict(lag=2, window=3, rows=3), marks=SLOW),
    ("sjd", vgen.samplers.speculative.scheduler, dict(window=4, init="vertical")),
    pytest.param("scd", vgen.samplers.speculative.scheduler, dict(window=4), marks=SLOW),
    pytest.param("sjd", vgen.samplers.speculative.scheduler, dict(window=4, coupling="maximal"), marks=SLOW),
]


@pytest.mark.parametrize("name,module,opts", CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_fullgraph_decode_step(tiny_gpt, monkeypatch, name, module, opts):
    kw = dict(seed=3, cfg_scale=2.0, top_k=8, **opts)
    eager, st_e = sample(tiny_gpt, [0, 1, 2], name, **kw)
    monkeypatch.setattr(module, "compiled", fullgraph)
    COMPILED.clear()
    traced, st_c = sample(tiny_gpt, [0, 1, 2], name, compile=True, **kw)
    assert COMPILED and COMPILED[0].endswith("_step")
    assert torch.equal(eager, traced)
    assert st_e["forward_passes"] == st_c["forward_passes"]


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_fullgraph_eagle_chain_step(tiny_gpt, monkeypatch):
    from vgen.models.drafter import Drafter
    torch.manual_seed(0)
    d = Drafter(tiny_gpt.config, "block").eval()
    kw = dict(seed=3, cfg_scale=2.0, top_k=8, window=4, draft=d)
    eager, _ = sample(tiny_gpt, [0, 1, 2], "eagle", **kw)
    monkeypatch.setattr(vgen.samplers.speculative.scheduler, "compiled", fullgraph)
    COMPILED.clear()
    traced, _ = sample(tiny_gpt, [0, 1, 2], "eagle", compile=True, **kw)
    assert COMPILED == ["chain_step"]
    assert torch.equal(eager, traced)


def test_fullgraph_catches_a_host_read():
    """Power: a step that reads a value on the host does not compile as one graph."""
    def leaky(x):
        if x.sum().item() > 0:
            return x + 1
        return x - 1

    with pytest.raises(Exception):
        fullgraph(leaky)(torch.ones(3))
