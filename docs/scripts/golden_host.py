"""Record tests/test_golden.py's float32 tables for this kind of host, and its float64 table.

    python docs/scripts/golden_host.py            # this host's float32 bytes: the entries that differ from AVX2's
    python docs/scripts/golden_host.py f64        # the float64 cases (GOLDEN_F64), any host

float32 bytes depend on the kernels MKL, oneDNN and torch pick for the CPU (`test_golden.host_class()`), so a kind
of host the tables do not know skips the float32 cases. Record on a tree that passes the tables on a known host (the
code unchanged), then paste the printed entries into HOST_BYTES / CORE_HOST under the printed host class.
"""
import importlib.util
import sys
from pathlib import Path

tests = Path(__file__).parents[2] / "tests"
sys.path.insert(0, str(tests))
spec = importlib.util.spec_from_file_location("test_golden", tests / "test_golden.py")
G = importlib.util.module_from_spec(spec)
spec.loader.exec_module(G)

F64_CASES = [
    ("photos-gpt", None, (), ()),
    ("photos-gpt", "sjd", (("window", 4), ("init", "sample"), ("fresh_q", "onehot")), ()),
    ("photos-gpt", "scd", (("window", 8), ("coupling", "maximal")), ()),
    ("photos-gpt", "eagle", (("window", 4), ("verify", "token")), ()),
    ("photos-gpt", "zipar", (("window", 4),), ()),
    ("photos-var", None, (), ()),
    ("photos-nar", None, (), ()),
]


def main(which="host"):
    pipes = {}
    if which == "f64":
        import torch
        for case in F64_CASES:
            print(f"    {case!r}:\n        {G.core_values(case, pipes, torch.float64)!r},", flush=True)
        return
    print(f"# host class {G.HOST} (CPU family: {G.HOST_MODEL}; key a table by it where another family of the same "
          "class passes the class's table)")
    print("# HOST_BYTES entries")
    for case in G.GOLDEN:
        got = G.golden_values(case, pipes)
        if got != (G.GOLDEN[case][0], G.PIXELS[case], G.GOLDEN[case][1]):
            print(f"        {case!r}:\n            {got!r},", flush=True)
    print("# CORE_HOST entries")
    for case in list(G.CORE) + list(G.CONTINUOUS):
        got = G.core_values(case, pipes)
        if got != G.CORE.get(case):
            print(f"    {case!r}:\n        {got!r},", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
