"""Where an eagle pass's ops go (docs/lab/benchmarks-log.md "Fewer glue ops per pass"): one photos-gpt image at batch 1,
window 4, eager, under torch.profiler; every top-level aten call (one not made inside another aten call) is charged
to the innermost part it ran in (the target's pass, a head call, an output-head call, each sampler function), and
the table gives calls per target pass. Op counts do not depend on the machine's speed, unlike times.

    python docs/scripts/eagle_ops.py            # this checkout
    python docs/scripts/eagle_ops.py /tmp/old   # another checkout (e.g. a git worktree of an older commit)
"""
import collections
import sys

if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import vgen  # noqa: E402
import vgen.samplers.speculative.head as E  # noqa: E402
from vgen.models.drafter import InferenceHead  # noqa: E402

PARTS = ["draft_dist", "draw", "dense", "window_target", "verify", "catch_up", "draft_chain", "chain_step", "advance"]


def labelled(f, label):
    def g(*a, **k):
        with record_function("part:" + label):
            return f(*a, **k)
    return g


def main():
    print("vgen from", vgen.__file__)
    for name in PARTS:  # module-level functions the step looks up at call time
        if hasattr(E, name):
            setattr(E, name, labelled(getattr(E, name), name))
    InferenceHead.__call__ = labelled(InferenceHead.__call__, "head call")
    InferenceHead.logits = labelled(InferenceHead.logits, "output head")
    pipe = vgen.load_pipeline("photos-gpt")
    cls = type(pipe.model)
    cls.decode_features = labelled(cls.decode_features, "target pass")
    pipe.generate([3], sampler="eagle", window=4, seed=0, batch_size=1, compile=False)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = pipe.generate([3], sampler="eagle", window=4, seed=1, batch_size=1, compile=False)
    calls = collections.Counter()
    for e in prof.events():
        if not e.name.startswith("aten::") or (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::")):
            continue
        part, q = "the loop", e.cpu_parent
        while q is not None:
            if q.name.startswith("part:"):
                part = q.name[5:]
                break
            q = q.cpu_parent
        calls[part] += 1
    passes = out.stats["forward_passes"]
    print(f"{passes} passes (prefill included), {out.stats['accepted_per_step']:.2f} tokens per pass")
    print("| part | top-level aten calls per pass |\n|---|---|")
    for part, n in calls.most_common():
        print(f"| {part} | {n / passes:.1f} |")
    print(f"| all | {sum(calls.values()) / passes:.1f} |")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
