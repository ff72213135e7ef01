"""AR alone, two vgen checkouts, the order alternating per round (a CPU drifting between runs then favours neither):
photos-gpt, 8 images at batch 1, eager, the best of two runs per process. Usage: python docs/scripts/ar_ab.py OLD NEW"""
import subprocess
import sys

ONE = """
import sys, time, json
sys.path.insert(0, {tree!r})
import vgen
pipe = vgen.load_pipeline("photos-gpt")
pipe.generate([0], sampler="ar", seed=99, compile=False)
ts = []
for _ in range(2):
    t = time.perf_counter()
    pipe.generate(list(range(8)), sampler="ar", seed=0, batch_size=1, compile=False)
    ts.append(time.perf_counter() - t)
print(json.dumps(min(ts)))
"""
res = {"new": [], "old": []}
for r in range(3):
    pair = (("new", sys.argv[2]), ("old", sys.argv[1]))
    for name, tree in pair if r % 2 == 0 else pair[::-1]:
        out = subprocess.run([sys.executable, "-c", ONE.format(tree=tree)], capture_output=True, text=True, cwd="/tmp")
        res[name].append(float(out.stdout.strip().splitlines()[-1]))
        print(r, name, res[name][-1], flush=True)
print({k: sum(v) / len(v) for k, v in res.items()})
