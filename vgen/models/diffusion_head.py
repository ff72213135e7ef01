"""MAR's per-token diffusion head ("Diffusion Loss", LTH14/mar ``models/diffloss.py``) with diffusers' scheduler.

The network is the official ``SimpleMLPAdaLN`` (key names kept: a model holding it as ``diffloss`` loads released
MAR weights as they are): it reads a noisy token ``x_t`` (B, C), the timestep and the transformer's condition
``z`` (B, D) and predicts the noise and a variance interpolation value (2C outputs).

The noise schedule is diffusers' :class:`~diffusers.DDPMScheduler` (``squaredcos_cap_v2`` betas = improved-diffusion's
cosine schedule with betas capped at 0.999, ``variance_type="learned_range"``, ``timestep_spacing="linspace"``:
respacing 1000 steps to N keeps ``round(linspace(0, 999, N))``, the same timesteps as MAR's
``space_timesteps(1000, str(N))``; the previous timestep of each step is the scheduler's ``previous_timestep``).
One step's Gaussian is computed here (constants in float64, arithmetic in the tokens' dtype as in MAR) by
:meth:`Schedule.step` -- the smallest shim, for three details
``DDPMScheduler.step`` cannot express: it draws its own noise from a generator (trajectory alignment needs the noise
given, per step), it returns a sample rather than the Gaussian (mean, log-variance) that speculative acceptance
needs, and at the last step its learned-range lower bound is ``log(clamp(0, 1e-20))`` where MAR's is the clipped
posterior log-variance of the next step. Its float32 ``alphas_cumprod`` would also round MAR's first respaced beta
(4e-5) by 1e-3 relative, so the products are re-taken in float64 from the scheduler's betas. Tests check that the
shim's sample equals ``DDPMScheduler.step``'s wherever the two are defined alike.

Sampling follows MAR: start from ``noise``, at step i add ``temperature * exp(log_var / 2) * step_noise[i]``; with
``cfg`` != 1 the rows are [cond; uncond] and the guided noise prediction is ``uncond + cfg * (cond - uncond)``
(the variance from the conditional half). MAR adds no noise at its last step (``last_noise=False``, the official
rule); vgen's continuous token samplers add it (``last_noise=True``): the token is then a Gaussian given the path,
which is what exact continuous speculative decoding accepts on. ``clip_x0`` clamps each step's x0 prediction: at the first respaced step (t = 999, alphas_cumprod ~ 2e-9) a noise
prediction off by 1e-3 moves the mean by ~0.1, which only long training makes small (MAR: hundreds of epochs);
vgen's short-trained zoo models sample with ``clip_x0=4`` (tokens are normalised to standard deviation 1).
``stop_sigma`` ends the reverse process early, at
the first step whose output noise level ``sqrt(1 - alphas_cumprod)`` is at most ``stop_sigma`` (the token is that
step's output divided by ``sqrt(alphas_cumprod)``): a noise floor for tokens whose tokenizer was trained on noisy
posterior draws anyway.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import nn

from vgen.interfaces import HeadSample

TRAIN_STEPS = 1000
HEAD_RUN = 10  # reverse steps per call of DiffusionHead.reverse_steps (a compiled graph per run length)


def modulate(x, shift, scale):
    return x * (1 + scale) + shift


@functools.lru_cache(maxsize=64)
def _scalar(value: float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A 0-d tensor of ``value`` on ``device``, made once: a head call per token would otherwise copy a Python number
    to the GPU every time (a host round trip). Read only."""
    return torch.tensor(value, device=device, dtype=dtype)


class TimestepEmbedder(nn.Module):
    """Sinusoidal timestep features (cos first, then sin) through a 2-layer MLP."""

    def __init__(self, hidden: int, freq_dim: int = 256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.freq_dim = freq_dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(self.mlp[0].weight.dtype))


