"""``vgen demo``: a Gradio app where samplers race side by side on one model, class and seed.

For every chosen sampler it shows the image (PNG), the sampling time, forward passes, speed-up over AR and a
heatmap of the forward pass at which each token was decided (where parallel decoding happened). AR always
runs as the baseline. Samplers come from the registry, so new ones appear here without touching this file.

    vgen demo                                 # http://127.0.0.1:7860
    vgen demo server_port=8080 allowed_dirs=[/data/pipelines]

Named API endpoint ``/generate`` (class id, seed, sampler) -> PNG file, for scripts::

    from gradio_client import Client
    path = Client("http://127.0.0.1:7860/").predict(3, 0, "sjd", api_name="/generate")
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from vgen.errors import VGenError

LOCAL = "local folder..."
MAIN_OPTIONS = ("cfg_scale", "top_k", "temperature", "window", "init", "delta")


class Demo:
    """The handlers, independent of Gradio (tests call them directly). Pipelines are cached per model."""

    def __init__(self, allowed_dirs: list[str] | None = None, device: str = "cpu", max_batch: int = 4):
        self.allowed = [Path(d).expanduser().resolve() for d in (allowed_dirs or [])]
        self.device = device
        self.max_batch = max_batch
        self._pipes: dict[str, object] = {}

    # ------------------------------------------------------------------ validation
    def resolve_model(self, model: str, folder: str | None = None) -> str:
        """A zoo name, or a local pipeline folder inside one of the allowed directories."""
        from vgen.pipeline import list_models
        if model != LOCAL:
            if model not in list_models():
                raise VGenError(f"unknown zoo model {model!r}; available: {', '.join(list_models())}")
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
        from vgen.pipeline import Pipeline
        if name not in self._pipes:
            self._pipes[name] = Pipeline.from_pretrained(name, device=self.device)
        return self._pipes[name]

    def class_names(self, name: str) -> list[str]:
        from vgen.pipeline import read_card
        card = read_card(name)
        return list(card.get("class_names") or [str(i) for i in range(int(card["num_classes"]))])

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
        try:
            s = int(seed)
        except (TypeError, ValueError):
            raise VGenError(f"seed must be a whole number, got {seed!r}") from None
        if s < 0 or s != float(seed):
            raise VGenError(f"seed must be a whole number >= 0, got {seed!r}")
        return s

    def options_for(self, name: str, sampler: str, options: dict):
        """The options this sampler accepts (others are ignored), validated by the sampler itself."""
        import dataclasses

        from vgen.pipeline import read_card, resolve_sampler
        from vgen.samplers.base import _REGISTRY
        fields = {f.name for f in dataclasses.fields(_REGISTRY[sampler].Options)}
        opts = {k: v for k, v in options.items() if k in fields and v is not None}
        card = read_card(name)
        resolve_sampler(card, sampler, card.get("vocab_size"), **opts)  # raises VGenError on bad values
        return opts

    # ------------------------------------------------------------------ work
    def race(self, model: str, folder: str | None, cls, seed, samplers: list[str], options: dict,
             progress=None) -> list[dict]:
        """Run the baseline (AR; VAR for next-scale, NAR for next-neighbour models) and every chosen sampler on (class, seed); everything
        is validated before any sampling."""
        from vgen.pipeline import read_card
        from vgen.samplers import list_samplers
        name = self.resolve_model(model, folder)
        c, s = self.parse_class(name, cls), self.parse_seed(seed)
        chosen = [x for x in (samplers or [])]
        if not chosen:
            raise VGenError("choose at least one sampler")
        for x in chosen:
            if x not in list_samplers():
                raise VGenError(f"unknown sampler {x!r}; available: {', '.join(list_samplers())}")
        base = baseline_sampler(read_card(name))
        # (label, sampler, options): the baseline first; for a next-scale model with KV compression chosen,
        # the full-cache run is the baseline and the compressed run races it
        comp = (options or {}).get("kv_compression")
        runs = []
        for x in [base] + [x for x in chosen if x != base]:
            o = self.options_for(name, x, options)
            if x == "var" and comp not in (None, "none"):
                runs.append(("var (full cache)", x, {**o, "kv_compression": "none"}))
                runs.append((f"var ({comp} {o.get('kv_budget', 0.1):.0%})", x, o))
            else:
                runs.append((x, x, o))
        pipe = self.pipeline(name)
        results = []
        for k, (label, x, o) in enumerate(runs):
            if progress is not None:
                progress(k / len(runs), desc=f"{label} ({k + 1}/{len(runs)})")
            t0 = time.perf_counter()
            gen = pipe.generate([c], sampler=x, seed=s, **o)
            sec = time.perf_counter() - t0
            results.append({"sampler": label, "image": gen.images[0], "seconds": gen.stats["sample_seconds"],
                            "total_seconds": sec, "forward_passes": int(gen.stats["forward_passes"]),
                            "step_map": gen.step_map[0] if gen.step_map is not None
                            and gen.step_map.shape[1] == pipe.model.grid[0] * pipe.model.grid[1] else None,
                            "grid": pipe.model.grid, "options": o,
                            "kv_cache_bytes": gen.stats.get("kv_cache_bytes")})
        if progress is not None:
            progress(1.0, desc="done")
        ar = results[0]
        for r in results:
            r["speedup"] = ar["seconds"] / r["seconds"]
            r["pass_reduction"] = ar["forward_passes"] / r["forward_passes"]
        return results

    def generate_one(self, cls, seed, sampler: str = "ar", model: str = "photos-gpt") -> np.ndarray:
        """The API endpoint: one image with the model card's settings (uint8 HxWx3; served as PNG)."""
        from vgen.samplers import list_samplers
        if sampler not in list_samplers():
            raise VGenError(f"unknown sampler {sampler!r}; available: {', '.join(list_samplers())}")
        name = self.resolve_model(model)
        c, s = self.parse_class(name, cls), self.parse_seed(seed)
        gen = self.pipeline(name).generate([c], sampler=sampler, seed=s)
        return gen.images[0].permute(1, 2, 0).contiguous().numpy()


