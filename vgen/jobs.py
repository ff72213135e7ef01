"""Sampling jobs (``vgen sample``): sharded over torchrun ranks by global sample index, resumable, every file
written atomically.

Sample i always has label ``labels[i % len(labels)]`` (a text model: prompt ``prompts[i % len(prompts)]``, the prompts
given or read from ``prompt_file``) and seed ``seed + i``, so which process draws it, in which
batch, and whether the job was killed and rerun never changes its bytes. The output folder holds

    000000.png ...      one file per sample (``Generation.save``); a video model writes 000000.mp4 (written
                        last: it marks the sample done), 000000.gif and 000000.strip.png
    run.json            the settings that define the samples: a rerun with other settings is refused
    .parts/*.json       the stats of each finished batch (schema: ``vgen.stats``), merged into
    stats.json          by rank 0 at the end, with grid.png (the first samples)
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from vgen import validate
from vgen.cards import Card
from vgen.conditions import kind_of
from vgen.errors import VGenError
from vgen.stats import merge_stats, numeric

GRID_MAX = 256  # grid.png shows at most this many samples
GRID_MAX_VIDEOS = 16  # ... or this many clips, one row of frames each


@dataclass
class SampleJob:
    model: str                       # zoo name or pipeline folder
    sampler: str | None = None       # None: the model's plain sampler
    options: dict = dataclasses.field(default_factory=dict)  # sampler options (None values: card / default)
    labels: list[int] | None = None  # cycled over the samples; None: every class
    num_samples: int = 16
    seed: int = 0
    batch_size: int = 8
    outdir: str = "samples"
    device: str = "cpu"
    dtype: str | None = None         # the model's weights and KV cache (float32 | bfloat16 | float16); None: the card's
    quantize: str | None = None      # int8 | int4: the transformer's weight matrices in fewer bits (vgen.kernels.quant)
    quantize_group: int = 32         # int4's group of input channels (32, 64, 128, 256)
    grid_nrow: int = 8
    progress: bool = True
    prompt: str | None = None        # video models: a clip file (MP4 / GIF) whose first frames every sample continues
    prompt_frames: int = 1
    prompts: list[str] | None = None  # text models: cycled over the samples
    prompt_file: str | None = None   # text models: .txt (a prompt per line), .jsonl or .csv (a caption column)
    prompt_column: str | None = None  # the column of a .jsonl / .csv prompt file (default: caption, prompt, text)

    def given_prompts(self) -> list[str] | None:
        """The prompts given inline or read from ``prompt_file`` (one-line errors naming the file and line)."""
        if self.prompt_file is not None:
            if self.prompts is not None:
                raise VGenError("give prompts=[...] or prompt_file=..., not both")
            from vgen.io import read_prompts
            return read_prompts(self.prompt_file, self.prompt_column)
        return None if self.prompts is None else list(self.prompts)

    def prompt_clip(self, card: Card):
        """The prompt clip, read and checked against the card (None without a prompt)."""
        if self.prompt is None:
            return None
        from vgen.io import read_video
        if not Path(self.prompt).is_file():
            raise VGenError(f"prompt clip {self.prompt} not found: give an MP4 or GIF file")
        clip = read_video(self.prompt)
        card.check_prompt(clip, self.prompt_frames)
        return clip

    def plan(self):
        """Everything checked before any weights load: (card, sampler name, resolved options, the per-sample
        condition (:mod:`vgen.conditions`: the first ``num_samples`` of the labels or prompts, cycled))."""
        from vgen.pipeline import load_card, resolve_sampler
        from vgen.samplers import plain_sampler
        card = load_card(self.model)
        name = self.sampler or plain_sampler(card)
        opts = dataclasses.asdict(resolve_sampler(card, name, **self.options).options)
        if self.num_samples < 1:
            raise VGenError(f"num_samples must be >= 1, got {self.num_samples}")
        if self.batch_size < 1:
            raise VGenError(f"batch_size must be >= 1, got {self.batch_size}")
        validate.seed(self.seed, self.num_samples)
        validate.device(self.device)
        validate.dtype(self.dtype)
        from vgen.kernels.quant import check_mode
        check_mode(self.quantize, self.quantize_group)
        validate.outdir(self.outdir)
        if self.labels is not None and not list(self.labels):
            raise VGenError("labels is empty: give class ids, e.g. labels=[0,3], or labels=null for every class")
        cond = card.condition(None if self.labels is None else list(self.labels), self.given_prompts(),
                              default_all_classes=True)
        self.prompt_clip(card)
        return card, name, opts, cond.cycle(self.num_samples)

    def run(self, out: Path | None = None, accepted=None) -> dict | None:
        """Draw the missing samples into ``out`` (default ``outdir``); rank 0 returns the merged stats.
        ``accepted(out)`` runs on rank 0 once the folder is locked and holds this run (or nothing), before any
        sample is drawn: where the CLI records the config (a refused run writes nothing)."""
        import torch
        from tqdm.auto import tqdm

        from vgen import distributed as vd
        from vgen.io import atomic_write_json, make_grid, read_pngs, save_png
        from vgen.pipeline import pipeline_for

        card, name, opts, conds = self.plan()
        video = card.spec.is_video
        ext = ".mp4" if video else ".png"
        out = validate.outdir(out or self.outdir)
        n = len(conds)
        run_key = {"model": self.model, "sampler": name, "options": opts, "seed": self.seed,
                   "labels": None if self.labels is None else [int(c) for c in self.labels]}
        if self.dtype is not None:  # another precision draws other samples (None: the card's, as before)
            run_key["dtype"] = str(validate.dtype(self.dtype)).removeprefix("torch.")
        if self.quantize:  # the quantized model's distribution: other samples
            run_key["quantize"] = self.quantize if self.quantize == "int8" else f"int4/{self.quantize_group}"
        if kind_of(conds.kind).reads_text:  # the prompts define the samples (a prompt file's text, not only its name)
            run_key["prompts"] = self.given_prompts()
        clip = self.prompt_clip(card)
        if clip is not None:  # the prompt's pixels define the samples, not only its name
            import hashlib
            run_key["prompt"] = {"file": str(self.prompt), "frames": self.prompt_frames,
                                 "sha1": hashlib.sha1(clip.numpy().tobytes()).hexdigest()}
        t_start = time.perf_counter()
        with vd.process_group(self.device) as (rank, world, device):
            # weights read and checked before anything is written
            pipe = pipeline_for(card, device=device, dtype=self.dtype, quantize=self.quantize,
                                quantize_group=self.quantize_group)
            with FolderLock(out):
                todo = None
                if rank == 0:  # one view of the folder, shared before any write; a refusal stops every rank
                    try:
                        todo = prepare_outdir(out, run_key, n, ext)
                        if accepted is not None:
                            accepted(out)
                    except VGenError as e:
                        todo = e
                todo = vd.broadcast(todo)
                if isinstance(todo, VGenError):
                    raise VGenError(str(todo))
                mine = todo[rank::world]
                shard = f" [rank {rank}/{world}]" if world > 1 else ""
                bar = tqdm(total=len(mine), desc=f"sample {name}{shard}", unit="clip" if video else "img",
                           disable=not self.progress)
                for k in range(0, len(mine), self.batch_size):
                    idx = mine[k:k + self.batch_size]
                    c = conds.take(idx)
                    gen = pipe.generate(**c.record(), sampler=name, seeds=[self.seed + i for i in idx],
                                        prompt=clip, prompt_frames=self.prompt_frames, **opts)
                    try:
                        gen.save(out, idx)
                        atomic_write_json(out / ".parts" / f"{idx[0]:06d}-{len(idx)}-r{rank}.json",
                                          {"indices": idx, **numeric(gen.stats)})
                    except OSError as e:  # a full disk: the files written so far are whole (atomic writes)
                        import errno
                        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                            raise
                        have = sum((out / f"{i:06d}{ext}").exists() for i in range(n))
                        raise VGenError(f"no space left on the device of {out}: {have} of {n} samples are safely on "
                                        "disk; free some space and run the same command again to resume") from None
                    bar.update(len(idx))
                bar.close()
                vd.barrier()
                summary = None
                if rank == 0:
                    summary = {**merged_parts(out, n), **run_key, "num_samples": n, **conds.record(), "processes": world,
                               "threads": torch.get_num_threads(), "tf32": torch.backends.cuda.matmul.allow_tf32,
                               "generated_now": len(todo), "skipped": n - len(todo),
                               **({"quantization": pipe.quantization} if self.quantize else {}),
                               "wall_seconds": time.perf_counter() - t_start}
                    if video:  # one row of frames per clip
                        files = [out / f"{i:06d}.strip.png" for i in range(min(n, GRID_MAX_VIDEOS))]
                        save_png(out / "grid.png", make_grid(read_pngs(files), nrow=1, pad=0))
                    else:
                        files = [out / f"{i:06d}.png" for i in range(min(n, GRID_MAX))]
                        save_png(out / "grid.png", make_grid(read_pngs(files), nrow=self.grid_nrow))
                    atomic_write_json(out / "stats.json", summary)
                    extra = (f", {summary['accepted_per_step']:.2f} tokens per pass per sample"
                             if "accepted_per_step" in summary else "")
                    resumed = f" ({n - len(todo)} already on disk)" if len(todo) < n else ""
                    procs = f" on {world} processes" if world > 1 else ""
                    what = "clips (.mp4, .gif, .strip.png)" if video else "images"
                    print(f"wrote {n} {what}{resumed}, grid.png and stats.json to {out}{procs} "
                          f"({summary['seconds']:.2f} s sampling, {summary['forward_passes']} forward passes{extra})")
                vd.barrier()
        return summary


class FolderLock:
    """One job per output folder: ``<folder>/.vgen.lock`` holds the owner's host, pid and job id while it runs.
    The processes of one torchrun job share the lock (same job id: torchrun's run id and rendezvous address); a
    second job is refused with a one-line error; a lock whose owner died on this host is taken over. The lock is
    created atomically with its content (written aside, then hard-linked into place), removed by its creator."""
    NAME = ".vgen.lock"

    def __init__(self, folder: Path):
        import os
        import socket
        self.path = Path(folder) / self.NAME
        self.host, self.pid = socket.gethostname(), os.getpid()
        world = int(os.environ.get("WORLD_SIZE", 1))
        self.job = (f"torchrun:{os.environ.get('TORCHELASTIC_RUN_ID')}@{os.environ.get('MASTER_ADDR')}:"
                    f"{os.environ.get('MASTER_PORT')}" if world > 1 else f"{self.host}:{self.pid}")
        self.owner = False

    def _read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # unreadable: treated as held by someone else

    def _alive(self, info: dict) -> bool:
        import os
        if info.get("host") != self.host or not isinstance(info.get("pid"), int):
            return True  # another machine's process cannot be checked from here
        try:
            os.kill(info["pid"], 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:  # a killed process nobody has reaped yet (a zombie) still answers kill(pid, 0)
            stat = Path(f"/proc/{info['pid']}/stat").read_text()
            return stat[stat.rindex(")") + 2] != "Z"
        except (OSError, ValueError, IndexError):
            return True

    def __enter__(self):
        from vgen.io import atomic_write_with
        me = {"host": self.host, "pid": self.pid, "job": self.job, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(3):
            try:  # atomic: fails if the lock exists; no temporary file is left whatever happens
                atomic_write_with(self.path, lambda tmp: tmp.write_text(json.dumps(me)), exclusive=True)
                self.owner = True
                return self
            except FileExistsError:
                pass
            info = self._read()
            if info is None:
                continue  # released meanwhile: try again
            if info.get("job") == self.job:
                return self  # another process of this torchrun job made it
            if info and not self._alive(info):  # stale: its owner died on this host
                if self._read() == info:  # still that dead owner's (not one a concurrent run just took over)
                    self.path.unlink(missing_ok=True)
                continue
            who = f"pid {info.get('pid')} on {info.get('host')} since {info.get('started')}" if info else "another run"
            raise VGenError(f"{self.path.parent} is in use by {who}: wait for it, or choose another outdir "
                            f"(delete {self.path} if that run is gone)")
        raise VGenError(f"could not lock {self.path.parent}: another run keeps taking it; choose another outdir")

    def __exit__(self, *exc):
        if self.owner and (self._read() or {}).get("pid") == self.pid:
            self.path.unlink(missing_ok=True)
        return False


def prepare_outdir(out: Path, run_key: dict, n: int, ext: str = ".png") -> list[int]:
    """Check the folder holds this run (or nothing), drop temp files of a killed run, list missing indices."""
    from vgen.io import atomic_write_json
    out.mkdir(parents=True, exist_ok=True)
    key_file = out / "run.json"
    want = json.loads(json.dumps(run_key))
    if key_file.exists():
        from vgen.io import read_json
        old = read_json(key_file, "run record", f"it is damaged: delete {key_file} to resume these samples with the "
                        "settings given now, or choose a new outdir")
        if old != want:
            diff = sorted(k for k in set(old) | set(want) if old.get(k) != want.get(k))
            raise VGenError(f"{out} holds samples of another run (differs in {', '.join(diff)}): resume with the "
                            "same settings, or choose a new outdir")
    elif any(out.glob("[0-9][0-9][0-9][0-9][0-9][0-9].png")) or any(out.glob("[0-9][0-9][0-9][0-9][0-9][0-9].mp4")):
        raise VGenError(f"{out} already holds numbered samples from an unknown run: choose a new outdir")
    atomic_write_json(key_file, run_key)
    for tmp in list(out.glob(".*.tmp")) + list((out / ".parts").glob(".*.tmp")):
        if not tmp.name.startswith(f".{FolderLock.NAME}."):  # another job's lock being written (to be refused)
            tmp.unlink(missing_ok=True)  # left by a killed writer of this folder (the lock says no one else writes)
    return [i for i in range(n) if not (out / f"{i:06d}{ext}").exists()]


def merged_parts(out: Path, n: int) -> dict:
    """The stats of every finished batch on disk (this run and earlier, resumed ones) for indices < n, merged
    with the one stats schema; ``samples_with_stats`` says how many samples they cover."""
    parts, seen = [], set()
    for f in sorted((out / ".parts").glob("*.json")):
        try:  # a damaged part (a killed writer cannot leave one: they are atomic) only loses its batch's stats
            p = json.loads(f.read_text())
            idx = [int(i) for i in p.pop("indices")]
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            import warnings
            warnings.warn(f"{f} is damaged: its batch's stats are left out of stats.json", stacklevel=2)
            continue
        if all(i < n and i not in seen for i in idx):
            parts.append((p, len(idx)))
            seen.update(idx)
    if not parts:
        return {"samples_with_stats": 0, "forward_passes": 0, "tokens": 0, "seconds": 0.0}
    m = merge_stats(parts)
    m["samples_with_stats"] = m.pop("num_samples")
    m["ms_per_token"] = 1e3 * m["seconds"] / m["tokens"]
    return m
