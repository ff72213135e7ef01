"""Recipe: distil a CSpD draft (a causal continuous AR model) on its target's reverse paths.

CSpD's path rule accepts a drafted token with min(1, P(path) / Q(path)): the ratio of the target's and the draft's
densities of the draft's whole reverse process (docs/continuous.md). A draft trained on the data alone learns its
own paths; this recipe trains it on the target's instead, maximising the draft's log-density of reverse paths the
target sampled (guided as the card samples: linear CFG, ``clip_x0``, temperature), i.e. minimising KL(P || Q) on
path space, teacher-forced on real token sequences. Both conditions' rows are trained (the draft's guided step
needs its class and its null condition).

Paths are sampled once and cached in the run folder (``paths_<split>.pt``: for ``n_seq`` sequences, ``positions``
random tokens each, the target's whole reverse process); the sequences are posterior draws of the photo crops
(``contexts=photos``) or the target's own samples (``contexts=target``: the contexts CSpD drafts in). Each training
step takes ``batch_size`` sequences, runs the draft's transformer over them (class and null condition), and scores
every step of each of their cached paths (or ``path_steps`` random ones: an unbiased estimate of the path's
log-density) under the draft's head (``DiffusionHead.step_logpdf``); the loss is minus their mean. Held
out, at every checkpoint: the mean of min(1, Q/P) over test paths (the path rule's acceptance of the target's own
paths; teacher-forced) and the mean log-ratio. Writes a pipeline folder ``pipeline/`` (the draft's card and
tokenizer, the distilled weights in the draft file's dtypes): ``sampler=cspd draft=<out>/pipeline``.

    vgen train recipe=car-distill
"""
from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from vgen.errors import VGenError
from vgen.io import atomic_write_bytes, atomic_write_json, read_safetensors, save_safetensors
from vgen.train.common import RecipeConfig, adamw, recipe, start_run, train_loop
from vgen.train.continuous import cached_latents, draw


@dataclass
class CarDistillConfig(RecipeConfig):
    out: str = "runs/photos-car-draft-distilled"
    target: str = "photos-car"         # the CSpD target: a zoo name or a pipeline folder (continuous next-token)
    draft: str = "photos-car-draft"    # the draft to start from (its weights are the initialisation)
    steps: int = 400
    batch_size: int = 8                # sequences per step
    lr: float = 5e-5
    weight_decay: float = 0.0
    warmup: int = 20
    n_seq: int = 256                   # training sequences with cached target paths
    n_test: int = 32                   # held-out sequences (paths sampled the same way)
    positions: int = 32                # tokens per sequence whose target paths are cached
    contexts: str = "photos"           # the sequences paths are conditioned on: photos (posterior draws of crops)
                                       # or target (the target's own samples, card settings: what CSpD drafts after)
    path_steps: int = 100              # reverse steps scored per path per training step (>= the schedule: all)
    save_every: int = 50


def load_pair(target: str, draft: str, device):
    """(target pipeline, draft pipeline); one-line errors, from the cards before any weights load, unless both are
    causal continuous-token models over the photos' classes and the draft makes the target's tokens (same tokenizer
    and grid), and, once loaded, unless their heads run the same number of reverse steps."""
    from vgen.cards import Card
    from vgen.data import NUM_CLASSES
    from vgen.interfaces import Order
    from vgen.pipeline import Pipeline
    tc = Card.load(target)
    for name, c in ((target, tc), (draft, Card.load(draft))):
        if c.order != Order.CONTINUOUS_NEXT_TOKEN:
            raise VGenError(f"{name} is not a causal continuous-token model ({c.model_kind}): car-distill "
                            "trains a CSpD draft for a CAR target (photos-car, photos-car-draft)")
        if c.num_classes != NUM_CLASSES:
            raise VGenError(f"{name} has {c.num_classes} classes, the photos it is distilled on {NUM_CLASSES}: "
                            "distil a model trained on the photos' classes")
    dc = tc.draft_card(draft)
    tp, dp = Pipeline.from_card(tc, device=device), Pipeline.from_card(dc, device=device)
    if tp.model.num_sampling_steps != dp.model.num_sampling_steps:
        raise VGenError(f"{draft} runs {dp.model.num_sampling_steps} head steps, {target} "
                        f"{tp.model.num_sampling_steps}: their reverse paths cannot be compared step by step")
    return tp, dp


def guidance(sampling: dict, positions: torch.Tensor, length: int) -> float | torch.Tensor:
    """The guidance scale the card's continuous sampler gives each token position (its ``cfg_scale`` and
    ``cfg_schedule``, through :func:`vgen.samplers.continuous.guidance`)."""
    from vgen.samplers.continuous import ContinuousOptions
    from vgen.samplers.continuous import guidance as sampler_guidance
    o = ContinuousOptions(cfg_scale=float(sampling.get("cfg_scale", 1.0)),
                          cfg_schedule=sampling.get("cfg_schedule", ContinuousOptions.cfg_schedule))
    return sampler_guidance(o, positions, length, o.guided)