class ResBlock(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(ch, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(ch, ch), nn.SiLU(), nn.Linear(ch, ch))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(ch, 3 * ch))

    def forward(self, x, y):
        return self.modulated(x, self.adaLN_modulation(y))

    def modulated(self, x, mod):
        """The block given its modulation ``adaLN_modulation(y)`` (computed ahead for many steps at once)."""
        shift, scale, gate = mod.chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, ch: int, out: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(ch, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(ch, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(ch, 2 * ch))

    def forward(self, x, c):
        return self.modulated(x, self.adaLN_modulation(c))

    def modulated(self, x, mod):
        shift, scale = mod.chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class SimpleMLPAdaLN(nn.Module):
    """MAR's head network: (x_t (B, C), t (B,), c (B, D)) -> (B, 2C): noise prediction, variance value in [-1, 1]."""

    def __init__(self, in_channels: int, model_channels: int, out_channels: int, z_channels: int,
                 num_res_blocks: int):
        super().__init__()
        self.in_channels = in_channels
        self.time_embed = TimestepEmbedder(model_channels)
        self.cond_embed = nn.Linear(z_channels, model_channels)
        self.input_proj = nn.Linear(in_channels, model_channels)
        self.res_blocks = nn.ModuleList(ResBlock(model_channels) for _ in range(num_res_blocks))
        self.final_layer = FinalLayer(model_channels, out_channels)
        self.initialize_weights()

    def initialize_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.time_embed.mlp[0].weight, std=0.02)
        nn.init.normal_(self.time_embed.mlp[2].weight, std=0.02)
        for block in self.res_blocks:  # adaLN-zero: every block starts as the identity
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        for p in (self.final_layer.adaLN_modulation[-1].weight, self.final_layer.adaLN_modulation[-1].bias,
                  self.final_layer.linear.weight, self.final_layer.linear.bias):
            nn.init.zeros_(p)

    def forward(self, x, t, c):
        return self.trunk(x, self.time_embed(t) + self.cond_embed(c))

    def trunk(self, x, y):
        """The network after its embeddings: ``y`` = time embedding + condition embedding (sampling computes the
        condition's once per token and the time's once per schedule, not once per step)."""
        return self.trunk_modulated(x, self.modulations(y))

    def modulations(self, y) -> list[torch.Tensor]:
        """Every layer's adaLN modulation of embeddings ``y`` (any leading shape): they do not depend on the noisy
        token, so a reverse process computes them for a run of steps in one call per layer."""
        return [block.adaLN_modulation(y) for block in self.res_blocks] + [self.final_layer.adaLN_modulation(y)]

    def trunk_modulated(self, x, mods):
        x = self.input_proj(x)
        for block, mod in zip(self.res_blocks, mods):
            x = block.modulated(x, mod)
        return self.final_layer.modulated(x, mods[-1])


def ddpm_scheduler(num_inference_steps: int | None = None):
    """diffusers' DDPM scheduler with MAR's settings (1000 training steps, cosine, learned-range variance)."""
    from diffusers import DDPMScheduler
    s = DDPMScheduler(num_train_timesteps=TRAIN_STEPS, beta_schedule="squaredcos_cap_v2",
                      variance_type="learned_range", clip_sample=False, prediction_type="epsilon",
                      timestep_spacing="linspace")
    if num_inference_steps is not None:
        s.set_timesteps(num_inference_steps)
    return s


@dataclass
class Step:
    """One reverse step's Gaussian: ``mean``, ``log_var`` (B, C) and the ``x0`` it predicted."""
    mean: torch.Tensor
    log_var: torch.Tensor
    x0: torch.Tensor


