"""Hugging Face Hub references resolved from a local HF cache, offline: a fake cache laid out as huggingface_hub
writes it (models--Owner--Repo/{refs/<rev>, blobs/<hash>, snapshots/<commit>/<file> -> ../../blobs/<hash>})."""
import hashlib
import io
import os

import pytest
import torch

from vgen import hub
from vgen.errors import VGenError
from vgen.models import build, load_official

pytest.importorskip("huggingface_hub")

REPO = "Owner/Repo"
FILE = "c2i_tiny.pt"


def put_snapshot(cache, repo_id, files: dict, revision="main", commit=None):
    """Write ``files`` (path in repo -> bytes) as the snapshot of ``revision`` in the HF cache ``cache``."""
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    commit = commit or hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    ref = folder / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)  # no newline: huggingface_hub reads the file verbatim
    snap = folder / "snapshots" / commit
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        entry = snap / name
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.symlink_to(os.path.relpath(blob, entry.parent))
    return snap


def tiny_gpt(seed):
    torch.manual_seed(seed)
    return build("gpt", dim=64, n_layer=2, n_head=2, vocab_size=32, num_classes=4, block_size=16)


def pt_bytes(model) -> bytes:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getvalue()


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0)


def assert_one_line(err, *words):
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty HF cache named by HF_HUB_CACHE, offline. huggingface_hub reads both variables once, at import:
    vgen.hub reads them at each call, so setting the environment is enough; the library's own offline flag is
    set too, so that nothing here can try the network."""
    import huggingface_hub.constants as constants
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def gpt_repo(hf_cache, tmp_path):
    """Owner/Repo: main holds model 0 as c2i_tiny.pt (and in sub/), tag v1 holds model 1; model 0 also on disk."""
    m0, m1 = tiny_gpt(0), tiny_gpt(1)
    put_snapshot(hf_cache, REPO, {FILE: pt_bytes(m0), f"sub/{FILE}": pt_bytes(m0)})
    put_snapshot(hf_cache, REPO, {FILE: pt_bytes(m1)}, revision="v1")
    local = tmp_path / "local.pt"
    torch.save(m0.state_dict(), local)
    return m0, m1, local


def test_parse_and_detect():
    assert hub.parse_hub_ref("hf://Owner/Repo/c2i_B_256.pt") == ("Owner/Repo", "c2i_B_256.pt")
    assert hub.parse_hub_ref("hf://Owner/Repo/sub/folder/") == ("Owner/Repo", "sub/folder")
    assert hub.parse_hub_ref("hf://Owner/Repo") == ("Owner/Repo", "")
    for bad in ("hf://Owner", "hf://", "Owner/Repo", "hf://Own er/Repo"):
        with pytest.raises(VGenError):
            hub.parse_hub_ref(bad)
    assert hub.is_hub_ref("hf://Owner/Repo/x.pt")
    assert not hub.is_hub_ref("Owner/Repo")  # a plain repo id needs filename=
    assert hub.is_hub_ref("Owner/Repo", filename="x.pt")
    assert not hub.is_hub_ref("./Owner/Repo", filename="x.pt")
    assert not hub.is_hub_ref({"a": torch.zeros(1)})


def test_environment_is_read_at_call_time(monkeypatch, tmp_path):
    import huggingface_hub.constants as constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for v in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(v, raising=False)
    assert hub._cache_dir() is None and not hub._offline()
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hub._cache_dir() == os.path.join(str(tmp_path), "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert hub._cache_dir() == str(tmp_path / "c")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub._offline()


def test_load_by_repo_and_filename_and_uri(gpt_repo):
    m0, m1, local = gpt_repo
    ref = load_official("gpt", local, n_head=2)
    assert_same_weights(ref, m0)
    assert_same_weights(load_official("gpt", REPO, filename=FILE, n_head=2), ref)
    assert_same_weights(load_official("gpt", f"hf://{REPO}/{FILE}", n_head=2), ref)
    assert_same_weights(load_official("gpt", f"hf://{REPO}/sub/{FILE}", n_head=2), ref)
    assert_same_weights(load_official("gpt", f"hf://{REPO}/sub", filename=FILE, n_head=2), ref)
    # revision= picks the tag's snapshot
    assert_same_weights(load_official("gpt", REPO, filename=FILE, revision="v1", n_head=2), m1)
    assert_same_weights(load_official("gpt", f"hf://{REPO}/{FILE}", revision="v1", n_head=2), m1)


def test_hub_file_keeps_the_name(gpt_repo, hf_cache):
    """The snapshot entry is returned, not the blob it links to: the suffix (.safetensors vs .pt) picks the reader."""
    from safetensors.torch import save_file
    m0 = gpt_repo[0]
    st = hf_cache.parent / "tmp.safetensors"
    save_file(m0.state_dict(), str(st))
    put_snapshot(hf_cache, "Owner/St", {"gpt.safetensors": st.read_bytes()})
    p = hub.hub_file("Owner/St", "gpt.safetensors")
    assert p.name == "gpt.safetensors" and p.is_symlink()
    assert_same_weights(load_official("gpt", "hf://Owner/St/gpt.safetensors", n_head=2), m0)


def test_missing_revision_file_or_repo_is_one_line(gpt_repo):
    with pytest.raises(VGenError) as e:
        load_official("gpt", REPO, filename=FILE, revision="nope", n_head=2)
    assert_one_line(e, REPO, FILE, "nope", "HF_HUB_OFFLINE=1", f"download {REPO} {FILE} --revision nope")
    with pytest.raises(VGenError) as e:
        load_official("gpt", REPO, filename="missing.pt", n_head=2)
    assert_one_line(e, REPO, "missing.pt", "not in the local Hugging Face cache", f"download {REPO} missing.pt")
    with pytest.raises(VGenError) as e:
        load_official("gpt", f"hf://{REPO}/missing.pt")
    assert_one_line(e, REPO, "missing.pt")
    with pytest.raises(VGenError) as e:
        load_official("gpt", "Nobody/Nothing", filename=FILE)
    assert_one_line(e, "Nobody/Nothing", FILE)
    with pytest.raises(VGenError) as e:
        load_official("gpt", f"hf://{REPO}")  # a repo, not a file
    assert_one_line(e, REPO, "filename=")


def test_local_path_wins(gpt_repo, tmp_path, monkeypatch):
    m0, m1, _ = gpt_repo
    work = tmp_path / "work"
    (work / REPO).mkdir(parents=True)
    torch.save(m1.state_dict(), work / REPO / FILE)  # the hub's main has m0
    monkeypatch.chdir(work)
    assert not hub.is_hub_ref(REPO, filename=FILE)
    assert_same_weights(load_official("gpt", REPO, filename=FILE, n_head=2), m1)
    assert_same_weights(load_official("gpt", f"hf://{REPO}/{FILE}", n_head=2), m0)  # hf:// always means the hub
    with pytest.raises(VGenError) as e:  # a revision of a local folder makes no sense: say so
        load_official("gpt", REPO, filename=FILE, revision="v1", n_head=2)
    assert_one_line(e, REPO, "hf://")


def test_state_dict_and_plain_paths_unchanged(gpt_repo):
    m0, _, local = gpt_repo
    sd = m0.state_dict()
    assert hub.resolve_checkpoint(sd) is sd
    assert hub.resolve_checkpoint(local) == local
    assert hub.resolve_checkpoint("no/such.pt") == "no/such.pt"  # read_checkpoint reports it
    with pytest.raises(VGenError):
        load_official("gpt", sd, filename=FILE)


def test_hub_folder(hf_cache, tiny_pipeline):
    from vgen.pipeline import Pipeline
    files = {p.name: p.read_bytes() for p in tiny_pipeline.iterdir() if p.is_file()}
    assert "pipeline.json" in files
    snap = put_snapshot(hf_cache, "Owner/Pipes", {**files, **{f"sub/folder/{k}": v for k, v in files.items()}})
    folder = hub.hub_folder("Owner/Pipes")
    assert folder == snap and (folder / "pipeline.json").exists()
    sub = hub.hub_folder(*hub.parse_hub_ref("hf://Owner/Pipes/sub/folder"))
    assert sub == snap / "sub" / "folder" and (sub / "pipeline.json").exists()
    pipe = Pipeline.from_pretrained(str(sub))  # the symlinked safetensors load as a pipeline folder
    assert pipe.num_classes == 4
    import vgen
    by_ref = vgen.load_pipeline("hf://Owner/Pipes/sub/folder")  # the Hub reference, resolved offline
    assert by_ref.card.folder == sub
    assert torch.equal(by_ref.generate([1], seed=2).tokens, pipe.generate([1], seed=2).tokens)
    put_snapshot(hf_cache, "Owner/NoCard", {"weights.pt": b"0"})
    with pytest.raises(VGenError, match="no pipeline.json"):
        vgen.load_pipeline("hf://Owner/NoCard")
    with pytest.raises(VGenError) as e:
        hub.hub_folder("Owner/Pipes", "nope")
    assert_one_line(e, "Owner/Pipes", "nope")
    with pytest.raises(VGenError) as e:
        hub.hub_folder("Owner/Pipes", revision="v9")
    assert_one_line(e, "Owner/Pipes@v9", "HF_HUB_OFFLINE=1")
    with pytest.raises(VGenError) as e:
        hub.hub_folder("Nobody/Nothing")
    assert_one_line(e, "Nobody/Nothing", "not in the local Hugging Face cache")
