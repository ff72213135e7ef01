"""The Gradio demo: handlers called directly, the app driven over HTTP with gradio_client, and the page
rendered in headless Chromium."""
import dataclasses
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from guards import needs_zoo

from vgen.errors import VGenError

# skipped without gradio (the demo extra), checked without importing it: gradio's import costs about 10 s, paid by
# each test worker at collection otherwise
pytestmark = pytest.mark.skipif(importlib.util.find_spec("gradio") is None,
                                reason="gradio (the demo extra) is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def demo():
    from vgen.demo import Demo
    return Demo()


@needs_zoo("photos-gpt")
@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_race_runs_ar_as_baseline_and_reports_speed(demo):
    res = demo.race("photos-gpt", None, "3: cat", 5, ["sjd"], {"window": 4, "init": "vertical", "top_k": 50})
    assert [r["sampler"] for r in res] == ["ar", "sjd"]
    ar, sjd = res
    assert ar["speedup"] == 1.0 and ar["forward_passes"] == 256 and sjd["forward_passes"] < 256
    assert sjd["pass_reduction"] == 256 / sjd["forward_passes"]
    assert sjd["options"] == {"window": 4, "init": "vertical", "top_k": 50}  # only what sjd accepts
    assert "window" not in ar["options"]
    # the demo's image is the pipeline's image for the same class, seed and options
    from vgen import load_pipeline
    ref = load_pipeline("photos-gpt").generate([3], sampler="sjd", seed=5, window=4, init="vertical", top_k=50)
    assert torch.equal(sjd["image"], ref.images[0])
    assert sjd["step_map"].shape == (256,) and int(sjd["step_map"].max()) < sjd["forward_passes"]


@needs_zoo("photos-gpt")
@pytest.mark.slow
def test_race_includes_scd_whose_image_is_ar_gumbel(demo):
    from vgen.demo import RACED
    assert "scd" in RACED
    res = demo.race("photos-gpt", None, "3: cat", 5, ["scd"], {"window": 8, "init": "vertical", "top_k": 50,
                                                               "coupling": "gumbel"})
    assert [r["sampler"] for r in res] == ["ar", "scd"]
    scd = res[1]
    assert scd["forward_passes"] < 256 and scd["options"]["coupling"] == "gumbel"
    from vgen import load_pipeline
    ref = load_pipeline("photos-gpt").generate([3], sampler="ar", seed=5, top_k=50, draw="gumbel")
    assert torch.equal(scd["image"], ref.images[0])  # coupled drafts: AR's Gumbel-drawn image


def test_ticked_samplers_include_eagle_only_with_a_draft_head():
    from vgen.cards import Card
    from vgen.demo import ticked
    from vgen.interfaces import Order, TokenType
    card = Card("gpt", Order.NEXT_TOKEN, 2, TokenType.codes(8))
    fits = ["ar", "sjd", "gsd", "lantern", "scd", "eagle", "zipar"]
    assert ticked(dataclasses.replace(card, drafter="drafter.safetensors"), fits) == ["ar", "sjd", "scd", "eagle"]
    assert ticked(card, fits) == ["ar", "sjd", "scd"]
    assert ticked(None, ["var", "scalekv"]) == ["var"]


@needs_zoo("photos-gpt")
@pytest.mark.slow
def test_race_with_the_shipped_draft_head(demo):
    import vgen
    if not vgen.load_pipeline("photos-gpt").card.drafter:
        pytest.skip("photos-gpt ships no draft head")
    res = demo.race("photos-gpt", None, "3: cat", 5, ["eagle"], {"window": 3, "top_k": 50})
    assert [r["sampler"] for r in res] == ["ar", "eagle"]
    eagle = res[1]
    assert eagle["forward_passes"] < 256 and eagle["options"]["window"] == 3
    ref = vgen.load_pipeline("photos-gpt").generate([3], sampler="eagle", seed=5, window=3, top_k=50)
    assert torch.equal(eagle["image"], ref.images[0])


def test_heatmap_shows_the_decode_step(demo):
    from vgen.demo import step_heatmap
    m = step_heatmap(torch.arange(16), (4, 4), size=64)
    assert m.shape == (64, 64, 3) and m.dtype == np.uint8
    assert not np.array_equal(m[0, 0], m[-1, -1])  # first and last token differ in colour


@pytest.mark.parametrize("args, msg", [
    (("nope", None, 0, 0, ["ar"]), "unknown zoo model"),
    (("photos-gpt", None, 99, 0, ["ar"]), "out of range"),
    (("photos-gpt", None, "dog", 0, ["ar"]), "unknown class"),
    (("photos-gpt", None, 0, -1, ["ar"]), "seed must be"),
    (("photos-gpt", None, 0, 1.5, ["ar"]), "seed must be"),
    (("photos-gpt", None, 0, 0, []), "at least one sampler"),
    (("photos-gpt", None, 0, 0, ["warp"]), "unknown sampler"),
    (("local folder...", "/etc", 0, 0, ["ar"]), "outside the folders this demo serves"),
])
@needs_zoo("photos-gpt")
def test_bad_input_gives_clear_errors(demo, args, msg):
    with pytest.raises(VGenError, match=msg):
        demo.race(*args, {})


@needs_zoo("photos-gpt")
def test_bad_option_values_fail_before_sampling(demo):
    with pytest.raises(VGenError, match="temperature"):
        demo.race("photos-gpt", None, 0, 0, ["ar"], {"temperature": -1.0})


def test_local_folders_only_inside_allowed_dirs(tiny_pipeline, tmp_path):
    from vgen.demo import LOCAL, Demo
    d = Demo(allowed_dirs=[str(tiny_pipeline.parent)])
    res = d.race(LOCAL, str(tiny_pipeline), 1, 0, ["ar"], {})
    assert res[0]["image"].shape[0] == 3
    with pytest.raises(VGenError, match="outside"):
        d.race(LOCAL, str(tmp_path.parent), 1, 0, ["ar"], {})
    with pytest.raises(VGenError, match="outside"):
        d.race(LOCAL, str(tiny_pipeline / ".." / ".." ), 1, 0, ["ar"], {})  # no escaping with ..
    (tiny_pipeline.parent / "empty").mkdir()
    with pytest.raises(VGenError, match="no pipeline.json"):
        d.race(LOCAL, str(tiny_pipeline.parent / "empty"), 1, 0, ["ar"], {})


@pytest.fixture(scope="module")
def server():
    from vgen.demo import Demo, build_app
    port = free_port()
    app = build_app(Demo())
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    app.close()


@needs_zoo("photos-gpt")
@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_gradio_client_generate_endpoint_returns_the_png(server, capfd):
    from gradio_client import Client
    from PIL import Image

    from vgen import load_pipeline
    client = Client(server, verbose=False)
    path = client.predict(3, 7, "ar", api_name="/generate")
    assert Path(path).suffix == ".png"
    got = np.asarray(Image.open(path).convert("RGB"))
    ref = load_pipeline("photos-gpt").generate([3], seed=7).images[0].permute(1, 2, 0).numpy()
    assert np.array_equal(got, ref)  # lossless, same bytes as the pipeline
    with pytest.raises(Exception, match="out of range"):
        client.predict(99, 0, "ar", api_name="/generate")  # the UI error reaches the client, no traceback
    assert "Traceback" not in capfd.readouterr().err  # nor in the server's log


@pytest.mark.slow  # quick loop: kept under 3 minutes
@needs_zoo("photos-gpt")
def test_gradio_client_race_endpoint(server):
    from gradio_client import Client

    from vgen.demo import option_fields
    client = Client(server, verbose=False)
    given = {"cfg_scale": 3.0, "top_k": 100, "temperature": 1.0, "window": 4, "init": "vertical"}
    values = [given.get(name) for name in option_fields()]  # the widgets, in the app's order; blank = card's
    images, maps, table, note = client.predict("photos-gpt", "", "1: brick", "", 2, ["ar", "gsd"], *values,
                                               api_name="/race")  # model, folder, class, prompt (text models), seed
    assert len(images) == 2 and len(maps) == 2 and note == ""  # every sampler has its map: nothing to explain
    rows = table["data"]
    assert [r[0] for r in rows] == ["ar", "gsd"] and rows[0][3] == 1.0


def chromium() -> str:
    """A headless Chromium on PATH, else skip. Tests never install system packages: CI installs the browser
    with .ci/install-browser (Debian's chromium package) before running them."""
    exe = (shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
           or (os.access("/usr/bin/chromium", os.X_OK) and "/usr/bin/chromium"))
    if not exe:
        pytest.skip("chromium not found: run .ci/install-browser")
    return exe


@needs_zoo("photos-gpt")
@pytest.mark.slow
def test_browser_renders_the_controls(server, tmp_path):
    exe = chromium()
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--virtual-time-budget=15000", "--window-size=1280,1400"]
    shot = tmp_path / "demo.png"
    subprocess.run(flags + [f"--screenshot={shot}", server], capture_output=True, timeout=180)
    dom = subprocess.run(flags + ["--dump-dom", server], capture_output=True, text=True, timeout=180).stdout
    assert shot.exists() and shot.stat().st_size > 10_000
    for text in ("Generate", "samplers", "model", "class", "seed", "sjd", "lantern", "scd", "coupling"):
        assert text in dom, f"{text!r} not rendered"
    from PIL import Image
    img = np.asarray(Image.open(shot).convert("L"))
    assert img.std() > 5  # not a blank page
    out = os.environ.get("VGEN_DEMO_SCREENSHOT")
    if out:
        shutil.copy(shot, out)


def gradio_config(page: str) -> dict:
    """The app config a Gradio page embeds (``window.gradio_config = {...}``); fails when there is none."""
    import json
    marker = "window.gradio_config = "
    assert marker in page, f"not a Gradio page: {page[:300]!r}"
    return json.JSONDecoder().raw_decode(page, page.index(marker) + len(marker))[0]


@needs_zoo("photos-gpt")
@pytest.mark.slow
def test_vgen_demo_command_serves_the_app(tmp_path, capsys, monkeypatch):
    """The server in a real process; bad settings in process (the main() the command runs, while the server starts:
    a process costs seconds of imports) exit 2 with one line before any server starts."""
    import time
    import urllib.request

    from vgen.cli import main
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "vgen", "demo", f"server_port={port}"], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        monkeypatch.chdir(tmp_path)
        for arg, msg in (("model=nope", "unknown model"), (f"model.path={tmp_path}", "no pipeline.json")):
            capsys.readouterr()
            with pytest.raises(SystemExit) as e:
                main(["demo", arg])
            err = capsys.readouterr().err
            assert e.value.code == 2 and msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
        t0, body = time.time(), ""
        while time.time() - t0 < 120 and p.poll() is None:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.5)
        # the vgen app itself, not just any Gradio page: the page's config carries the app's title, its heading
        # and its Generate button
        config = gradio_config(body)
        assert config.get("title") == "vgen: samplers side by side"
        props = [(c.get("type"), c.get("props", {}).get("value")) for c in config.get("components", [])]
        assert any(t == "markdown" and str(v).startswith("# vgen: samplers side by side") for t, v in props)
        assert ("button", "Generate") in props
    finally:
        p.terminate()
        p.wait(timeout=30)


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_app_can_start_on_a_local_folder(tiny_nar_pipeline):
    pytest.importorskip("gradio")
    from vgen.demo import LOCAL, Demo, build_app
    app = build_app(Demo(allowed_dirs=[str(tiny_nar_pipeline.parent)]), "photos-gpt", str(tiny_nar_pipeline))
    values = [getattr(b, "value", None) for b in app.blocks.values()]
    assert LOCAL in values and str(tiny_nar_pipeline) in values and ["nar"] in values


