"""``vgen demo``: a Gradio app where samplers race side by side on one model, class and seed.

For every chosen sampler it shows the image (PNG), the sampling time, forward passes, speed-up over AR and a
heatmap of the forward pass at which each token was decided (where parallel decoding happened). The model's
plain sampler (AR, VAR or NAR) always runs as the baseline. Samplers come from the registry and the option widgets
from their options dataclasses (type, help, choices), so a new sampler and its options appear here without
touching this file. An option left blank takes the model card's value.

    vgen demo                                 # http://127.0.0.1:7860
    vgen demo server_port=8080 allowed_dirs=[/data/pipelines]

Named API endpoint ``/generate`` (class id, seed, sampler) -> PNG file, for scripts::

    from gradio_client import Client
    path = Client("http://127.0.0.1:7860/").predict(3, 0, "sjd", api_name="/generate")
"""
from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from vgen.cards import Card
from vgen.conditions import kind_of
from vgen.errors import VGenError

LOCAL = "local folder..."
HIDDEN_WIDGETS = ("compile", "kv_calibration")  # set by the card / the CLI, not in a browser
RACED = ("ar", "sjd", "scd", "eagle")  # ticked when a model is chosen (those that fit it): AR, SJD, its coupled
# drafts and the trained draft head (eagle: where the card ships one)


def zoo_models() -> list[str]:
    """What the demo serves from the zoo: vgen pipelines, then the transformers models (photos-emu3)."""
    from vgen.cards import list_models, list_transformers_models
    return list_models() + list_transformers_models()


def load_card(name: str) -> Card:
    """The card of a zoo name or pipeline folder, a transformers model's included (:func:`vgen.pipeline.load_card`)."""
    from vgen.pipeline import load_card as card
    return card(name)


def ticked(card: Card | None, fits: list[str]) -> list[str]:
    """The samplers ticked when a model is chosen: those of RACED that fit it (eagle only where its card lists a
    draft head), else its first fitting sampler."""
    return [x for x in RACED if x in fits and (x != "eagle" or (card is not None and card.drafter))] or fits[:1]


