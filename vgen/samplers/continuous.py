"""What every continuous-token sampler shares: its options and its per-sample noise.

Noise is drawn per sample from its seed, per token position, before any model work: ``TokenNoise.start`` (N, L, C)
is each token's starting noise, ``TokenNoise.steps`` (N, L, S, C) the noise of each of its S reverse steps. A
token's randomness is then a function of (seed, position) only: any batching gives the same bytes, and two models
sampling the same position from the same seed share their noise ("trajectory alignment", which is what continuous
speculative decoding rests on). ``uniforms`` (N, L) are the acceptance draws of speculative samplers.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vgen.errors import VGenError
from vgen.interfaces import ModelSpec
from vgen.samplers.base import Options, Sampler, compile_value, option

# compile=auto's cost model for the diffusion head: a compiled reverse process saves about HEAD_SAVED_S_PER_CALL
# seconds per token, and one row bucket of one head compiles in about HEAD_WARMUP_S on an empty inductor cache (CSpD
# compiles two heads). Their measurement is in docs/compile.md.
HEAD_SAVED_S_PER_CALL = 0.04
HEAD_WARMUP_S = 60.0


@dataclass
class ContinuousOptions(Options):
    """The target distribution of a continuous-token sampler: the diffusion head's reverse process with
    ``num_sampling_steps`` steps, its noise scaled by ``temperature``, guided by ``cfg_scale`` (on the head's noise
    prediction, MAR's form) under ``cfg_schedule``."""
    temperature: float = option(1.0, "the diffusion head's temperature: scales the noise of every reverse step")
    cfg_scale: float = option(1.0, "classifier-free guidance scale on the head's noise prediction (1 = off)")
    cfg_schedule: str = option("constant", "guidance over the tokens: constant, or linear from 1 to cfg_scale "
                               "(MAR's)", ("constant", "linear"))
    num_sampling_steps: int = option(0, "the head's respaced reverse steps (0 = the model's own, MAR's 100)")
    stop_sigma: float = option(0.0, "end each token's reverse process at this noise level (0 = run it to the "
                               "end); the tokenizer was trained on posterior draws, so noise below its posterior "
                               "std is not seen in the decoded image")
    clip_x0: float = option(0.0, "clamp the head's x0 prediction to [-clip_x0, clip_x0] at every step (0 = off, "
                            "MAR's way; short-trained heads need it: see vgen.models.diffusion_head)")
    compile: bool | str = option("auto", "torch.compile the diffusion head's reverse process: true, false, or auto "
                                 "(compiled when the job's head calls repay the warm-up; docs/compile.md)")

    def validate(self, spec: ModelSpec | None = None) -> None:
        super().validate(spec)
        if self.temperature <= 0:
            raise VGenError(f"temperature must be > 0 for a diffusion head, got {self.temperature}")
        if self.cfg_scale < 0:
            raise VGenError(f"cfg_scale must be >= 0 (1 = no guidance), got {self.cfg_scale}")
        if not 0 <= self.num_sampling_steps <= 1000:
            raise VGenError(f"num_sampling_steps must be in 1..1000 (0 = the model's own), got "
                            f"{self.num_sampling_steps}")
        if self.clip_x0 < 0:
            raise VGenError(f"clip_x0 must be >= 0 (0 = off), got {self.clip_x0}")
        if not 0.0 <= self.stop_sigma < 1.0:
            raise VGenError(f"stop_sigma must be in [0, 1) (0 = the whole reverse process), got {self.stop_sigma}")
        self.compile = compile_value(self.compile)

    def compile_pays(self, model, samples: int, batch_size: int) -> bool:
        """``compile=auto`` for continuous tokens: the head's reverse process is compiled when the job's head calls
        (one per token per batch) save more than the warm-up (:data:`HEAD_SAVED_S_PER_CALL`,
        :data:`HEAD_WARMUP_S`). Counted for a cold inductor cache, so the choice never depends on earlier runs."""
        calls = -(-samples // batch_size) * model.seq_len
        return calls * HEAD_SAVED_S_PER_CALL >= HEAD_WARMUP_S

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0

    def steps(self, model) -> int:
        return self.num_sampling_steps or model.num_sampling_steps

    def cfg_at(self, done: torch.Tensor | float, total: int) -> torch.Tensor | float:
        """The guidance scale for a token drawn when ``done`` of ``total`` tokens are known (MAR's linear
        schedule: ``1 + (cfg - 1) * done / total``)."""
        if self.cfg_schedule == "linear":
            return 1.0 + (self.cfg_scale - 1.0) * done / total
        return self.cfg_scale


NOT_FOR_CONTINUOUS = ("top_k", "top_p", "top-k", "topk")


class ContinuousSampler(Sampler):
    """Base of the continuous-token samplers: refuses the token-only options with the reason."""
    Options = ContinuousOptions

    def __init__(self, **options):
        bad = sorted(k for k in options if k in NOT_FOR_CONTINUOUS)
        if bad:
            raise VGenError(f"{', '.join(bad)} mean(s) nothing for continuous tokens (a diffusion head has no "
                            "vocabulary to truncate): drop it, and use temperature or cfg_scale instead")
        super().__init__(**options)


@dataclass
class TokenNoise:
    start: torch.Tensor     # (N, L, C)
    steps: torch.Tensor     # (N, L, S, C)
    uniforms: torch.Tensor  # (N, L)

    def at(self, rows: torch.Tensor | slice, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Noise of tokens ``positions`` (n,) of ``rows``: (start (n, C), steps (S, n, C))."""
        return self.start[rows, positions], self.steps[rows, positions].transpose(0, 1)


def token_noise(seeds: Sequence[int], length: int, steps: int, channels: int, device=None,
                stream: int = 0) -> TokenNoise:
    """Per-sample Gaussian noise for ``length`` tokens of ``channels`` values and ``steps`` reverse steps, drawn on
    the CPU from each seed (so every device and every batching sees the same numbers)."""
    start, step, u = [], [], []
    for s in seeds:
        g = torch.Generator().manual_seed((int(s) * 1000 + 500 + stream) % 2 ** 64)
        start.append(torch.randn((length, channels), generator=g))
        step.append(torch.randn((length, steps, channels), generator=g))
        u.append(torch.rand((length,), generator=g))
    if not start:
        return TokenNoise(torch.empty(0, length, channels, device=device),
                          torch.empty(0, length, steps, channels, device=device), torch.empty(0, length, device=device))
    return TokenNoise(torch.stack(start).to(device), torch.stack(step).to(device), torch.stack(u).to(device))


def rejection_generators(seeds: Sequence[int], stream: int = 7) -> list[torch.Generator]:
    """One CPU generator per sample for open-ended draws (resampling after a rejection): row i's draws depend on
    its seed and on how many it has made, never on the other rows."""
    return [torch.Generator().manual_seed((int(s) * 1000 + 900 + stream) % 2 ** 64) for s in seeds]


def draw_tokens(model, z: torch.Tensor, noise: TokenNoise, rows: torch.Tensor, positions: torch.Tensor,
                options: ContinuousOptions, length: int, guided: bool, steps: int | None = None, path: bool = False,
                refresh: int = 1):
    """Draw the tokens at ``positions`` (R,) of samples ``rows`` (R,) with the model's head from conditions ``z``
    ((R, D), or (2R, D) rows [cond; uncond] when ``guided``), each from its own position's noise; the guidance
    scale follows ``options.cfg_schedule`` over the position. -> ``HeadSample`` (R, C) with its last step's
    Gaussian (the continuous samplers always add the last step's noise: a token is a Gaussian given its path).
    ``steps``: the number of reverse steps (default: the options' for ``model``; a draft runs the target's);
    ``path``: also return the reverse process's states and log-density; ``refresh``: see ``DiffusionHead.sample``."""
    start, step_noise = noise.at(rows, positions)
    return model.sample_head(z, start, step_noise, options.temperature, guidance(options, positions, length, guided,
                                                                                z.dtype),
                             steps or options.steps(model), last_noise=True, stop_sigma=options.stop_sigma,
                             clip_x0=options.clip_x0, path=path, refresh=refresh, compiled=options.compile is True)


def guidance(options: ContinuousOptions, positions: torch.Tensor, length: int, guided: bool, dtype=torch.float32):
    """The guidance scale of the tokens at ``positions``: a (R,) tensor under the linear schedule, else a number."""
    if guided and options.cfg_schedule == "linear":
        return options.cfg_at(positions.to(dtype), length)
    return options.cfg_scale if guided else 1.0


class Clock:
    """Adds up wall time per part, on the CPU only (a CUDA timing would need a host sync per token)."""

    def __init__(self, device: torch.device):
        self.on = device.type == "cpu"
        self.parts: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, part: str) -> None:
        if self.on:
            now = time.perf_counter()
            self.parts[part] = self.parts.get(part, 0.0) + now - self._t
            self._t = now

    def stats(self) -> dict:
        return {f"{k}_seconds": v for k, v in self.parts.items()}