def test_race_on_a_next_scale_model_compares_full_and_compressed_cache(tiny_var_pipeline):
    from vgen.demo import LOCAL, Demo
    d = Demo(allowed_dirs=[str(tiny_var_pipeline.parent)])
    res = d.race(LOCAL, str(tiny_var_pipeline), 1, 0, ["var"], {"kv_compression": "uniform", "kv_budget": 0.25})
    assert [r["sampler"] for r in res] == ["var (full cache)", "var (uniform 25%)"]
    assert res[1]["kv_cache_bytes"] < res[0]["kv_cache_bytes"] and res[0]["forward_passes"] == 4
    assert all(r["step_map"] is None for r in res)  # a pyramid, not one grid: no heatmap, and the panel says why
    from vgen.demo import maps_label
    assert maps_label(res) == ("No decode-step map for var (full cache), var (uniform 25%): it decodes a whole "
                               "scale of the token pyramid per pass, so no token has a pass of its own to map.")
    with pytest.raises(VGenError, match="next-scale model: use one of var"):
        d.race(LOCAL, str(tiny_var_pipeline), 1, 0, ["sjd"], {})


def test_race_on_a_next_neighbour_model_runs_nar_with_its_heatmap(tiny_nar_pipeline):
    from vgen.cards import Card
    from vgen.demo import LOCAL, Demo
    from vgen.samplers import fitting_samplers
    assert fitting_samplers(Card.load(str(tiny_nar_pipeline))) == ["nar"]
    d = Demo(allowed_dirs=[str(tiny_nar_pipeline.parent)])
    res = d.race(LOCAL, str(tiny_nar_pipeline), 1, 0, ["nar"], {})
    assert [r["sampler"] for r in res] == ["nar"] and res[0]["forward_passes"] == 7
    # the step map is the anti-diagonal index: the heatmap shows NAR's diagonal wavefront
    assert res[0]["step_map"].view(4, 4).tolist() == [[r + c for c in range(4)] for r in range(4)]
    with pytest.raises(VGenError, match="next-neighbour model: use one of nar"):
        d.race(LOCAL, str(tiny_nar_pipeline), 1, 0, ["sjd"], {})


