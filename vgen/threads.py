"""CPU threads that fit the machine: each vgen process runs its share of the cores.

PyTorch gives every process as many intra-op threads as the machine has cores. Two processes on one machine (two
jobs, torchrun ranks, a demo beside a benchmark, pytest workers) then run twice as many threads as cores, and the
threads of one team wait on each other while the other process holds the cores. The ``vgen`` commands instead set

    threads = the ``threads=`` option, else  max(1, usable cores // processes this launcher started on this machine)

where the usable cores are this process's CPU affinity and the processes are torchrun's ``LOCAL_WORLD_SIZE`` (1
outside torchrun). ``OMP_NUM_THREADS`` is not read: torchrun sets it to 1 for every process whatever the machine.
The ``vgen`` command (``vgen.cli.main``, before torch loads) also bounds how long OpenMP's idle threads spin before
they sleep (``GOMP_SPINCOUNT=1000`` unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set): a thread spinning at a
barrier while its partner waits for a core held by another process stalls both. ``OMP_WAIT_POLICY=PASSIVE`` (no spinning) fixes the sharing as
well but makes a job alone on 2 cores about 1.6x slower. The measurements are in docs/lab/benchmarks-log.md
(concurrency) and ``docs/scripts/concurrency.sh``.
"""
from __future__ import annotations

import numbers
import os

from vgen.errors import VGenError


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def local_processes() -> int:
    """How many processes the launcher started on this machine (torchrun's ``LOCAL_WORLD_SIZE``; 1 otherwise)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def default_threads() -> int:
    """This process's share of the cores."""
    return max(1, usable_cores() // local_processes())


def check(threads) -> int | None:
    """``threads`` as given (None, or a whole number >= 1), one-line error otherwise."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1:
        raise VGenError(f"threads must be a whole number >= 1 (or null: this process's share of the "
                        f"{usable_cores()} cores), got {threads!r}")
    return int(threads)


def set_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads to ``threads`` (None: :func:`default_threads`); returns the number set."""
    import torch
    n = check(threads) or default_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
