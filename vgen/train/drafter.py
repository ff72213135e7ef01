"""Recipe: an EAGLE-style draft head (:mod:`vgen.models.drafter`) for a next-token GPT pipeline.

The target is frozen; ``arch`` picks the head (``block``: EAGLE's one transformer block; ``mlp``: attention-free,
no KV cache). The target's hidden states over real token sequences are computed once, for the class and for the
null (CFG) condition, and cached in the run folder (``features_train.pt``, fp16); training then runs the one-block
drafter on them with teacher forcing: smooth-L1 to the target's next hidden state plus ``cls_weight`` x the
cross-entropy against the target's next-token distribution, with uniform noise on the input features (EAGLE);
``accept_weight`` adds the total variation between the two distributions after the card's guidance and filter
(1 - the acceptance the exact rule sees) at every trained depth.
Token sequences: the pipeline's tokenizer over the embedded photographs, or a folder of cached codes
(``codes=<folder>`` holding ``codes_train.pt`` / ``codes_test.pt`` as ``{"codes": int (N, L), "labels": (N,)}``,
e.g. official LlamaGen checkpoints' ImageNet codes). ``self_samples=N`` adds N sequences sampled from the target
itself (its plain sampler, the card's sampling: the contexts the head drafts in at generation time, which the
photographs' codes only approximate; cached as ``self_train.pt``, written chunk by chunk so a stopped run resumes),
and holds out ``n_test`` more whose numbers are logged with a ``self_`` prefix. Held-out numbers logged at every
checkpoint: the one-step acceptance sum_x min(p, q) under the card's guidance, top-k and temperature (what the
exact rule accepts for a first draft), top-1 agreement, and the losses. Writes ``drafter.safetensors``;
``install=true`` also copies it next to the pipeline and lists it in ``pipeline.json``.
"""
from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from vgen.conditions import kind_of
from vgen.errors import VGenError
from vgen.io import atomic_write_bytes
from vgen.kernels.verify import window_target
from vgen.models.drafter import ARCHS, Drafter, load_drafter, save_drafter, target_features
from vgen.train.common import RecipeConfig, adamw, cached_codes, recipe, start_run, train_loop


@dataclass
class DrafterTrainConfig(RecipeConfig):
    out: str = "runs/photos-gpt-drafter"
    model: str = "photos-gpt"      # the target: a zoo pipeline name or a folder with pipeline.json (next-token GPT)
    codes: str = ""                # a folder with codes_train.pt / codes_test.pt instead of encoding the photos
    steps: int = 1200
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.0
    n_train: int = 2048            # training sequences (their target features are cached: 256 KB each, fp16)
    n_test: int = 128
    cls_weight: float = 0.1        # loss = smooth-L1(features) + cls_weight * CE(target's next-token distribution)
    noise: float = 0.1             # uniform noise on the input features, times their RMS (EAGLE's augmentation)
    save_every: int = 100
    install: bool = False          # copy drafter.safetensors next to the pipeline and list it in pipeline.json
    arch: str = "block"            # block (EAGLE's one transformer block) or mlp (attention-free, no KV cache)
    self_samples: int = 0          # + this many sequences sampled from the target (card sampling); n_test more held out
    depths: int = 1                # train the head's chained depths 1..depths (EAGLE-3's training-time test)
    depth_decay: float = 0.8       # depth k's loss weight: depth_decay ** (k - 1), normalised
    init: str = ""                 # start from this drafter.safetensors (fine-tuning) instead of a random head
    accept_weight: float = 0.0     # + this x (1 - acceptance) per depth: the total variation between the guided,
                                   # filtered distributions the exact rule compares (the card's sampling)


def load_target(name: str, device):
    """(pipeline, target) for a drafter; one-line error unless the target is a next-token model over codes that
    gives its hidden states (:class:`vgen.interfaces.FeatureModel`: vgen's GPT, a transformers model such as the
    zoo's photos-emu3), with an image tokenizer to encode training crops."""
    from vgen.interfaces import FeatureModel, Order, satisfies
    from vgen.pipeline import load_pipeline
    pipe = load_pipeline(name, device=device)
    m = pipe.model
    if not satisfies(m, FeatureModel) or m.token_type.kind != "codes" or pipe.card.order != Order.NEXT_TOKEN \
            or pipe.tokenizer is None:
        raise VGenError(f"{name} is not a next-token model over codes with its hidden states and an image tokenizer "
                        f"({pipe.card.model_kind}): an EAGLE drafter drafts for LlamaGen-style GPTs (photos-gpt, "
                        "photos-t2i, official LlamaGen) and the zoo's transformers model photos-emu3")
    return pipe, m.eval().requires_grad_(False)