def test_option_boxes_blank_stay_blank_and_only_fitting_options_are_sent():
    """Blank option boxes send nothing (they no longer turn into 0), numbers are parsed with a one-line error, and
    an option none of the chosen samplers takes is left out (the race would refuse it)."""
    from vgen.cards import Card
    from vgen.demo import option_fields, parse_options
    fields = option_fields()
    card = Card.load("photos-gpt")
    values = {"window": "4", "top_k": "", "clip_x0": "0", "temperature": " "}
    opts = parse_options(fields, [values.get(k) for k in fields], ["sjd"], card)
    assert opts == {"window": 4}  # clip_x0 means nothing to ar / sjd: not sent; blanks not sent
    with pytest.raises(VGenError, match="top_k takes a whole number"):
        parse_options(fields, [{"top_k": "many"}.get(k) for k in fields], ["sjd"], card)


def test_images_are_shown_at_a_whole_scale_without_blur():
    from vgen.demo import shown
    x = torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)
    a = shown(x, "/tmp", "x")
    assert a.shape == (256, 256, 3) and (a[::4, ::4] == x.permute(1, 2, 0).numpy()).all()
    assert (a[1::4, 2::4] == x.permute(1, 2, 0).numpy()).all()  # each pixel a 4x4 square


@pytest.mark.slow  # quick loop: kept under 3 minutes
def test_a_closed_page_runs_no_further_sampler(demo, monkeypatch):
    """The race is lazy: each sampler runs when the page asks for the next result, so when gradio stops iterating
    a job whose page is gone, the samplers not yet run never run (and the one slot is free again)."""
    calls = []
    pipe = demo.pipeline("photos-gpt")
    real = pipe.generate
    monkeypatch.setattr(pipe, "generate", lambda **kw: calls.append(kw["sampler"]) or real(**kw))
    race = demo.race_iter("photos-gpt", None, "3: cat", 5, ["sjd", "scd"], {"window": 4, "top_k": 50})
    first = next(race)
    assert first["sampler"] == "ar" and first["speedup"] == 1.0 and first["of"] == 3 and calls == ["ar"]
    race.close()  # the page is gone
    assert calls == ["ar"]


@needs_zoo("photos-gpt")
def test_the_options_shown_are_the_ticked_samplers_with_their_blank_values():
    """The options accordion lists what the ticked samplers (and the baseline) take, each with the value a blank
    box gets (the card's), not every option of every sampler; ticking another sampler shows its options."""
    from vgen.cards import Card
    from vgen.demo import option_fields, options_shown
    card = Card.load("photos-gpt")
    ar = options_shown(card, [])
    assert set(ar) == set(option_fields())
    shown = {k for k, v in ar.items() if v is not None}
    assert {"cfg_scale", "top_k", "temperature"} <= shown and "window" not in shown and "coupling" not in shown
    assert ar["cfg_scale"] == f"blank: {card.sampling['cfg_scale']}"  # the card's value
    sjd = options_shown(card, ["sjd"])
    assert sjd["coupling"] == "blank: independent" and sjd["window"].startswith("blank: 4")
    assert "tree" not in {k for k, v in sjd.items() if v is not None}  # eagle's, not ticked
    assert options_shown(card, ["eagle"])["tree"] == "blank: none"
