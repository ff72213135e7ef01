"""The architecture's promises: a sampler defined in one file reaches the registry, the CLI's config group, the
demo's widgets and the fit checks with no other change; interfaces are Protocols the models satisfy; no module
imports another's private names; vgen/eval never imports vgen/train."""
import ast
import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from vgen.errors import VGenError

REPO = Path(__file__).resolve().parents[1]

GREEDY = textwrap.dedent('''
    import time
    from dataclasses import dataclass

    import torch

    from vgen.samplers.base import Sampler, TokenOptions, option, register_sampler


    @dataclass
    class GreedyOptions(TokenOptions):
        warmup: int = option(0, "tokens drawn by sampling before going greedy")


    @register_sampler
    class GreedySampler(Sampler):
        name = "greedy-test"
        Options = GreedyOptions

        def _sample(self, model, cond, seeds, progress, codebook=None):
            B, L = cond.shape[0], model.seq_len
            cache = model.new_cache(B)
            logits = model.prefill(cond, cache)
            out = torch.empty(B, L, dtype=torch.long)
            for t in range(L):
                out[:, t] = logits.argmax(-1)
                if t + 1 < L:
                    logits = model.decode(out[:, t:t + 1], torch.tensor([model.cond_len + t]), cache)[:, -1]
            return out, {"forward_passes": L, "tokens": B * L, "seconds": 0.0, "kv_cache_bytes": cache.nbytes,
                         "step_map": torch.arange(L).expand(B, L).clone()}
''')