class Demo:
    """The handlers, independent of Gradio (tests call them directly). Pipelines are cached per model."""

    def __init__(self, allowed_dirs: list[str] | None = None, device: str = "cpu", dtype=None,
                 quantize: str | None = None, quantize_group: int = 32):
        from vgen import validate
        self.allowed = [Path(d).expanduser().resolve() for d in (allowed_dirs or [])]
        self.device = device
        self.dtype = validate.dtype(dtype)
        from vgen.kernels.quant import check_mode
        self.quantize, self.quantize_group = check_mode(quantize, quantize_group), quantize_group
        self._pipes: dict[str, object] = {}

    # ------------------------------------------------------------------ validation
    def resolve_model(self, model: str, folder: str | None = None) -> str:
        """A zoo name, or a local pipeline folder inside one of the allowed directories."""
        if model != LOCAL:
            if model not in zoo_models():
                raise VGenError(f"unknown zoo model {model!r}; available: {', '.join(zoo_models())}")
            return model
        if not folder or not str(folder).strip():
            raise VGenError("enter the path of a local pipeline folder (one holding pipeline.json)")
        p = Path(str(folder).strip()).expanduser().resolve()
        if not any(p == d or d in p.parents for d in self.allowed):
            where = ", ".join(map(str, self.allowed)) or "none: start `vgen demo allowed_dirs=[...]` to allow some"
            raise VGenError(f"{p} is outside the folders this demo serves ({where})")
        if not (p / "pipeline.json").is_file():
            raise VGenError(f"{p} holds no pipeline.json: point at a folder written by vgen.save_pipeline")
        return str(p)

    def pipeline(self, name: str):
        from vgen.pipeline import load_pipeline
        if name not in self._pipes:  # a vgen pipeline, or a transformers zoo model (photos-emu3)
            self._pipes[name] = load_pipeline(name, device=self.device, dtype=self.dtype, quantize=self.quantize,
                                              quantize_group=self.quantize_group)
        return self._pipes[name]

    def class_names(self, name: str) -> list[str]:
        return list(load_card(name).class_names)

    def parse_class(self, name: str, cls) -> int:
        names = self.class_names(name)
        if isinstance(cls, str) and cls in names:
            return names.index(cls)
        try:
            c = int(str(cls).split(":")[0])
        except (TypeError, ValueError):
            raise VGenError(f"unknown class {cls!r}: pick one of {', '.join(names)}") from None
        if not 0 <= c < len(names):
            raise VGenError(f"class id {c} out of range: this model has classes 0..{len(names) - 1}")
        return c

    @staticmethod
    def parse_seed(seed) -> int:
        from vgen import validate
        return validate.seed(seed)

    def options_for(self, name: str, sampler: str, options: dict):
        """The options given (not None) that this sampler accepts, validated by the sampler against the card."""
        from vgen.pipeline import resolve_sampler
        from vgen.samplers import sampler_class
        card = load_card(name)
        opts = {k: v for k, v in options.items() if k in sampler_class(sampler, card).Options.names() and v is not None}
        resolve_sampler(card, sampler, **opts)  # raises VGenError on bad values
        return opts

    # ------------------------------------------------------------------ work
    def condition(self, name: str, cls, prompt) -> dict:
        """The race's condition as ``generate`` keywords: the class of a class model, the prompt of a text model."""
        card = load_card(name)
        if kind_of(card).reads_text:
            text = (prompt or "").strip()
            if not text:
                raise VGenError("type a prompt: this is a text-to-image model (e.g. "
                                f"{(card.examples or ('a photo of the moon',))[0]!r})")
            return card.condition(prompts=[text]).record()
        return {"labels": [self.parse_class(name, cls)]}

    def race(self, model: str, folder: str | None, cls, seed, samplers: list[str], options: dict,
             progress=None, prompt: str | None = None) -> list[dict]:
        """Run the model's plain sampler (the baseline) and every chosen sampler on (class or prompt, seed);
        everything is validated before any sampling, and an option none of the samplers takes is an error."""
        return list(self.race_iter(model, folder, cls, seed, samplers, options, progress, prompt))

    def race_iter(self, model: str, folder: str | None, cls, seed, samplers: list[str], options: dict,
                  progress=None, prompt: str | None = None):
        """:meth:`race`, one result at a time (the baseline first; each with its speed-up over it), every input
        checked before the first: a caller that stops iterating (the web page closed) runs no further sampler."""
        from vgen.samplers import check_fits, list_samplers, plain_sampler, sampler_class
        name = self.resolve_model(model, folder)
        c, s = self.condition(name, cls, prompt), self.parse_seed(seed)
        chosen = list(samplers or [])
        if not chosen:
            raise VGenError("choose at least one sampler")
        for x in chosen:
            if x not in list_samplers():
                raise VGenError(f"unknown sampler {x!r}; available: {', '.join(list_samplers())}")
        card = load_card(name)
        base = plain_sampler(card)
        names = [base] + [x for x in chosen if x != base]
        for x in names:
            check_fits(x, card)
        given = {k for k, v in (options or {}).items() if v is not None}
        unused = sorted(given - set().union(*(sampler_class(x, card).Options.names() for x in names)))
        if unused:
            raise VGenError(f"option(s) {', '.join(unused)} mean nothing to {', '.join(names)}: clear them or "
                            "choose a sampler that takes them")
        # (label, sampler, options): the baseline first; for a next-scale model with KV compression chosen,
        # the full-cache run is the baseline and the compressed run races it
        comp = (options or {}).get("kv_compression")
        runs = []
        for x in names:
            o = self.options_for(name, x, options or {})
            if "kv_compression" in sampler_class(x, card).Options.names() and comp not in (None, "none"):
                runs.append((f"{x} (full cache)", x, {**o, "kv_compression": "none"}))
                runs.append((f"{x} ({comp} {o.get('kv_budget', 0.1):.0%})", x, o))
            else:
                runs.append((x, x, o))
        pipe = self.pipeline(name)
        grid = tuple(pipe.model.token_shape)
        base_run = None
        for k, (label, x, o) in enumerate(runs):
            if progress is not None:
                progress(k / len(runs), desc=f"{label} ({k + 1}/{len(runs)})")
            t0 = time.perf_counter()
            gen = pipe.generate(**c, sampler=x, seed=s, **o)
            sec = time.perf_counter() - t0
            has_map = gen.step_map is not None and len(grid) in (2, 3)
            r = {"sampler": label, "image": gen.pixels[0], "seconds": gen.stats["sample_seconds"],
                 "total_seconds": sec, "forward_passes": int(gen.stats["forward_passes"]),
                 "step_map": gen.step_map[0] if has_map else None,
                 "no_map": None if has_map else ("it decodes a whole scale of the token pyramid per pass, so no "
                                                 "token has a pass of its own to map" if gen.step_map is not None
                                                 else "it reports no decode step per token"),
                 "grid": grid, "options": o, "kv_cache_bytes": gen.stats.get("kv_cache_bytes"), "of": len(runs)}
            base_run = base_run or r
            r["speedup"] = base_run["seconds"] / r["seconds"]
            r["pass_reduction"] = base_run["forward_passes"] / r["forward_passes"]
            if k == len(runs) - 1 and progress is not None:
                progress(1.0, desc="done")
            yield r

    def generate_one(self, cls, seed, sampler: str = "ar", model: str = "photos-gpt") -> np.ndarray:
        """The API endpoint: one image with the model card's settings (uint8 HxWx3; served as PNG)."""
        from vgen.samplers import list_samplers
        if sampler not in list_samplers():
            raise VGenError(f"unknown sampler {sampler!r}; available: {', '.join(list_samplers())}")
        name = self.resolve_model(model)
        c, s = self.condition(name, cls, cls if isinstance(cls, str) else None), self.parse_seed(seed)
        gen = self.pipeline(name).generate(**c, sampler=sampler, seed=s)
        return gen.images[0].permute(1, 2, 0).contiguous().numpy()