class Schedule:
    """A respaced reverse schedule of ``num_steps`` steps (``num_steps = 1000``: the training schedule), its
    per-step constants in float64, read from diffusers' ``DDPMScheduler``."""

    def __init__(self, num_steps: int):
        s = ddpm_scheduler(num_steps)
        abar = torch.cumprod(1.0 - s.betas.double(), 0)
        ts = [int(t) for t in s.timesteps]                          # descending original timesteps
        prev = [int(s.previous_timestep(t)) for t in ts]
        a_t = abar[ts]
        a_prev = torch.stack([abar[p] if p >= 0 else torch.ones((), dtype=torch.float64) for p in prev])
        beta = 1 - a_t / a_prev
        post_var = beta * (1 - a_prev) / (1 - a_t)
        # MAR's clipped posterior log-variance: the last step (post_var 0) borrows the next-to-last step's value
        post_log = torch.log(torch.where(post_var > 0, post_var, post_var[-2] if len(ts) > 1 else beta))
        self.timesteps = torch.tensor(ts)
        self.abar_prev = a_prev
        self.consts = dict(
            sqrt_recip=torch.sqrt(1 / a_t), sqrt_recipm1=torch.sqrt(1 / a_t - 1),
            coef_x0=beta * torch.sqrt(a_prev) / (1 - a_t), coef_xt=(1 - a_prev) * torch.sqrt(1 - beta) / (1 - a_t),
            min_log=post_log, max_log=torch.log(beta))
        self.num_steps = len(ts)
        self.rows = [{k: float(v[i]) for k, v in self.consts.items()} for i in range(len(ts))]
        self.out_scale = [float(a) for a in self.abar_prev.sqrt()]
        self.sigmas = [float(v) for v in torch.sqrt(1 - self.abar_prev)]  # each step's output noise level

    def __len__(self) -> int:
        return self.num_steps

    def step(self, i: int, x: torch.Tensor, out: torch.Tensor, clip_x0: float = 0.0) -> Step:
        """Step ``i`` (0 = the noisiest) at ``x`` (B, C) given the network's output (B, 2C) -> its Gaussian.
        ``clip_x0`` > 0 clamps the x0 prediction to [-clip_x0, clip_x0] (guided-diffusion's ``clip_denoised``
        with a range; MAR runs without)."""
        return gaussian_step(self.rows[i], x, out, clip_x0)

    def tensors(self, device, dtype) -> dict:
        """The per-step constants as (S,) tensors (for steps evaluated as rows of one batch)."""
        key = (str(device), dtype)
        cache = self.__dict__.setdefault("_tensors", {})
        if key not in cache:
            cache[key] = {k: v.to(device=device, dtype=dtype) for k, v in self.consts.items()}
        return cache[key]

    def step_rows(self, idx: torch.Tensor, x: torch.Tensor, out: torch.Tensor, clip_x0: float, k: dict) -> Step:
        """:meth:`step` for rows at different steps ``idx`` (R,) (``k``: :meth:`tensors`)."""
        return gaussian_step({name: v[idx][:, None] for name, v in k.items()}, x, out, clip_x0)

    def stop_index(self, stop_sigma: float) -> int:
        """The last step to run: the first whose output noise level sqrt(1 - abar) is <= ``stop_sigma``."""
        return next((i for i, sig in enumerate(self.sigmas) if sig <= stop_sigma), self.num_steps - 1)


def gaussian_step(c, x: torch.Tensor, out: torch.Tensor, clip_x0: float) -> Step:
    """One reverse step's Gaussian at ``x`` from the network's output ``out`` (noise prediction, variance value);
    ``c``: the step's constants (:attr:`Schedule.consts` names; numbers, or tensors broadcasting against ``x``)."""
    eps, var_value = out.chunk(2, dim=-1)
    x0 = c["sqrt_recip"] * x - c["sqrt_recipm1"] * eps
    if clip_x0 > 0:
        x0 = x0.clamp(-clip_x0, clip_x0)
    mean = c["coef_x0"] * x0 + c["coef_xt"] * x
    half = (c["max_log"] - c["min_log"]) / 2  # log_var = frac * max_log + (1 - frac) * min_log, frac = (v+1)/2
    return Step(mean, var_value * half + (half + c["min_log"]), x0)


@functools.lru_cache(maxsize=16)
def schedule(num_steps: int) -> Schedule:
    return Schedule(int(num_steps))