def bind(target, cond: torch.Tensor):
    """(target, cond) as the target reads them: a prompt-token model binds a view to the prompts' length
    (:class:`vgen.interfaces.PromptTokenModel`), which its null prompts are padded to."""
    from vgen.interfaces import PromptTokenModel, satisfies
    return target.prepare(cond) if satisfies(target, PromptTokenModel) else (target, cond)


def codes_from_folder(folder: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    f = folder / f"codes_{split}.pt"
    if not f.is_file():
        raise VGenError(f"codes={folder} has no {f.name}: write {{'codes': (N, L) ints, 'labels': (N,)}} there with "
                        "torch.save")
    d = torch.load(f, map_location="cpu", weights_only=True)
    if not isinstance(d, dict) or "codes" not in d or "labels" not in d:
        raise VGenError(f"{f} must hold a dict with 'codes' (N, L) and 'labels' (N,)")
    return d["codes"], d["labels"]


@torch.no_grad()
def text_codes(run, pipe, split: str, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A text pipeline's training sequences: ``n`` captioned photo crops of a split (:mod:`vgen.data.captions`, one
    true caption each) -> (codes int16 (n, L), caption features (n, T, D) from the pipeline's text encoder); codes
    and captions cached as ``codes_<split>.pt``."""
    from vgen.conditions import Prompts
    from vgen.data import to_model_range
    from vgen.data.captions import captioned_photos
    path = run.path / f"codes_{split}.pt"
    d = torch.load(path, weights_only=True) if path.exists() else None
    if d is None or d["codes"].shape[0] != n:
        data = captioned_photos(split, n, seed=seed, size=pipe.card.image_size or 64)
        dev = next(pipe.tokenizer.parameters()).device
        codes = torch.cat([pipe.tokenizer.encode_to_codes(to_model_range(data.images[i:i + 128].to(dev)))
                           .to(torch.int16).cpu() for i in range(0, n, 128)])
        d = {"codes": codes, "captions": list(data.captions)}
        buf = io.BytesIO()
        torch.save(d, buf)
        atomic_write_bytes(path, buf.getvalue())
    return d["codes"], pipe.encode(Prompts(tuple(d["captions"]))).cpu()


@torch.no_grad()
def cached_features(run, target, codes: torch.Tensor, labels: torch.Tensor, split: str, batch: int = 32):
    """Target hidden states (N, 2, L, d) fp16 for [condition, null] (``labels``: class ids, or a text model's
    caption features), cached as ``features_<split>.pt``."""
    path = run.path / f"features_{split}.pt"
    if path.exists():
        d = torch.load(path, weights_only=True)
        if d["features"].shape[0] == codes.shape[0]:
            return d["features"]
    dev = next(target.parameters()).device
    out = []
    for i in range(0, codes.shape[0], batch):
        x = codes[i:i + batch].long().to(dev)
        t, y = bind(target, labels[i:i + batch].to(dev))
        c = target_features(t, x, y)
        u = target_features(t, x, t.null_cond(y))
        out.append(torch.stack([c, u], 1).half().cpu())
    feats = torch.cat(out)
    buf = io.BytesIO()
    torch.save({"features": feats}, buf)
    atomic_write_bytes(path, buf.getvalue())
    return feats


@torch.no_grad()
def self_codes(run, pipe, n: int, seed: int, name: str, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences sampled from the pipeline's model with its plain sampler and the card's sampling (eager;
    classes in turn; sequence i from seed ``seed + i``, so any chunking gives the same codes) -> (codes int16
    (n, L), labels int64 (n,)) on the CPU; cached as ``<name>.pt``, saved after every chunk of ``chunk`` and
    resumed from there."""
    path = run.path / f"{name}.pt"
    codes = torch.empty((0, pipe.model.seq_len), dtype=torch.int16)
    labels = torch.empty(0, dtype=torch.long)
    if path.exists():
        d = torch.load(path, weights_only=True)
        codes, labels = d["codes"], d["labels"]
    text = kind_of(pipe.card).reads_text
    if text:  # a text model drafts for captions like its training crops': those of captioned train crops
        from vgen.conditions import Prompts
        from vgen.data.captions import captioned_photos
        prompts = list(captioned_photos("train", n, seed=seed).captions)
    while codes.shape[0] < n:
        i = codes.shape[0]
        m = min(chunk, n - i)
        cond = {"prompts": prompts[i:i + m]} if text else \
            {"labels": [(i + j) % pipe.model.num_classes for j in range(m)]}
        g = pipe.generate(**cond, seed=seed + i, batch_size=m, compile=False)
        codes = torch.cat([codes, g.tokens.to(torch.int16)])
        labels = labels if text else torch.cat([labels, g.labels.long()])
        buf = io.BytesIO()
        torch.save({"codes": codes, "labels": labels if not text else torch.empty(0)}, buf)
        atomic_write_bytes(path, buf.getvalue())
        print(f"{name}: {codes.shape[0]} / {n} sequences sampled from the target", flush=True)
    if text:  # the conditions of every sequence, encoded at once (prompt ids: one padded length)
        labels = pipe.encode(Prompts(tuple(prompts[:n]))).cpu()
    return codes[:n], labels[:n]


def sampling_kwargs(sampling: dict) -> dict:
    """A card's ``sampling`` as :func:`window_target`'s keyword arguments (guidance when its scale is not 1)."""
    cfg_scale = float(sampling.get("cfg_scale", 1.0))
    return dict(cfg=cfg_scale != 1.0, cfg_scale=cfg_scale, cfg_interval=int(sampling.get("cfg_interval", -1)),
                temperature=float(sampling.get("temperature", 1.0)), top_k=int(sampling.get("top_k", 0)),
                top_p=float(sampling.get("top_p", 1.0)))


def guided_pair(lq: torch.Tensor, lp: torch.Tensor, k: int, kw: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Depth ``k``'s (0-based) drafter and target logits ((2B, S - k, V), rows [class; null]) -> the distributions
    (q, p) (B, S - k, V) the sampler draws and verifies with under the sampling ``kw`` (:func:`sampling_kwargs`):
    guided, temperature-scaled, filtered. Differentiable in ``lq``."""
    B = lq.shape[0] // 2
    idx = torch.arange(k + 1, lq.shape[1] + k + 1, device=lq.device).expand(B, -1)  # the token each row predicts
    if not kw["cfg"]:
        lq, lp = lq[:B], lp[:B]
    return window_target(lq, idx, **kw), window_target(lp, idx, **kw)


def acceptance(lq: torch.Tensor, lp: torch.Tensor, k: int, kw: dict) -> torch.Tensor:
    """Per-position sum_x min(p, q) of :func:`guided_pair`'s distributions: what the exact rule accepts for that
    draft. Differentiable in ``lq``."""
    return torch.minimum(*guided_pair(lq, lp, k, kw)).sum(-1)


def drafter_losses(drafter: Drafter, target, feats: torch.Tensor, codes: torch.Tensor, noise: float = 0.0,
                   generator: torch.Generator | None = None, depths: int = 1, decay: float = 0.8,
                   sampling: dict | None = None) -> dict:
    """Teacher-forced losses on (B, 2, L, d) target features and their (B, L) codes: slot s is fed (f[s-1], x[s])
    and predicts f[s]; both conditions' rows at once. ``depths`` > 1 adds the head's chained depths 2.. (its own
    output fed back, :meth:`Drafter.rollout`), each scored on the slots it drafts for and weighted ``decay`` ** (k-1)
    (weights normalised to sum 1). Returns the weighted feature and distribution losses (``reg``, ``cls``), and per
    depth those losses (``regs``, ``clss``) and the drafter's and the target's logits (lists of (2B, L-k, V), rows
    [class; null]; depth k's row s predicts the token after slot s + k - 1). With ``sampling`` (a card's) also
    ``tv``: the weighted mean of 1 - acceptance (:func:`acceptance`) over the depths."""
    B, _, L, d = feats.shape
    f = feats.float().transpose(0, 1).reshape(2 * B, L, d)  # rows [class; null]
    x = torch.cat([codes, codes]).long()
    inp, want = f[:, :-1], f[:, 1:]
    if noise:
        rms = inp.pow(2).mean(-1, keepdim=True).sqrt()
        u = torch.rand(inp.shape, generator=generator, device=inp.device) * 2 - 1
        inp = inp + noise * rms * u
    pos = target.cond_len + torch.arange(L - 1, device=f.device)
    outs = drafter.rollout(target, inp, x[:, :-1], pos, depths)
    logits_p = target.head(want)
    regs, clss, lq, lp = [], [], [], []
    for k, g in enumerate(outs):  # depth k + 1: slots k.. are meaningful
        q, p = target.head(g[:, k:]), logits_p[:, k:]
        regs.append(F.smooth_l1_loss(g[:, k:], want[:, k:]))
        clss.append(-(p.softmax(-1) * q.log_softmax(-1)).sum(-1).mean())
        lq.append(q)
        lp.append(p)
    w = [decay ** k for k in range(depths)]
    out = {"reg": sum(a * b for a, b in zip(w, regs)) / sum(w), "cls": sum(a * b for a, b in zip(w, clss)) / sum(w),
           "regs": regs, "clss": clss, "logits_q": lq, "logits_p": lp}
    if sampling is not None:
        kw = sampling_kwargs(sampling)
        tvs = [1 - acceptance(q, p.detach(), k, kw).mean() for k, (q, p) in enumerate(zip(lq, lp))]
        out["tv"] = sum(a * b for a, b in zip(w, tvs)) / sum(w)
    return out


@torch.no_grad()
def evaluate(drafter: Drafter, target, feats, codes, sampling: dict, batch: int = 32, depths: int = 1) -> dict:
    """Held-out: one-step acceptance sum_x min(p, q) under the card's sampling (CFG, top-k, temperature), top-1
    agreement of the guided distributions, and depth 1's two losses; with ``depths`` > 1 also the acceptance of the
    head's chained depths 2.. (``test_acceptance_d2``, ...: what the exact rule accepts for draft k given the
    earlier ones accepted, on teacher-forced contexts)."""
    was = drafter.training
    drafter.eval()
    acc, top1, reg, cls, n = [0.0] * depths, 0.0, 0.0, 0.0, [0] * depths
    kw = sampling_kwargs(sampling)
    for i in range(0, feats.shape[0], batch):
        r = drafter_losses(drafter, target, feats[i:i + batch], codes[i:i + batch], depths=depths)
        B, S = codes[i:i + batch].shape[0], codes.shape[1] - 1
        for k in range(depths):
            q, p = guided_pair(r["logits_q"][k], r["logits_p"][k], k, kw)
            acc[k] += float(torch.minimum(p, q).sum())
            n[k] += B * (S - k)
            if k == 0:
                top1 += float((p.argmax(-1) == q.argmax(-1)).float().sum())
        reg += float(r["regs"][0]) * B
        cls += float(r["clss"][0]) * B
    drafter.train(was)
    m = feats.shape[0]
    out = {"test_acceptance": acc[0] / n[0], "test_top1": top1 / n[0], "test_reg": reg / m, "test_cls": cls / m}
    out.update({f"test_acceptance_d{k + 1}": acc[k] / n[k] for k in range(1, depths)})
    return out


@recipe(DrafterTrainConfig)
def train_drafter(cfg: DrafterTrainConfig) -> dict:
    if cfg.codes and not Path(cfg.codes).is_dir():
        raise VGenError(f"codes={cfg.codes} is not a folder: give one holding codes_train.pt and codes_test.pt")
    if cfg.noise < 0 or cfg.cls_weight < 0 or cfg.self_samples < 0 or cfg.accept_weight < 0:
        raise VGenError("noise, cls_weight, accept_weight and self_samples must be >= 0")
    if cfg.depths < 1 or not 0 < cfg.depth_decay <= 1:
        raise VGenError(f"depths={cfg.depths}, depth_decay={cfg.depth_decay}: depths must be >= 1 (1 = teacher "
                        "forcing only) and depth_decay in (0, 1]")
    if cfg.arch not in ARCHS:
        raise VGenError(f"arch={cfg.arch} is not a drafter architecture: use one of {', '.join(ARCHS)}")
    from vgen.train.common import train_device
    pipe, target = load_target(cfg.model, train_device(cfg.device))  # refused before any run folder exists
    start = None
    if cfg.init:
        start = load_drafter(cfg.init)
        start.check_target(target, f"init={cfg.init}", shapes_only=True)  # e.g. photos-gpt's head for photos-t2i
        if start.arch != cfg.arch:
            raise VGenError(f"init={cfg.init} holds a {start.arch!r} head but arch={cfg.arch}: set arch={start.arch}")
    if cfg.codes:
        tr = codes_from_folder(Path(cfg.codes), "train")
        te = codes_from_folder(Path(cfg.codes), "test")
        for what, (c, _) in (("train", tr), ("test", te)):
            if c.dim() != 2 or c.shape[1] != target.seq_len or int(c.max()) >= target.vocab_size or int(c.min()) < 0:
                raise VGenError(f"codes_{what}.pt holds codes of shape {tuple(c.shape)} in [{int(c.min())}, "
                                f"{int(c.max())}], but {cfg.model} takes (N, {target.seq_len}) codes below "
                                f"{target.vocab_size}")
    run, device = start_run(cfg)
    if cfg.codes:
        (tr_codes, tr_labels), (te_codes, te_labels) = tr, te
        tr_codes, te_codes = tr_codes[:cfg.n_train], te_codes[:cfg.n_test]
        tr_labels, te_labels = tr_labels[:cfg.n_train], te_labels[:cfg.n_test]
    elif kind_of(pipe.card).reads_text:
        tr_codes, tr_labels = text_codes(run, pipe, "train", cfg.n_train, cfg.seed)
        te_codes, te_labels = text_codes(run, pipe, "test", cfg.n_test, cfg.seed + 1)
    else:
        tr_codes, tr_labels = cached_codes(run, pipe.tokenizer, "train", cfg.n_train, cfg.seed)
        te_codes, te_labels = cached_codes(run, pipe.tokenizer, "test", cfg.n_test, cfg.seed + 1)
    tr_feats = cached_features(run, target, tr_codes, tr_labels.to(device), "train")
    te_feats = cached_features(run, target, te_codes, te_labels.to(device), "test")
    held_out = [("", te_feats, te_codes)]
    if cfg.self_samples:  # seeds far from any the bench or tests use
        s_codes, s_labels = self_codes(run, pipe, cfg.self_samples, 10_000_000 * (cfg.seed + 1), "self_train")
        s_feats = cached_features(run, target, s_codes, s_labels.to(device), "self_train")
        st_codes, st_labels = self_codes(run, pipe, cfg.n_test, 10_000_000 * (cfg.seed + 1) + 5_000_000, "self_test")
        st_feats = cached_features(run, target, st_codes, st_labels.to(device), "self_test")
        tr_codes, tr_feats = torch.cat([tr_codes.to(s_codes.dtype), s_codes]), torch.cat([tr_feats, s_feats])
        held_out.append(("self_", st_feats, st_codes))
    tr_codes = tr_codes.long().to(device)
    held_out = [(pre, f.to(device), c.long().to(device)) for pre, f, c in held_out]

    drafter = Drafter(target.config, cfg.arch).to(device)
    if start is not None:  # a resumed run's checkpoint replaces these in train_loop
        drafter.load_state_dict(start.state_dict())
    opt = adamw(drafter, cfg.lr, cfg.weight_decay)
    g = torch.Generator()

    def step_fn(step):
        g.manual_seed(cfg.seed * 1_000_003 + step)
        idx = torch.randint(0, tr_codes.shape[0], (cfg.batch_size,), generator=g)
        r = drafter_losses(drafter, target, tr_feats[idx].to(device), tr_codes[idx], cfg.noise, g, cfg.depths,
                           cfg.depth_decay, sampling=pipe.card.sampling if cfg.accept_weight else None)
        with torch.no_grad():
            top1 = (r["logits_q"][0].argmax(-1) == r["logits_p"][0].argmax(-1)).float().mean()
        loss = r["reg"] + cfg.cls_weight * r["cls"]
        logs = {"reg": r["reg"].detach(), "cls": r["cls"].detach(), "top1": top1}
        if cfg.accept_weight:
            loss = loss + cfg.accept_weight * r["tv"]
            logs["tv"] = r["tv"].detach()
        return loss, logs

    def held_out_metrics() -> dict:
        return {pre + k: v for pre, f, c in held_out
                for k, v in evaluate(drafter, target, f, c, pipe.card.sampling, depths=cfg.depths).items()}

    def on_save(step):
        run.log({"step": step, **held_out_metrics()})

    step, _ = train_loop(cfg, drafter, opt, run, step_fn, desc="drafter", clip=1.0, log_every=10,
                         bar={"loss": "{loss:.3f}", "top1": "{top1:.2f}"}, on_save=on_save)
    with torch.no_grad():  # measure the fp16 weights that ship
        for t in drafter.state_dict().values():
            t.copy_(t.half().float())
    metrics = held_out_metrics()
    run.log({"step": step, "final": True, **metrics})
    out = run.path / "drafter.safetensors"
    save_drafter(drafter, out, extra={"train": asdict(cfg), "metrics": metrics, "target": cfg.model})
    if cfg.install:
        install_drafter(pipe.card.folder, out)
    return metrics


def install_drafter(folder, file) -> Path:
    """Copy a drafter next to its pipeline and list it in its card (``pipeline.json``, or ``hf_pipeline.json`` for a
    transformers zoo model): ``"drafter": "drafter.safetensors"``."""
    import json

    from vgen.io import atomic_write_bytes, atomic_write_json
    folder = Path(folder)
    dest = folder / "drafter.safetensors"
    atomic_write_bytes(dest, Path(file).read_bytes())
    # the card: a vgen pipeline's, or a transformers zoo model's
    name = next(n for n in ("pipeline.json", "hf_pipeline.json") if (folder / n).is_file())
    card = json.loads((folder / name).read_text())
    card["drafter"] = dest.name
    atomic_write_json(folder / name, card)
    return dest