def baseline_sampler(card: dict) -> str:
    """The reference every other sampler races against: AR for next-token models, VAR for next-scale ones,
    NAR for next-neighbour ones."""
    from vgen.samplers.base import baseline_for
    return baseline_for(card.get("generation", "next-token"))


def compatible_samplers(card: dict) -> list[str]:
    from vgen.samplers import get_sampler, list_samplers
    kind = card.get("generation", "next-token")
    return [n for n in list_samplers() if get_sampler(n).generation == kind]


def step_heatmap(step_map: torch.Tensor, grid: tuple[int, int], size: int = 192) -> np.ndarray:
    """(L,) pass index per token -> an RGB heatmap (uint8 HxWx3), early passes dark, late ones bright."""
    import matplotlib
    h, w = grid
    m = step_map.reshape(h, w).float()
    m = (m - m.min()) / max(float(m.max() - m.min()), 1.0)
    rgb = (matplotlib.colormaps["viridis"](m.numpy())[..., :3] * 255).astype(np.uint8)
    rep = max(1, size // max(h, w))
    return np.ascontiguousarray(rgb.repeat(rep, 0).repeat(rep, 1))


def build_app(demo: Demo | None = None, default_model: str = "photos-gpt", default_folder: str | None = None):
    import gradio as gr

    from vgen.pipeline import list_models
    from vgen.samplers import list_samplers
    demo = demo or Demo()
    models = list_models() + ([LOCAL] if demo.allowed else [])
    default_model = default_model if default_model in models else models[0]
    if default_folder and demo.allowed:  # `vgen demo model.path=<folder>`: start on that local pipeline
        default_model = LOCAL
    start = demo.resolve_model(default_model, default_folder) if default_model == LOCAL else default_model
    names = demo.class_names(start)
    samplers = list_samplers()

    def fitting(name):
        from vgen.pipeline import read_card
        try:
            return compatible_samplers(read_card(name))
        except VGenError:
            return samplers

    default_fits = fitting(start)

    def on_model(model, folder):
        try:
            name = demo.resolve_model(model, folder)
            n, fits = demo.class_names(name), fitting(name)
        except VGenError:
            n, fits = (names if model != LOCAL else []), samplers
        value = [x for x in ("ar", "sjd") if x in fits] or fits[:1]
        return gr.update(choices=[f"{i}: {x}" for i, x in enumerate(n)], value=f"0: {n[0]}" if n else None), \
            gr.update(visible=model == LOCAL), gr.update(choices=fits, value=value)

    def on_generate(model, folder, cls, seed, chosen, cfg_scale, top_k, temperature, window, init, delta,
                    kv_compression="none", kv_budget=0.1, progress=gr.Progress()):
        opts = dict(cfg_scale=cfg_scale, top_k=int(top_k) if top_k is not None else None, temperature=temperature,
                    window=int(window) if window is not None else None, init=init, delta=delta,
                    kv_compression=kv_compression, kv_budget=kv_budget)
        try:
            results = demo.race(model, folder, cls, seed, chosen, opts, progress=progress)
        except VGenError as e:
            raise gr.Error(str(e)) from None
        base = results[0]["sampler"]
        images = [(r["image"].permute(1, 2, 0).numpy(), f"{r['sampler']}: {r['seconds']:.2f} s, "
                   f"{r['forward_passes']} passes, {r['speedup']:.2f}x {base}") for r in results]
        maps = [(step_heatmap(r["step_map"], r["grid"]), f"{r['sampler']}: {r['forward_passes']} passes")
                for r in results if r["step_map"] is not None]
        table = [[r["sampler"], round(r["seconds"], 3), r["forward_passes"], round(r["speedup"], 2),
                  round(r["pass_reduction"], 2)] for r in results]
        return images, maps, table

    with gr.Blocks(title="vgen: samplers side by side") as app:
        gr.Markdown("# vgen: samplers side by side\nOne model, one class, one seed: every sampler against AR. "
                    "The heatmaps show the forward pass at which each token was decided (dark: early).")
        with gr.Row():
            with gr.Column(scale=1):
                model = gr.Dropdown(models, value=default_model, label="model")
                folder = gr.Textbox(label="local pipeline folder", visible=default_model == LOCAL,
                                    value=default_folder if default_model == LOCAL else None,
                                    placeholder="a folder with pipeline.json inside the served directories")
                cls = gr.Dropdown([f"{i}: {x}" for i, x in enumerate(names)], value=f"0: {names[0]}", label="class")
                seed = gr.Number(0, label="seed", precision=0, minimum=0)
                chosen = gr.CheckboxGroup(default_fits, value=[x for x in ("ar", "sjd") if x in default_fits]
                                          or default_fits[:1],
                                          label="samplers (the model's plain sampler, AR / VAR / NAR, runs as the baseline)")
                with gr.Accordion("options", open=False):
                    cfg_scale = gr.Slider(0.0, 10.0, value=3.0, step=0.5, label="cfg_scale")
                    top_k = gr.Number(100, label="top_k (0: off)", precision=0, minimum=0)
                    temperature = gr.Slider(0.05, 2.0, value=1.0, step=0.05, label="temperature")
                    window = gr.Slider(2, 16, value=4, step=1, label="window (speculative samplers)")
                    init = gr.Dropdown(["random", "horizontal", "vertical", "sample"], value="vertical",
                                       label="draft init (speculative samplers)")
                    delta = gr.Slider(0.0, 0.5, value=0.1, step=0.05, label="delta (lantern)")
                    kv_compression = gr.Dropdown(["none", "scalekv", "uniform"], value="none",
                                                 label="KV compression (next-scale models)")
                    kv_budget = gr.Slider(0.02, 1.0, value=0.1, step=0.02, label="KV budget (fraction kept)")
                button = gr.Button("Generate", variant="primary")
            with gr.Column(scale=2):
                images = gr.Gallery(label="samples", columns=4, format="png", height="auto")
                maps = gr.Gallery(label="decode step per token", columns=4, format="png", height="auto")
                table = gr.Dataframe(headers=["sampler", "seconds", "forward passes", "x baseline (time)",
                                              "x baseline (passes)"], label="speed", interactive=False)
        model.change(on_model, [model, folder], [cls, folder, chosen], api_name=False)
        folder.submit(on_model, [model, folder], [cls, folder, chosen], api_name=False)
        inputs = [model, folder, cls, seed, chosen, cfg_scale, top_k, temperature, window, init, delta,
                  kv_compression, kv_budget]
        button.click(on_generate, inputs, [images, maps, table], api_name="race")

        # The scripted endpoint: class id, seed, sampler -> PNG file (model card settings).
        api_cls = gr.Number(0, precision=0, visible=False)
        api_seed = gr.Number(0, precision=0, visible=False)
        api_sampler = gr.Textbox("ar", visible=False)
        api_out = gr.Image(type="numpy", format="png", visible=False)

        def api_generate(c, s, sampler):
            try:
                return demo.generate_one(c, s, sampler or "ar", default_model)
            except VGenError as e:
                raise gr.Error(str(e)) from None
        gr.Button(visible=False).click(api_generate, [api_cls, api_seed, api_sampler], api_out,
                                       api_name="generate")
    app.queue(default_concurrency_limit=1, max_size=16)  # one generation at a time: memory stays bounded
    return app


def launch(cfg) -> None:
    demo = Demo(allowed_dirs=list(cfg.allowed_dirs or []), device=cfg.device)
    app = build_app(demo, cfg.model.name, cfg.model.path)
    print(f"vgen demo on http://{cfg.server_name}:{cfg.server_port} (Ctrl-C to stop)")
    # No allowed_paths: the app serves only what it generates (Gradio's cache), never the pipeline folders.
    app.launch(server_name=cfg.server_name, server_port=cfg.server_port, share=cfg.share, show_error=False,
               quiet=True)