def conditions(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Teacher-forced head conditions of ``x`` (B, L, C) under labels ``y`` and the null condition: (2, B, L, D)."""
    return torch.stack([model(x, y), model(x, model.null_cond(y))])


@torch.no_grad()
def sample_paths(target, lat: dict, n: int, positions: int, sampling: dict, seed: int, batch: int = 16) -> dict:
    """The target's reverse paths at ``positions`` random tokens of each of ``n`` posterior draws: tokens (n, L, C),
    labels (n,), pos (n, P), states (S + 1, n * P, C) (rows sequence-major)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.arange(n)
    x, y = draw(lat, idx, g)
    L = x.shape[1]
    pos = torch.stack([torch.randperm(L, generator=g)[:positions] for _ in range(n)])
    dev = next(target.parameters()).device
    states = []
    for i in tqdm(range(0, n, batch), desc="target paths", leave=False):
        xb, yb, pb = x[i:i + batch].to(dev), y[i:i + batch].to(dev), pos[i:i + batch].to(dev)
        z = conditions(target, xb, yb)  # (2, b, L, D)
        zr = z.gather(2, pb[None, :, :, None].expand(2, -1, -1, z.shape[-1])).flatten(1, 2)  # (2, b*P, D)
        R, C = zr.shape[1], x.shape[-1]
        S = target.num_sampling_steps
        noise = torch.randn((R, C), generator=g).to(dev)
        step_noise = torch.randn((S, R, C), generator=g).to(dev)
        cfg = guidance(sampling, pb.flatten(), L)
        z_in = zr.flatten(0, 1) if torch.is_tensor(cfg) or cfg != 1.0 else zr[0]
        hs = target.sample_head(z_in, noise, step_noise, float(sampling.get("temperature", 1.0)), cfg,
                                clip_x0=float(sampling.get("clip_x0", 0.0)), path=True)
        states.append(hs.states.float().cpu())
    return {"tokens": x, "labels": y, "pos": pos, "states": torch.cat(states, 1)}


def target_contexts(run, pipe, n: int, seed: int, split: str, batch: int = 16) -> dict:
    """``n`` of the target's own samples (card settings, its plain sampler, classes in turn, seeds ``seed + i``) as
    tokens (n, L, C) and labels, in :func:`sample_paths`'s input form (``mean``, ``std`` = 0, ``labels``); cached
    as ``contexts_<split>.pt``."""
    path = run.path / f"contexts_{split}.pt"
    if path.exists():
        d = torch.load(path, weights_only=True)
        if d["mean"].shape[0] == n:
            return d
    labels = torch.arange(n) % pipe.model.num_classes
    tok = pipe.generate(labels.tolist(), seed=seed, batch_size=batch, progress=True).tokens.float()
    d = {"mean": tok.half(), "std": torch.zeros_like(tok).half(), "labels": labels}
    buf = io.BytesIO()
    torch.save(d, buf)
    atomic_write_bytes(path, buf.getvalue())
    return d


def cached_paths(run, target, lat: dict, n: int, positions: int, sampling: dict, seed: int, split: str) -> dict:
    path = run.path / f"paths_{split}.pt"
    if path.exists():
        d = torch.load(path, weights_only=True)
        if d["pos"].shape == (n, positions):
            return d
    d = sample_paths(target, lat, n, positions, sampling, seed)
    buf = io.BytesIO()
    torch.save(d, buf)
    atomic_write_bytes(path, buf.getvalue())
    return d


def path_nll(draft, paths: dict, seqs: torch.Tensor, sampling: dict, steps: torch.Tensor | None, dev) -> torch.Tensor:
    """Mean negative log-density per scored step of the cached target paths of sequences ``seqs`` under the draft:
    ``steps`` (R, k) the scored step indices per path, or None for every step (then also returns per-path sums)."""
    P = paths["pos"].shape[1]
    x, y, pos = paths["tokens"][seqs].to(dev), paths["labels"][seqs].to(dev), paths["pos"][seqs].to(dev)
    rows = (seqs[:, None] * P + torch.arange(P)).flatten()
    st = paths["states"][:, rows].to(dev)  # (S + 1, R, C)
    S, R = st.shape[0] - 1, st.shape[1]
    z = conditions(draft, x, y)
    zr = z.gather(2, pos[None, :, :, None].expand(2, -1, -1, z.shape[-1])).flatten(1, 2)  # (2, R, D)
    cfg = guidance(sampling, pos.flatten(), x.shape[1])
    guided = torch.is_tensor(cfg) or cfg != 1.0
    if steps is None:
        steps = torch.arange(S, device=dev).expand(R, S)
    k = steps.shape[1]
    r = torch.arange(R, device=dev)[:, None].expand(R, k).flatten()
    i = steps.flatten()
    zz = torch.cat([zr[0][r], zr[1][r]]) if guided else zr[0][r]
    cf = cfg[r] if torch.is_tensor(cfg) else cfg
    lp = draft.diffloss.step_logpdf(zz, i, st[i, r], st[i + 1, r], float(sampling.get("temperature", 1.0)), cf,
                                    clip_x0=float(sampling.get("clip_x0", 0.0)))
    return lp.reshape(R, k)


@torch.no_grad()
def path_acceptance(target, draft, paths: dict, sampling: dict, dev, batch: int = 8) -> dict:
    """On cached target paths: mean min(1, Q/P) (the path rule's acceptance of these paths) and mean log(P/Q)."""
    acc, lr, n = 0.0, 0.0, 0
    for i in range(0, paths["pos"].shape[0], batch):
        seqs = torch.arange(i, min(i + batch, paths["pos"].shape[0]))
        lq = path_nll(draft, paths, seqs, sampling, None, dev).sum(1)
        lp = path_nll(target, paths, seqs, sampling, None, dev).sum(1)
        ratio = (lq - lp).clamp_max(0)
        acc += float(ratio.exp().sum())
        lr += float((lp - lq).sum())
        n += lq.numel()
    return {"test_path_acceptance": acc / n, "test_log_ratio": lr / n}


@recipe(CarDistillConfig)
def train_car_distill(cfg: CarDistillConfig) -> dict:
    if cfg.positions < 1 or cfg.path_steps < 1 or cfg.n_seq < cfg.batch_size or cfg.n_test < 1:
        raise VGenError("positions, path_steps and n_test must be >= 1 and n_seq >= batch_size")
    if cfg.contexts not in ("photos", "target"):
        raise VGenError(f"contexts={cfg.contexts}: use photos (posterior draws of the crops) or target (the "
                        "target's own samples)")
    from vgen.train.common import train_device
    tp, dp = load_pair(cfg.target, cfg.draft, train_device(cfg.device))  # refused before any run folder exists
    run, dev = start_run(cfg)
    target = tp.model.eval().requires_grad_(False)
    draft = dp.model.float().eval().requires_grad_(True)
    sampling = tp.card.sampling
    tok = tp.tokenizer.eval()
    size = tp.card.image_size or 64
    if cfg.contexts == "target":
        ctx = {split: target_contexts(run, tp, n, seed, split) for split, n, seed in
               (("train", cfg.n_seq, cfg.seed), ("test", cfg.n_test, cfg.seed + 1_000_000))}
    else:
        ctx = {split: cached_latents(run, tok, split, n, seed, size) for split, n, seed in
               (("train", cfg.n_seq, cfg.seed), ("test", cfg.n_test, cfg.seed + 1))}
    tr = cached_paths(run, target, ctx["train"], cfg.n_seq, cfg.positions, sampling, cfg.seed, "train")
    te = cached_paths(run, target, ctx["test"], cfg.n_test, cfg.positions, sampling, cfg.seed + 1, "test")
    S = target.num_sampling_steps
    opt = adamw(draft, cfg.lr, cfg.weight_decay)
    g = torch.Generator()
    before = path_acceptance(target, draft, te, sampling, dev)
    run.log({"step": 0, "before": True, **before})

    def step_fn(step):
        draft.eval()  # (train_loop sets train mode; the draft's label dropout would flip conditions)
        g.manual_seed(cfg.seed * 1_000_003 + step)
        seqs = torch.randperm(cfg.n_seq, generator=g)[:cfg.batch_size]
        steps = None if cfg.path_steps >= S else torch.randint(0, S, (cfg.batch_size * cfg.positions, cfg.path_steps),
                                                                generator=g).to(dev)
        lp = path_nll(draft, tr, seqs, sampling, steps, dev)
        return -lp.float().mean(), {}

    def on_save(step):
        run.log({"step": step, **path_acceptance(target, draft, te, sampling, dev)})

    step, last = train_loop(cfg, draft, opt, run, step_fn, desc="car-distill", clip=1.0, log_every=10,
                            on_save=on_save)
    src = dp.card.model_path
    state, meta = read_safetensors(src, "")
    dtypes = {k: v.dtype for k, v in state.items()}
    new = {k: v.detach().cpu().to(dtypes[k]) for k, v in draft.state_dict().items()}
    draft.load_state_dict({k: v.float() for k, v in new.items()})  # measure the weights that ship
    metrics = {**path_acceptance(target, draft, te, sampling, dev), "steps": step, "train_loss_last": last,
               "before": before}
    run.log({"step": step, "final": True, **metrics})
    folder = run.path / "pipeline"
    folder.mkdir(exist_ok=True)
    card = dict(dp.card.data)
    card["name"] = f"{card.get('name', 'draft')}-distilled"
    card["distilled"] = {"target": cfg.target, "train": asdict(cfg), "metrics": metrics}
    save_safetensors(new, folder / card["model"], metadata={**meta, "train": json.dumps(asdict(cfg))})
    if card.get("tokenizer"):
        atomic_write_bytes(folder / card["tokenizer"], dp.card.tokenizer_path.read_bytes())
    atomic_write_json(folder / "pipeline.json", card)
    return metrics