@pytest.fixture
def greedy_module(tmp_path, monkeypatch):
    (tmp_path / "vgen_greedy_plugin.py").write_text(GREEDY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    mod = importlib.import_module("vgen_greedy_plugin")
    yield mod
    from vgen.samplers import base
    base._SAMPLERS.pop("greedy-test", None)  # noqa: SLF001  (the test cleans up what it registered)
    sys.modules.pop("vgen_greedy_plugin", None)


def test_a_sampler_in_one_file_reaches_every_consumer(greedy_module, tiny_gpt, tiny_pipeline, tiny_nar):
    import vgen
    from vgen.cards import Card
    from vgen.configs import sampler_schema
    from vgen.demo import option_fields
    from vgen.samplers import fitting_samplers
    assert "greedy-test" in vgen.list_samplers()
    assert "greedy-test" in fitting_samplers(tiny_gpt) and "greedy-test" not in fitting_samplers(tiny_nar)
    assert "greedy-test" in fitting_samplers(Card.load(str(tiny_pipeline)))
    node = sampler_schema(vgen.samplers.sampler_class("greedy-test"))
    assert {f.name for f in dataclasses.fields(node)} == {"name", "temperature", "top_k", "top_p", "cfg_scale",
                                                          "warmup"}
    assert "warmup" in option_fields()
    pipe = vgen.load_pipeline(str(tiny_pipeline))
    gen = pipe.generate([1, 2], sampler="greedy-test", cfg_scale=1.0)
    with torch.no_grad():
        want = pipe.model(gen.tokens, torch.tensor([1, 2])).argmax(-1)  # teacher forcing agrees with greedy
    assert torch.equal(gen.tokens, want)
    with pytest.raises(VGenError, match="warmup"):
        pipe.generate([1], sampler="greedy-test", warmup=float("nan"))
    with pytest.raises(VGenError, match="next-neighbour model: use one of nar"):
        vgen.samplers.get_sampler("greedy-test").validate(tiny_nar)


def test_samplers_declare_the_conditions_they_drive(tiny_gpt):
    """A sampler fits a model by its order and the conditions it reads (Sampler.conditionings): LlamaGen's own loop
    drives class and caption GPTs, not a transformers model's prompt token ids, and says so in one line; a
    transformers card states what its model reads (tokens) though it takes prompts."""
    import dataclasses

    from vgen.interfaces import ModelSpec
    from vgen.pipeline import load_card
    from vgen.samplers import check_fits, fitting_samplers
    spec = ModelSpec.of(tiny_gpt)
    tokens = dataclasses.replace(spec, conditioning="tokens")
    assert "llamagen-loop" in fitting_samplers(spec, include_hidden=True)
    assert "llamagen-loop" not in fitting_samplers(tokens, include_hidden=True)
    assert set(fitting_samplers(tokens)) == set(fitting_samplers(spec))  # every public token sampler drives both
    with pytest.raises(VGenError, match="drives models conditioned on class / text and .* reads tokens"):
        check_fits("llamagen-loop", tokens)
    emu3 = load_card("photos-emu3")
    assert emu3.conditioning == "text" and emu3.spec.conditioning == "tokens"


def test_models_satisfy_their_order_protocol(tiny_gpt, tiny_nar, tiny_var, tiny_vq, tiny_msvq):
    from vgen.interfaces import ModelSpec, NextNeighbourModel, NextScaleModel, NextTokenModel, Order, Tokenizer
    from vgen.samplers import plain_sampler
    for model, proto, order, plain in ((tiny_gpt, NextTokenModel, Order.NEXT_TOKEN, "ar"),
                                       (tiny_nar, NextNeighbourModel, Order.NEXT_NEIGHBOUR, "nar"),
                                       (tiny_var, NextScaleModel, Order.NEXT_SCALE, "var")):
        assert isinstance(model, proto) and model.order == order and plain_sampler(model) == plain
        spec = ModelSpec.of(model)
        assert spec.token_type.kind == "codes" and spec.vocab_size == model.vocab_size
        assert model.seq_len == int(torch.tensor(model.token_shape).prod())
    assert not isinstance(tiny_var, NextTokenModel)
    for tok in (tiny_vq, tiny_msvq):
        assert isinstance(tok, Tokenizer)


def test_tokenizers_round_trip_on_their_own_grid(tiny_vq, tiny_msvq):
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        codes = tiny_vq.encode(x)
        assert codes.shape == (2, 8, 8) and codes.dtype == torch.int64
        img = tiny_vq.decode(codes)
        assert img.shape == (2, 3, 16, 16)
        torch.testing.assert_close(img, tiny_vq.decode_codes(codes.flatten(1)))  # flat and grid forms agree
        side = tiny_msvq.patch_nums[-1] * tiny_msvq.config.downsample
        pyr = tiny_msvq.encode(torch.rand(2, 3, side, side) * 2 - 1)
        assert pyr.shape == (2, sum(p * p for p in tiny_msvq.patch_nums))
        assert tiny_msvq.decode(pyr).shape == (2, 3, side, side)


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def test_no_module_imports_another_modules_private_names():
    bad = []
    for path in (REPO / "vgen").rglob("*.py"):
        for module, names in _imports(path):
            if module.startswith("vgen"):
                bad += [f"{path.relative_to(REPO)}: from {module} import {n}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_eval_does_not_import_train():
    bad = [f"{p.relative_to(REPO)}: {m}" for p in (REPO / "vgen" / "eval").rglob("*.py")
           for m, _ in _imports(p) if m.startswith("vgen.train")]
    assert not bad, bad


@pytest.mark.slow
def test_importing_any_module_first_works():
    """Kinds register where they are defined: importing any one module first must not hit an import cycle.
    ``import vgen.x.y`` runs the package's ``__init__`` to the end first: for a module that ``import vgen`` itself
    loads, importing it first is importing ``vgen`` first (one fresh process checks those); each module it does not
    load gets a fresh process of its own."""
    import json
    mods = ["vgen.tokenizers.vq", "vgen.tokenizers.msvq", "vgen.models.var", "vgen.train.recipes"]
    first = subprocess.run([sys.executable, "-c", f"import json, sys; import vgen; import vgen.models as M; "
                            f"print(json.dumps([M.list_kinds(), [m for m in {mods!r} if m in sys.modules]]))"],
                           capture_output=True, text=True, cwd=REPO, timeout=300)
    assert first.returncode == 0, first.stderr[-500:]
    kinds, loaded = json.loads(first.stdout.strip().splitlines()[-1])
    assert "gpt" in kinds
    procs = {m: subprocess.Popen([sys.executable, "-c", f"import {m}; import vgen.models as M; print(M.list_kinds())"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
             for m in mods if m not in loaded}  # side by side: each is mostly the interpreter and torch importing
    for m, p in procs.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "gpt" in out, (m, err[-500:])


def test_both_pipelines_are_sampling_pipelines_and_record_what_compile_auto_decided(tiny_pipeline):
    """Jobs, the bench and the demo use either pipeline through vgen.interfaces.SamplingPipeline; both decide
    compile=auto for the whole call and record the decision (a bool) in the stats."""
    from vgen.hf_pipeline import TransformersPipeline
    from vgen.interfaces import SamplingPipeline
    from vgen.models.hf import shapes
    from vgen.pipeline import Pipeline
    pipe = Pipeline.from_pretrained(tiny_pipeline)
    hf = TransformersPipeline(shapes.janus(), None)
    assert isinstance(pipe, SamplingPipeline) and isinstance(hf, SamplingPipeline)
    assert pipe.generate([0], seed=0).stats["options"]["compile"] is False  # one short job: auto -> eager
    ids = torch.tensor([[shapes.JANUS_BOS, 5, 6]])
    assert hf.generate(input_ids=ids, seed=0).stats["options"]["compile"] is False