def option_fields() -> dict[str, dataclasses.Field]:
    """Every option of the listed samplers, once (the first sampler's field where two share a name), in a stable
    order: the demo's widgets."""
    from vgen.samplers import list_samplers, sampler_classes
    out: dict[str, dataclasses.Field] = {}
    for n in list_samplers():
        for cls in sampler_classes(n):
            for f in dataclasses.fields(cls.Options):
                if f.name not in HIDDEN_WIDGETS:
                    out.setdefault(f.name, f)
    return out


def option_widget(f: dataclasses.Field, blank: str | None = "blank: the model card's value"):
    """A Gradio input for one option field, blank by default; ``blank``: what blank means (:func:`options_shown`),
    None to start hidden (no ticked sampler takes it)."""
    import gradio as gr
    label = f"{f.name}: {f.metadata.get('help', '')}"
    choices = f.metadata.get("choices")
    t = _type_name(f)
    shown_ = blank is not None
    if choices:
        return gr.Dropdown(list(choices), value=None, label=label, info=blank, visible=shown_)
    if t == "bool":
        return gr.Dropdown([True, False], value=None, label=label, info=blank, visible=shown_)
    # a text box (numbers too: blank stays blank; a Number field turns blank into 0 once shown)
    return gr.Textbox(None, label=label, placeholder=blank, visible=shown_)


def options_shown(card, samplers: list[str]) -> dict[str, str | None]:
    """Which option widgets the chosen ``samplers`` and the model's baseline take, and what each means left blank:
    {option: None (hidden: none of them takes it) or the value it then gets (the model card's, or the sampler's
    default where the card says nothing; the demo's window)}."""
    from vgen.pipeline import resolve_sampler
    from vgen.samplers import plain_sampler
    values: dict[str, object] = {}
    for x in [plain_sampler(card), *samplers]:
        try:
            o = resolve_sampler(card, x).options
        except (VGenError, KeyError, TypeError):
            continue
        for f in dataclasses.fields(o):
            values.setdefault(f.name, getattr(o, f.name))
    out: dict[str, str | None] = {}
    for k in option_fields():
        if k not in values:
            out[k] = None
        elif k == "window":
            out[k] = f"blank: {DEMO_WINDOW} in the demo (auto times every width first)"
        else:
            v = values[k]
            out[k] = f"blank: {v}" if v not in ("", None) else "blank: none"
    return out


