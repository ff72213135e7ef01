"""Quantizing while loading (load_official(..., quantize=), load_pipeline(..., quantize=)): the same bytes as loading
in float and quantizing after, for both file formats, every dtype cast and the zoo's model kinds; the lazy readers;
the fallbacks; and the peak memory a load adds (vgen.eval.load_memory, in fresh processes)."""
import json
import os
import struct
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from guards import needs_zoo
from safetensors.torch import save_file

from vgen.errors import VGenError
from vgen.kernels.quant import Int4Linear, Int8Linear, quantize_model
from vgen.models.loading import Mapped, Stored, build, load_official, parameters_on_meta, read_checkpoint, streamable

CONFIG = dict(vocab_size=64, dim=64, n_layer=2, n_head=4, num_classes=10, block_size=16)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    model = build("gpt", **CONFIG)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    d = tmp_path_factory.mktemp("ckpt")
    save_file(sd, str(d / "m.safetensors"))
    torch.save({"model": sd}, d / "m.pt")  # LlamaGen's release layout
    return d


def same(a: nn.Module, b: nn.Module) -> list[str]:
    """Names of the tensors (state dict and every buffer, non-persistent ones too) that differ in value or dtype."""
    ta, tb = a.state_dict(), b.state_dict()
    assert ta.keys() == tb.keys()
    ba, bb = dict(a.named_buffers()), dict(b.named_buffers())
    assert ba.keys() == bb.keys()
    return [k for k in ta if ta[k].dtype != tb[k].dtype or not torch.equal(ta[k], tb[k])] + \
        [k for k in ba if ba[k].dtype != bb[k].dtype or not torch.equal(ba[k], bb[k])]


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_quantized_while_loading_is_the_same_bytes_as_quantized_after(files, fmt, mode, dtype):
    path = files / f"m.{fmt}"
    after = load_official("gpt", path, dtype=dtype, n_head=4, block_size=16)
    quantize_model(after, mode, 32)
    streamed = load_official("gpt", path, dtype=dtype, quantize=mode, n_head=4, block_size=16)
    assert same(after, streamed) == []
    kinds = {type(m) for m in streamed.modules()}
    assert (Int8Linear if mode == "int8" else Int4Linear) in kinds and nn.Linear not in kinds
    assert not any(t.is_meta for t in list(streamed.parameters()) + list(streamed.buffers()))
    x = torch.randint(0, 64, (2, 6))
    cond = torch.tensor([1, 2])
    with torch.inference_mode():
        assert torch.equal(after(x, cond), streamed(x, cond))


@pytest.mark.parametrize("name", ["photos-var", "photos-mar", pytest.param("photos-gpt", marks=pytest.mark.slow),
                                  pytest.param("photos-t2i", marks=pytest.mark.slow)])
def test_zoo_pipelines_quantized_while_loading_match_pipe_quantize(name):
    """Every kind's builder under parameters_on_meta: GPT, VAR (its config is read from a small table's values),
    MAR (its diffusion head kept in float by quantize_skip), the text GPT; the recorded summary is the same."""
    from vgen.pipeline import load_pipeline
    a = load_pipeline(name)
    a.quantize("int8")
    b = load_pipeline(name, quantize="int8")
    assert same(a.model, b.model) == []
    assert a.quantization == b.quantization and b.quantization["quantized"] > 0


def zoo_names():
    """Every zoo model; GPT and VAR (whose tokenizer loads whole) in the quick loop, the rest in the slow set."""
    import vgen
    return [n if n in ("photos-gpt", "photos-var") else pytest.param(n, marks=pytest.mark.slow)
            for n in vgen.list_models()]


@pytest.mark.parametrize("name", zoo_names())
def test_every_zoo_model_and_tokenizer_streams_to_the_bytes_load_state_dict_gives(name):
    """A float load streams too (built on meta, filled tensor by tensor): model and tokenizer of every zoo card are
    the same bytes as building in memory and calling load_state_dict (the path a class with its own state-dict
    reading, or a checkpoint missing keys, still takes)."""
    from vgen.cards import Card
    card = Card.load(name)
    files = [(card.model_kind, card.model_path, card.model_config), (card.tokenizer_kind, card.tokenizer_path, {})]
    streamed = [load_official(kind, path, **cfg) for kind, path, cfg in files]
    whole = [load_official(kind, path, stream=False, **cfg) for kind, path, cfg in files]
    for a, b in zip(streamed, whole):
        assert same(a, b) == []


