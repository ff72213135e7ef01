#!/usr/bin/env bash
# One GPU run (docs/benchmarks-gpu.md): the cuda-marked tests, the golden cases on CUDA with a tree before a change
# (.old/vgen, e.g. `git archive <commit> vgen | tar -x -C .old`, its zoo a link to ../../vgen/zoo) and this tree,
# eager timings of photos-gpt's samplers with both trees, and vgen bench on CUDA. Python packages the GPU machine
# lacks (hydra-core, omegaconf, antlr4-python3-runtime, diffusers) come as wheels in .whl/. Writes into $OUT.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export VGEN_CACHE=/tmp/vc PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"; nproc; } > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
echo "== golden on cuda: old and new at once"
ONLY=photos-gpt,photos-video-gpt DEVICE=cuda PYTHONPATH=.old:/tmp/site timeout 150 python3 docs/scripts/golden_cases.py $OUT/golden_old.json 2> /tmp/golden_old.log &
ONLY=photos-gpt,photos-video-gpt DEVICE=cuda PYTHONPATH=.:/tmp/site timeout 150 python3 docs/scripts/golden_cases.py $OUT/golden_new.json 2> /tmp/golden_new.log
wait
tail -n 40 /tmp/golden_old.log /tmp/golden_new.log
python3 - <<'PY'
import json, os
o, n = (json.load(open(os.path.join(os.environ["OUT"], f"golden_{v}.json"))) for v in ("old", "new"))
same = [k for k in o if k in n and o[k] == n[k] and o[k][0] != "error"]
print(f"golden on cuda: {len(same)} of {len(o)} cases byte-identical old vs new")
for k in o:
    if o[k] != n.get(k):
        print("DIFF", k, o[k], n.get(k))
PY
echo "== cuda tests"
PYTHONPATH=.:/tmp/site timeout 90 python3 -m pytest -m cuda -p no:cacheprovider -q -n 0 --durations=5 tests/test_speculative.py tests/test_train.py 2>&1 | tail -n 25
echo "== paired speed old / new (eager)"
PYTHONPATH=.old:/tmp/site timeout 75 python3 docs/scripts/gpu/speed.py $OUT/speed_old.json
PYTHONPATH=.:/tmp/site timeout 75 python3 docs/scripts/gpu/speed.py $OUT/speed_new.json
echo "== vgen bench on cuda"
PYTHONPATH=.:/tmp/site timeout 120 python3 -m vgen bench device=cuda compile=false repeats=2 num_samples=4 batch_sizes=[1,4] 'samplers=[ar,"sjd:window=4","scd:window=8","eagle:window=8","eagle:window=8,accept=lantern","zipar:window=4"]' outdir=/tmp/bench 2>&1 | tail -n 30
cp /tmp/bench/bench.json $OUT/bench.json 2>/dev/null
cp /tmp/bench/bench.png $OUT/bench.png 2>/dev/null
ls $OUT