def gaussian_logpdf(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim of log N(x; mean, exp(log_std)^2), in float64."""
    x, mean, log_std = x.double(), mean.double(), log_std.double()
    return (-0.5 * ((x - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


class DiffusionHead(nn.Module):
    """``DiffLoss`` of MAR: the network (``net``), its training loss, and its sampler."""

    def __init__(self, target_channels: int, z_channels: int, depth: int, width: int, num_sampling_steps: int = 100):
        super().__init__()
        self.in_channels = target_channels
        self.num_sampling_steps = int(num_sampling_steps)
        self.net = SimpleMLPAdaLN(target_channels, width, target_channels * 2, z_channels, depth)

    # ---- training ----
    def loss(self, target: torch.Tensor, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """MAR's loss: noise MSE + the variational bound (in bits) for the variance with the mean frozen; at t = 0
        the bound's term is the Gaussian negative log-likelihood of the token (MAR: a discretised likelihood made
        for 8-bit pixels; latents are continuous)."""
        sch = schedule(TRAIN_STEPS)
        n = target.shape[0]
        ti = torch.randint(0, TRAIN_STEPS, (n,), device=target.device)   # original timestep t
        idx = TRAIN_STEPS - 1 - ti                                        # its step index in the schedule
        abar = torch.cumprod(1 - ddpm_betas(target.device), 0)[ti][:, None]
        noise = torch.randn_like(target)
        x_t = abar.sqrt() * target + (1 - abar).sqrt() * noise
        out = self.net(x_t, ti, z)
        eps, var_value = out.chunk(2, dim=-1)
        mse = ((eps - noise) ** 2).mean(-1)
        frozen = torch.cat([eps.detach(), var_value], -1)
        c = {k: v.to(target.device, torch.float32)[idx][:, None] for k, v in sch.consts.items()}
        x0_pred = c["sqrt_recip"] * x_t - c["sqrt_recipm1"] * frozen[:, :self.in_channels]
        mean = c["coef_x0"] * x0_pred + c["coef_xt"] * x_t
        log_var = (var_value + 1) / 2 * c["max_log"] + (1 - var_value) / 2 * c["min_log"]
        true_mean = c["coef_x0"] * target + c["coef_xt"] * x_t
        kl = 0.5 * (-1.0 + log_var - c["min_log"] + torch.exp(c["min_log"] - log_var)
                    + (true_mean - mean) ** 2 * torch.exp(-log_var))
        nll = 0.5 * (math.log(2 * math.pi) + log_var + (target - mean) ** 2 * torch.exp(-log_var))
        vb = torch.where(ti[:, None] == 0, nll, kl).mean(-1) / math.log(2.0)
        loss = mse + vb
        if mask is not None:
            return (loss * mask).sum() / mask.sum()
        return loss.mean()

    # ---- sampling ----
    def time_table(self, sch: Schedule, device, dtype) -> torch.Tensor:
        """The time embeddings of every step of ``sch`` (recomputed when the weights change)."""
        key = (id(sch), str(device), dtype, self.net.time_embed.mlp[0].weight._version, self.training)
        cache = self.__dict__.setdefault("_time_tables", {})
        if key not in cache:
            if len(cache) > 8:
                cache.clear()
            with torch.no_grad():
                cache[key] = self.net.time_embed(sch.timesteps.to(device)).to(dtype)
        return cache[key]

    def step_logpdf(self, z: torch.Tensor, idx: torch.Tensor, x: torch.Tensor, x_next: torch.Tensor,
                    temperature: float = 1.0, cfg: float | torch.Tensor = 1.0, num_steps: int | None = None,
                    clip_x0: float = 0.0) -> torch.Tensor:
        """log-density (R,) of single reverse steps under this head: row r moves from ``x[r]`` at step ``idx[r]`` of
        the schedule to ``x_next[r]``, with conditions ``z`` (R, D) ((2R, D) rows [cond; uncond] when guided; ``cfg``
        a number or (R,) scales). The terms :meth:`path_logpdf` sums, for any subset of steps, differentiable in
        the network (time embeddings included): what a draft distilled on a target's paths maximises."""
        sch = schedule(num_steps or self.num_sampling_steps)
        guide = torch.is_tensor(cfg) or cfg != 1.0
        t_emb = self.net.time_embed(sch.timesteps.to(z.device)[idx].clone()).to(z.dtype)
        c_emb = self.net.cond_embed(z)
        y = c_emb + (torch.cat([t_emb, t_emb]) if guide else t_emb)
        if torch.is_tensor(cfg):
            cfg = cfg.reshape(-1, 1).to(z.dtype)
        out = self._out(x, y, cfg, guide)
        consts = {k: v.clone() for k, v in sch.tensors(z.device, z.dtype).items()}  # (cached: may be inference
        # tensors, made by a sampler earlier in the process, which autograd refuses)
        st = sch.step_rows(idx, x, out, clip_x0, consts)
        return gaussian_logpdf(x_next, st.mean, 0.5 * st.log_var + math.log(max(temperature, 1e-12)))

    def _out(self, x: torch.Tensor, y: torch.Tensor, cfg, guide: bool) -> torch.Tensor:
        """The network's output at ``x`` (R, C) for embeddings ``y`` ((2R, W) rows [cond; uncond] when guided: MAR's
        forward_with_cfg, guided noise and the conditional half's variance)."""
        return self._guided(x, self.net.modulations(y), cfg, guide)

    def _guided(self, x: torch.Tensor, mods: list[torch.Tensor], cfg, guide: bool) -> torch.Tensor:
        """:meth:`_out` given the embeddings' modulations (:meth:`SimpleMLPAdaLN.modulations`)."""
        if not guide:
            return self.net.trunk_modulated(x, mods)
        C = self.in_channels
        out = self.net.trunk_modulated(torch.cat([x, x]), mods)
        cond, uncond = out[:, :C].chunk(2)
        return torch.cat([uncond + cfg * (cond - uncond), out[: len(x), C:]], dim=-1)

    def reverse_steps(self, x: torch.Tensor, y: torch.Tensor, consts: dict, step_noise: torch.Tensor, cfg,
                      log_temp: torch.Tensor, clip_x0: float, guide: bool, refresh: int = 1):
        """A run of S reverse steps from ``x`` (R, C): ``y`` (S, R', W) the steps' embeddings (time + condition),
        ``consts`` the steps' :attr:`Schedule.consts` as (S,) tensors, ``step_noise`` (S, R, C), ``cfg`` a 0-dim or
        (R, 1) tensor, ``log_temp`` 0-dim. Each step: the network (its modulations computed for the whole run in one
        call per layer), guidance, the step's Gaussian, and ``x <- mean + exp(log_std) * noise``; the network runs at
        steps 0, ``refresh``, ... of the run only. A plain function of tensors: :meth:`sample` calls it eagerly or
        compiled (``torch.compile``, one graph per run length). -> (states, means, log_stds), each (S, R, C)."""
        mods = self.net.modulations(y)
        states, means, log_stds = [], [], []
        out = None
        for j in range(consts["sqrt_recip"].shape[0]):
            if j % refresh == 0:
                out = self._guided(x, [m[j] for m in mods], cfg, guide)
            st = gaussian_step({k: v[j] for k, v in consts.items()}, x, out, clip_x0)
            log_std = 0.5 * st.log_var + log_temp
            x = st.mean + log_std.exp() * step_noise[j]
            states.append(x)
            means.append(st.mean)
            log_stds.append(log_std)
        return torch.stack(states), torch.stack(means), torch.stack(log_stds)

    def compiled_reverse_steps(self):
        """:meth:`reverse_steps` under ``torch.compile`` (made once per head; static shapes: :meth:`sample` pads the
        rows to a power of two, so a job compiles one graph per row bucket and run length)."""
        fn = self.__dict__.get("_compiled_reverse")
        if fn is None:  # vgen's compile settings and on-disk cache (docs/compile.md)
            from vgen.kernels.decode import compiled
            fn = self.__dict__["_compiled_reverse"] = compiled(self.reverse_steps)
        return fn

    def sample(self, z: torch.Tensor, noise: torch.Tensor, step_noise: torch.Tensor, temperature: float = 1.0,
               cfg: float | torch.Tensor = 1.0, num_steps: int | None = None, last_noise: bool = False,
               stop_sigma: float = 0.0, clip_x0: float = 0.0, path: bool = False, refresh: int = 1,
               compiled: bool = False) -> HeadSample:
        """Run the reverse process for conditions ``z`` (B, D) -- (2B, D) rows [cond; uncond] when guided (``cfg``
        a number != 1 or a (B,) tensor of per-row scales) -- from ``noise`` (B, C) with ``step_noise[i]`` (B, C)
        at step i; ``clip_x0``: see :meth:`Schedule.step`. Returns the token and its last step's Gaussian; with
        ``path`` also every state of the reverse process and the path's log-density (see :meth:`path_logpdf`).
        ``refresh`` > 1: the network runs at every ``refresh``-th step only and its last output (noise prediction
        and variance value) serves the steps in between: a cheaper, coarser sampler (a speculative draft's; each
        step is still a Gaussian given the path so far, so its path density stays exact). The steps run in runs of
        :data:`HEAD_RUN` (a multiple of ``refresh``) through :meth:`reverse_steps`, compiled when ``compiled``."""
        sch = schedule(num_steps or self.num_sampling_steps)
        guide = torch.is_tensor(cfg) or cfg != 1.0
        last = sch.stop_index(stop_sigma) if stop_sigma > 0 else len(sch) - 1
        dev, dt = z.device, z.dtype
        c_emb = self.net.cond_embed(z)                   # once per token, not per step
        t_emb = self.time_table(sch, dev, dt)            # once per schedule
        cfg_t = cfg.reshape(-1, 1).to(dev, dt) if torch.is_tensor(cfg) else _scalar(float(cfg), dev, dt)
        log_temp = _scalar(math.log(max(temperature, 1e-12)), dev, dt)
        consts = sch.tensors(dev, dt)
        run = -(-HEAD_RUN // refresh) * refresh
        fn = self.compiled_reverse_steps() if compiled else self.reverse_steps
        R = len(noise)
        if compiled and R & (R - 1):  # rows padded to a power of two: a few compiled graphs serve every row count
            pad = (1 << R.bit_length()) - R
            c_emb = torch.cat([torch.cat([h, h[:1].expand(pad, -1)]) for h in c_emb.chunk(2 if guide else 1)])
            if cfg_t.dim():
                cfg_t = torch.cat([cfg_t, cfg_t[:1].expand(pad, -1)])
            noise_in = torch.cat([noise, noise.new_zeros(pad, noise.shape[1])])
            step_noise = torch.cat([step_noise, step_noise.new_zeros(len(step_noise), pad, step_noise.shape[2])], 1)
        else:
            noise_in = noise
        x, parts = noise_in, []
        for s in range(0, last + 1, run):
            e = min(last + 1, s + run)
            part = fn(x, t_emb[s:e, None] + c_emb[None], {k: v[s:e] for k, v in consts.items()}, step_noise[s:e],
                      cfg_t, log_temp, float(clip_x0), guide, refresh)
            parts.append(part)
            x = part[0][-1]
        if len(x) != R:
            parts = [tuple(t[:, :R] for t in part) for part in parts]
            step_noise = step_noise[:, :R]
        mean_l, log_std_l = parts[-1][1][-1], parts[-1][2][-1]
        scale = sch.out_scale[last]
        mean, log_std = mean_l / scale, log_std_l - math.log(scale)
        token = mean + log_std.exp() * step_noise[last] if (last_noise or last < len(sch) - 1) else mean
        if not path:
            return HeadSample(token, mean, log_std)
        states, means, log_stds = (torch.cat([p[i] for p in parts]) for i in range(3))
        logq = gaussian_logpdf(states, means, log_stds).sum(0)
        return HeadSample(token, mean, log_std, torch.cat([noise[None], states]), logq)

    @torch.no_grad()
    def path_logpdf(self, z: torch.Tensor, states: torch.Tensor, temperature: float = 1.0,
                    cfg: float | torch.Tensor = 1.0, num_steps: int | None = None, stop_sigma: float = 0.0,
                    clip_x0: float = 0.0, refresh: int = 1) -> torch.Tensor:
        """log-density (B,) of whole reverse paths ``states`` (S + 1, B, C) (start noise, then each step's output,
        as :meth:`sample` returns them with ``path=True``) under this head with conditions ``z``: the sum of every
        step's Gaussian log-density, all S steps of all B paths in one batched network call (the start noise has
        the same N(0, I) density under every head and is left out). ``refresh``: the density under
        ``sample(..., refresh=...)`` (each step's Gaussian from the network's output at the last refreshed state)."""
        sch = schedule(num_steps or self.num_sampling_steps)
        guide = torch.is_tensor(cfg) or cfg != 1.0
        last = sch.stop_index(stop_sigma) if stop_sigma > 0 else len(sch) - 1
        S, B = last + 1, states.shape[1]
        if states.shape[0] != S + 1:
            raise ValueError(f"paths of {states.shape[0] - 1} steps for a schedule of {S} steps")
        x = states[:-1].reshape(S * B, -1)
        t_emb = self.time_table(sch, z.device, z.dtype)[:S]                  # (S, W)
        c_emb = self.net.cond_embed(z)                                        # (B or 2B, W)
        y = (t_emb[:, None] + c_emb.reshape(-1, B, c_emb.shape[-1]).unsqueeze(1)).reshape(-1, c_emb.shape[-1]) \
            if guide else (t_emb[:, None] + c_emb[None]).reshape(S * B, -1)  # rows (half, step, b)
        if guide:
            cfg = (cfg.reshape(1, B).expand(S, B).reshape(-1, 1).to(z.dtype) if torch.is_tensor(cfg) else cfg)
        out = self._out(x, y, cfg, guide)  # (S*B, 2C), rows (step, b)
        if refresh > 1:  # step i reads the output at step i - i % refresh (the state it was computed at)
            src = (torch.arange(S, device=z.device) // refresh * refresh)
            out = out.reshape(S, B, -1)[src].reshape(S * B, -1)
        k = sch.tensors(z.device, z.dtype)
        idx = torch.arange(S, device=z.device).repeat_interleave(B)
        st = sch.step_rows(idx, x, out, clip_x0, k)
        log_std = 0.5 * st.log_var + math.log(max(temperature, 1e-12))
        return gaussian_logpdf(states[1:].reshape(S * B, -1), st.mean, log_std).reshape(S, B).sum(0)


@functools.lru_cache(maxsize=4)
def _betas(device: str) -> torch.Tensor:
    return ddpm_scheduler().betas.to(device=device, dtype=torch.float32)


def ddpm_betas(device) -> torch.Tensor:
    """The 1000 training betas (float32) on ``device``."""
    return _betas(str(torch.device(device)))


class HeadSampling:
    """The :class:`vgen.interfaces.DiffusionHeadModel` methods of a model holding its head as ``diffloss`` (MAR's
    name): inputs are cast to the head's dtype."""

    def sample_head(self, z, noise, step_noise, temperature=1.0, cfg=1.0, num_steps=None, last_noise=False,
                    stop_sigma=0.0, clip_x0=0.0, path=False, refresh=1, compiled=False) -> HeadSample:
        dt = self.diffloss.net.input_proj.weight.dtype
        return self.diffloss.sample(z.to(dt), noise.to(dt), step_noise.to(dt), temperature, cfg, num_steps,
                                    last_noise, stop_sigma, clip_x0, path, refresh, compiled)

    def head_path_logpdf(self, z, states, temperature=1.0, cfg=1.0, num_steps=None, stop_sigma=0.0, clip_x0=0.0,
                         refresh=1):
        dt = self.diffloss.net.input_proj.weight.dtype
        return self.diffloss.path_logpdf(z.to(dt), states.to(dt), temperature, cfg, num_steps, stop_sigma, clip_x0,
                                         refresh)