def option_updates(card, samplers: list[str], fields: dict[str, dataclasses.Field]) -> list[dict]:
    """Gradio updates for the option widgets: shown where the chosen samplers take them, their blank value said."""
    import gradio as gr
    shown_ = options_shown(card, samplers)
    ups = []
    for k, f in fields.items():
        p = shown_[k]
        if p is None:
            ups.append(gr.update(visible=False))
        elif f.metadata.get("choices") or _type_name(f) == "bool":
            ups.append(gr.update(visible=True, info=p))
        else:
            ups.append(gr.update(visible=True, placeholder=p))
    return ups


def _type_name(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def parse_options(fields: dict[str, dataclasses.Field], values, samplers: list[str], card) -> dict:
    """The option widgets' values -> the options to send: blank ones left out, numbers parsed (a one-line error
    naming the field), and only the options one of ``samplers`` (or the baseline) takes."""
    from vgen.samplers import plain_sampler, sampler_class
    takes = set().union(*(sampler_class(x, card).Options.names() for x in [plain_sampler(card), *samplers]))
    out = {}
    for (k, f), v in zip(fields.items(), values):
        if v is None or (isinstance(v, str) and not v.strip()) or k not in takes:
            continue
        t = _type_name(f)
        if isinstance(v, str) and ("int" in t or "float" in t):  # "int | str": a number or a word (window=auto)
            v = v.strip()
            try:
                v = int(v) if "int" in t and v.lstrip("+-").isdigit() else float(v) if "float" in t else v
            except ValueError:
                raise VGenError(f"{k} takes {'a whole number' if 'int' in t else 'a number'}, got {v!r}") from None
            if t == "int" and isinstance(v, str):
                raise VGenError(f"{k} takes a whole number, got {v!r}")
        out[k] = v
    return out


DEMO_WINDOW = 4  # speculative samplers' width in the demo unless the options say otherwise: window=auto times every
                 # width on first use (minutes on a CPU); set window=auto in the options to calibrate


def step_heatmap(step_map: torch.Tensor, grid: tuple[int, ...], size: int = 192) -> np.ndarray:
    """(L,) pass index per token -> an RGB heatmap (uint8 HxWx3), early passes dark, late ones bright. A video
    grid (t, h, w) gives one map per frame, side by side on one colour scale."""
    import matplotlib
    t, h, w = (1, *grid) if len(grid) == 2 else grid
    m = step_map.reshape(t, h, w).float()
    m = (m - m.min()) / max(float(m.max() - m.min()), 1.0)
    m = torch.cat([torch.cat([f, torch.full((h, 1), float("nan"))], 1) for f in m], 1)[:, :-1] if t > 1 else m[0]
    rgb = (matplotlib.colormaps["viridis"](m.numpy())[..., :3] * 255).astype(np.uint8)
    rgb[np.isnan(m.numpy())] = 255  # white gaps between frames
    rep = max(1, size // max(h, w))
    return np.ascontiguousarray(rgb.repeat(rep, 0).repeat(rep, 1))


def shown(pixels: torch.Tensor, folder: str, name: str, size: int = 256):
    """What the gallery shows: an image as an HxWx3 array upscaled by a whole factor to at least ``size`` pixels
    (nearest neighbour: every pixel a sharp square, no blur); a clip as a looping GIF file (upscaled 4x)."""
    if pixels.dim() == 3:
        rep = max(1, -(-size // max(pixels.shape[-2:])))
        return pixels.repeat_interleave(rep, -1).repeat_interleave(rep, -2).permute(1, 2, 0).contiguous().numpy()
    from vgen.io import save_gif
    path = Path(folder) / f"{name}.gif"
    save_gif(path, pixels.repeat_interleave(4, -1).repeat_interleave(4, -2))
    return str(path)


def maps_label(results: list[dict]) -> str:
    """The line under the heatmaps saying which samplers have no map and why (a next-scale model has none); '' when
    every one has its map."""
    missing = [r for r in results if r["step_map"] is None]
    if not missing:
        return ""
    return f"No decode-step map for {', '.join(r['sampler'] for r in missing)}: {missing[0]['no_map']}."


def shown_results(results: list[dict], out: str):
    """What the page shows for the results so far: (gallery of samples, gallery of step heatmaps, speed table)."""
    base = results[0]["sampler"]
    alone = ": choose another sampler to race it)" if results[0]["of"] == 1 else ")"
    images = [(shown(r["image"], out, f"{k}"), f"{r['sampler']}: {r['seconds']:.2f} s, {r['forward_passes']} passes"
               + (f", {r['speedup']:.2f}x {base}" if k else " (the baseline" + alone))
              for k, r in enumerate(results)]
    maps = [(step_heatmap(r["step_map"], r["grid"]), f"{r['sampler']}: {r['forward_passes']} passes")
            for r in results if r["step_map"] is not None]
    table = [[r["sampler"], round(r["seconds"], 3), r["forward_passes"], round(r["speedup"], 2),
              round(r["pass_reduction"], 2)] for r in results]
    return images, maps, table


def build_app(demo: Demo | None = None, default_model: str = "photos-gpt", default_folder: str | None = None):
    import gradio as gr

    from vgen.samplers import fitting_samplers, list_samplers
    demo = demo or Demo()
    models = zoo_models() + ([LOCAL] if demo.allowed else [])
    default_model = default_model if default_model in models else models[0]
    if default_folder and demo.allowed:  # `vgen demo model.path=<folder>`: start on that local pipeline
        default_model = LOCAL
    start = demo.resolve_model(default_model, default_folder) if default_model == LOCAL else default_model
    names = demo.class_names(start)
    samplers = list_samplers()
    start_card = load_card(start)

    def card_of(name):
        try:
            return load_card(name)
        except VGenError:
            return None

    def fitting(name):
        try:
            return fitting_samplers(card_of(name))
        except (VGenError, TypeError, KeyError):
            return samplers

    default_fits = fitting(start)

    def on_model(model, folder):
        card = None
        try:
            name = demo.resolve_model(model, folder)
            n, fits, card = demo.class_names(name), fitting(name), card_of(name)
        except VGenError:
            n, fits = (names if model != LOCAL else []), samplers
        value = ticked(card if fits is not samplers else None, fits)
        text = card is not None and kind_of(card).reads_text
        return gr.update(choices=[f"{i}: {x}" for i, x in enumerate(n)], value=f"0: {n[0]}" if n else None,
                         visible=not text), \
            gr.update(visible=model == LOCAL), gr.update(choices=fits, value=value), \
            gr.update(visible=text, value=(card.examples[0] if text and card.examples else None))

    fields = option_fields()

    def on_generate(model, folder, cls, prompt, seed, chosen, *values, progress=gr.Progress()):
        """A generator: the gallery and table grow as each sampler finishes, and a closed page (gradio stops
        iterating a job whose client is gone) runs no further sampler."""
        try:
            card = load_card(demo.resolve_model(model, folder))
            opts = parse_options(fields, values, list(chosen or []), card)
            from vgen.samplers import sampler_class
            if "window" not in opts and any("window" in sampler_class(x, card).Options.names() for x in chosen or []):
                opts["window"] = DEMO_WINDOW  # fast first Generate: no calibration run (window=auto calibrates)
            runs = demo.race_iter(model, folder, cls, seed, chosen, opts, progress=progress, prompt=prompt)
            results = []
            out = tempfile.mkdtemp(prefix="vgen-demo-")
            for r in runs:
                results.append(r)
                yield *shown_results(results, out), maps_label(results)
        except VGenError as e:
            raise gr.Error(str(e), print_exception=False) from None

    with gr.Blocks(title="vgen: samplers side by side") as app:
        gr.Markdown("# vgen: samplers side by side\nOne model, one class, one seed: every sampler against AR. "
                    "The heatmaps show the forward pass at which each token was decided (dark: early).")
        with gr.Row():
            with gr.Column(scale=1):
                model = gr.Dropdown(models, value=default_model, label="model")
                folder = gr.Textbox(label="local pipeline folder", visible=default_model == LOCAL,
                                    value=default_folder if default_model == LOCAL else None,
                                    placeholder="a folder with pipeline.json inside the served directories")
                text = kind_of(start_card).reads_text
                cls = gr.Dropdown([f"{i}: {x}" for i, x in enumerate(names)], value=f"0: {names[0]}" if names else None,
                                  label="class", visible=not text)
                prompt = gr.Textbox(start_card.examples[0] if text and start_card.examples else None, label="prompt",
                                    visible=text, placeholder="a photo of the moon")
                seed = gr.Number(0, label="seed (a whole number >= 0)", precision=0)
                chosen = gr.CheckboxGroup(default_fits, value=ticked(card_of(start), default_fits),
                                          label="samplers (the model's plain sampler, AR / VAR / NAR, runs as the baseline)")
                with gr.Accordion("options of the ticked samplers (blank: the model card's value)", open=False):
                    first = options_shown(start_card, ticked(card_of(start), default_fits))
                    widgets = [option_widget(f, first[k]) for k, f in fields.items()]
                button = gr.Button("Generate", variant="primary")
            with gr.Column(scale=2):
                images = gr.Gallery(label="samples", columns=4, format="png", height="auto")
                maps = gr.Gallery(label="decode step per token", columns=4, format="png", height="auto")
                no_maps = gr.Markdown("")
                table = gr.Dataframe(headers=["sampler", "seconds", "forward passes", "x baseline (time)",
                                              "x baseline (passes)"], label="speed", interactive=False)
        def on_chosen(model, folder, chosen):
            try:
                card = load_card(demo.resolve_model(model, folder))
            except VGenError:
                return [gr.update() for _ in widgets]
            return option_updates(card, list(chosen or []), fields)

        model.change(on_model, [model, folder], [cls, folder, chosen, prompt], api_name=False)
        chosen.change(on_chosen, [model, folder, chosen], widgets, api_name=False)
        folder.submit(on_model, [model, folder], [cls, folder, chosen, prompt], api_name=False)
        inputs = [model, folder, cls, prompt, seed, chosen, *widgets]
        button.click(on_generate, inputs, [images, maps, table, no_maps], api_name="race")

        # The scripted endpoint: class id, seed, sampler -> PNG file (model card settings).
        api_cls = gr.Number(0, precision=0, visible=False)
        api_seed = gr.Number(0, precision=0, visible=False)
        api_sampler = gr.Textbox("ar", visible=False)
        api_out = gr.Image(type="numpy", format="png", visible=False)

        def api_generate(c, s, sampler):
            try:
                return demo.generate_one(c, s, sampler or "ar", default_model)
            except VGenError as e:
                raise gr.Error(str(e), print_exception=False) from None
        gr.Button(visible=False).click(api_generate, [api_cls, api_seed, api_sampler], api_out,
                                       api_name="generate")
    app.queue(default_concurrency_limit=1, max_size=16)  # one generation at a time: memory stays bounded
    return app


def launch(cfg) -> None:
    demo = Demo(allowed_dirs=list(cfg.allowed_dirs or []), device=cfg.device, dtype=cfg.get("dtype"),
                quantize=cfg.get("quantize"), quantize_group=cfg.get("quantize_group", 32))
    app = build_app(demo, cfg.model.name, cfg.model.path)
    print(f"vgen demo on http://{cfg.server_name}:{cfg.server_port} (Ctrl-C to stop)")
    # No allowed_paths: the app serves only what it generates (Gradio's cache), never the pipeline folders.
    app.launch(server_name=cfg.server_name, server_port=cfg.server_port, share=cfg.share, show_error=False,
               quiet=True)