def test_a_state_dict_given_in_memory_is_copied_not_shared():
    """load_official(kind, state_dict) streams from the caller's tensors: the model owns copies, as load_state_dict
    gave it (training the source model must not move the loaded one)."""
    torch.manual_seed(0)
    src = build("gpt", **CONFIG)
    sd = src.state_dict()
    model = load_official("gpt", sd, n_head=4, block_size=16)
    before = model.output.weight.detach().clone()
    with torch.no_grad():
        sd["output.weight"].add_(1.0)
    assert torch.equal(model.output.weight, before)


def test_safetensors_are_read_one_tensor_at_a_time_and_truncation_is_named(files, tmp_path):
    sd, _ = read_checkpoint(files / "m.safetensors", lazy=True)
    assert all(isinstance(v, Stored) for v in sd.values())
    from safetensors.torch import load_file
    full = load_file(str(files / "m.safetensors"))
    assert all(torch.equal(sd[k].read(), full[k]) for k in full)
    data = (files / "m.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 100])
    with pytest.raises(VGenError, match="truncated"):
        read_checkpoint(tmp_path / "cut.safetensors", lazy=True)
    (tmp_path / "head.safetensors").write_bytes(struct.pack("<Q", 10 ** 9) + b"{}")
    with pytest.raises(VGenError, match="not a readable safetensors file"):
        load_official("gpt", tmp_path / "head.safetensors", quantize="int8")


def test_mapped_tensors_read_right_after_their_pages_are_dropped(files):
    """The .pt file memory-mapped: a read copies the tensor and drops its pages; reading it again (and its
    neighbours, whose pages may have been dropped with it) gives the file's values."""
    sd, _ = read_checkpoint(files / "m.pt", lazy=True)
    ref, _ = read_checkpoint(files / "m.pt")
    assert all(isinstance(v, Mapped) for v in sd.values())
    first = {k: v.read() for k, v in sd.items()}
    again = {k: v.read() for k, v in sd.items()}
    assert all(torch.equal(first[k], ref[k]) and torch.equal(again[k], ref[k]) for k in ref)
    assert all(first[k].data_ptr() != sd[k].tensor.data_ptr() for k in ref)  # copies, not views of the file


def test_parameters_on_meta_is_undone_even_when_the_build_fails():
    """Inside, parameters land on meta and the initialisers' in-place ops leave a meta tensor alone (a real one still
    gets its values); outside, both patches are gone, even after an error."""
    from vgen.models.loading import META_SKIPPED
    register = nn.Module.register_parameter
    ops = {name: getattr(torch.Tensor, name) for name in META_SKIPPED}
    with parameters_on_meta():
        lin = nn.Linear(4, 3)
        norm = nn.LayerNorm(3)
        emb = nn.Embedding(5, 2)  # its initialiser is normal_
        real = torch.zeros(3).normal_().clamp_(-0.5, 0.5)
        assert torch.Tensor.normal_ is not ops["normal_"]
    assert lin.weight.is_meta and norm.bias.is_meta and emb.weight.is_meta and emb.weight.shape == (5, 2)
    assert real.abs().max() <= 0.5 and real.abs().sum() > 0
    with pytest.raises(ValueError), parameters_on_meta():
        raise ValueError
    assert nn.Module.register_parameter is register and not nn.Linear(2, 2).weight.is_meta
    assert all(getattr(torch.Tensor, name) is op for name, op in ops.items())


LOAD_CHILD = """
import json, sys
import vgen
pipe = vgen.load_pipeline("photos-gpt")  # a GPT and a VQ tokenizer with an l2-normalised codebook
loaded = "torch._dynamo" in sys.modules
gen = pipe.generate([1], seed=0, sampler="sjd", window=4)
print(json.dumps([loaded, "torch._dynamo" in sys.modules, gen.images.shape[0]]))
"""


@pytest.mark.slow
def test_loading_and_eager_sampling_leave_dynamo_unloaded():
    """Building a zoo model to load it runs no meta op through torch._refs (whose first use imports torch._dynamo,
    about 3.4 s of a `vgen sample` on a 2-core host), and eager sampling imports it neither. One fresh interpreter."""
    needs_zoo("photos-gpt")
    r = subprocess.run([sys.executable, "-c", LOAD_CHILD], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [False, False, 1], r.stdout


def test_a_model_reading_its_state_dict_its_own_way_is_loaded_whole_then_quantized(files):
    """streamable() refuses a class that overrides how a state dict loads (and a checkpoint missing keys); the load
    then builds the float model, loads it and quantizes it: the same result."""
    import vgen.models.gpt as gpt

    class Own(gpt.GPT):
        def _load_from_state_dict(self, *args, **kwargs):
            return super()._load_from_state_dict(*args, **kwargs)
    with parameters_on_meta():
        m = Own(gpt.GPTConfig(**CONFIG))
    shapes = {k: torch.empty_like(v, device="meta") for k, v in m.state_dict().items()}
    assert not streamable(m, shapes)
    with parameters_on_meta():
        m = build("gpt", **CONFIG)
    assert streamable(m, shapes)
    assert not streamable(m, {k: v for k, v in shapes.items() if "output" not in k})
    path = files / "m.pt"
    streamed = load_official("gpt", path, quantize="int8", n_head=4, block_size=16)
    whole = load_official("gpt", path, quantize="int8", n_head=4, block_size=16, stream=False)
    assert same(whole, streamed) == [] and any(type(x) is Int8Linear for x in whole.modules())


def test_load_memory_refuses_unknown_settings_before_anything():
    from omegaconf import OmegaConf

    from vgen.eval import load_memory
    for bad, match in [({"load_shapes": ["Z"]}, "unknown load_shapes"),
                       ({"load_shapes": ["cpu-S"], "load_formats": ["bin"]}, "unknown load_formats"),
                       ({"load_shapes": ["cpu-S"], "load_quantize": ["int3"]}, "not a weight format")]:
        with pytest.raises(VGenError, match=match):
            load_memory.check(OmegaConf.create(bad))
    assert load_memory.check(OmegaConf.create({})) == []
    assert load_memory.check(OmegaConf.create({"load_shapes": ["janus-pro-1b"]})) == ["janus-pro-1b"]


@pytest.mark.slow
def test_quantizing_while_loading_adds_less_memory_than_loading_in_float_then_quantizing(tmp_path):
    """cpu-M (45M parameters, 170 MB in float32) saved as LlamaGen releases it (.pt) and loaded in fresh processes:
    quantized while loading, the load adds less than half of what loading the float model whole adds (measured: 137
    MB against 384: its float embedding table and the output head's quantization stay), and a streamed float32 load
    less than three quarters of a whole one (214 MB). vgen.eval.load_memory measures both formats and the
    quantize-after loads (+experiment=quantized-load)."""
    from vgen.eval import load_memory
    path = load_memory.save_shape("cpu-M", tmp_path, "pt")
    cells = {m: load_memory.measure(path, "cpu-M", m) for m in ("float32-whole", "float32", "int8")}
    added = {m: c["peak_mb"] - c["base_mb"] for m, c in cells.items()}
    assert added["int8"] < 0.5 * added["float32-whole"], added
    assert added["float32"] < 0.75 * added["float32-whole"], added
    assert cells["int8"]["weight_mb"] < 0.45 * cells["float32"]["weight_mb"]
    r = {"modes": list(cells), "shapes": {"cpu-M": {"pt": {"file_mb": path.stat().st_size / 2 ** 20, **cells}}}}
    assert "| cpu-M | pt (170 MB) | int8 |" in load_memory.markdown(r)


def hf_folder(family: str, tmp_path):
    """A save_pretrained folder of a tiny random model of the family, and the grid ``from_transformers`` takes."""
    from pathlib import Path

    from vgen.models.hf import shapes
    if family == "chameleon":  # Lumina-mGPT's fixture (its output layer tied to the input table)
        return Path(__file__).parent / "fixtures" / "lumina_tiny" / "model", {"height": 2, "width": 2}
    model = shapes.janus(codes=8, grid=(2, 2)) if family == "janus" else shapes.emu3(codes=8)
    model.save_pretrained(tmp_path / family)
    return tmp_path / family, {"boi_token_id": shapes.JANUS_BOI} if family == "janus" else {"height": 2, "width": 2}


@pytest.mark.parametrize("family", ["janus", "emu3", "chameleon"])
@pytest.mark.parametrize("mode,dtype", [("int8", torch.float32), ("int4", torch.float32), ("int8", torch.bfloat16)])
def test_transformers_models_quantize_their_decoder_as_it_loads(family, mode, dtype, tmp_path, monkeypatch):
    """from_pretrained(..., quantization_config=vgen's): every linear layer of the family's decoder is replaced by
    its int8 / int4 form inside transformers' load, as its weights arrive (the quantizer counts them), and the model
    is then the same bytes as one loaded in float and quantized after (quantize_weights finishing the input table);
    the layers outside the decoder (the image head, the vision tower, the VQ) stay as loaded."""
    pytest.importorskip("transformers")
    from vgen.models import from_transformers
    from vgen.models.hf import family_for_config
    from vgen.models.hf.quantizer import loaded_quantized, quantization_config
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import json
    folder, grid = hf_folder(family, tmp_path)
    fam = family_for_config(json.loads((folder / "config.json").read_text()))
    cls = fam.model_class()
    ref = from_transformers(cls.from_pretrained(folder, dtype=dtype, local_files_only=True), **grid)
    dec = fam.decoder(ref.hf)
    linears = sum(type(m) is nn.Linear for m in dec.modules())
    outside = sum(type(m) is nn.Linear for m in ref.hf.modules()) - linears
    assert linears > 0
    ref.quantize_weights(mode, 32)
    hf = cls.from_pretrained(folder, dtype=dtype, local_files_only=True,
                             quantization_config=quantization_config(mode, 32))
    assert loaded_quantized(hf) and hf.hf_quantizer.done == linears
    assert sum(type(m) is nn.Linear for m in hf.modules()) == outside
    model = from_transformers(hf, **grid)
    model.quantize_weights(mode, 32)  # the input table, as load_pipeline(..., quantize=) finishes it
    assert same(ref.hf, model.hf) == []


def test_load_pipeline_quantizes_a_transformers_folder_as_it_loads(tmp_path, monkeypatch):
    """load_pipeline(<folder>, quantize=) and the zoo's transformers model hand quantize= to from_pretrained: the
    decoder is quantized inside the load and the pipeline matches one quantized after, tokens included."""
    import vgen
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder, _ = hf_folder("janus", tmp_path)
    after = vgen.load_pipeline(str(folder))
    after.quantize("int4")
    pipe = vgen.load_pipeline(str(folder), quantize="int4")
    assert pipe.hf.hf_quantizer.done == 14 and same(after.hf, pipe.hf) == []
    assert pipe.quantization == after.quantization
    ids = torch.tensor([[0, 9, 11, 3], [0, 17, 12, 3]])
    assert torch.equal(pipe.generate(input_ids=ids, sampler="sjd", seed=0, window=3).tokens,
                       after.generate(input_ids=ids, sampler="sjd", seed=0, window=3).tokens)
    zoo = vgen.load_pipeline("photos-emu3", quantize="int8")
    assert zoo.hf.hf_quantizer.done == zoo.quantization["quantized"] > 0


@pytest.mark.slow
def test_a_transformers_release_quantized_while_loading_costs_less_than_quantized_after(tmp_path):
    """A Janus of 230M parameters saved in bfloat16 as releases are, each load in a fresh process (the loader of
    +experiment=quantized-load load_shapes=[janus-pro-1b]): quantized inside transformers' load, int8 costs the
    process less than loading in bfloat16 and quantizing after (measured: 0.65x against 1.49x the bfloat16 load at
    Janus-Pro-1B's shape) and holds less than the bfloat16 weights once every page is read."""
    from vgen.eval import load_memory
    from vgen.models.hf import shapes
    shapes.janus(hidden=1024, layers=8, heads=8, kv_heads=8, ffn=2816, vocab=32000, codes=1024, grid=(8, 8),
                 std=0.02).to(torch.bfloat16).save_pretrained(tmp_path / "janus")
    cells = {m: load_memory.measure(tmp_path / "janus", "janus", m) for m in ("bfloat16", "int8-after", "int8")}
    cost = {m: load_memory.cost(c) for m, c in cells.items()}
    held = {m: c["resident_mb"] - c["base_mb"] for m, c in cells.items()}
    assert cost["int8"] < 0.7 * cost["int8-after"], cost
    assert held["int8"] < 0.8 * held["bfloat16"], held
    assert cells["int8"]["weight_mb"] == cells["int8-after"]["weight_mb"] < 0.7 * cells["bfloat16"]["weight_mb"]
