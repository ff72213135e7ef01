#!/usr/bin/env bash
# One GPU run for the GPU-readiness issue (docs/benchmarks-gpu.md): the cuda-marked tests, photos-gpt's samplers
# compiled, then vgen bench +experiment=gpu on the device (the released LlamaGen shapes with random weights: pass cost
# eager and as CUDA graphs, AR compiled as CUDA graphs against the official-style eager loop), then an inductor probe.
# Each part has its own time limit and writes into $OUT as it ends. The lent machines have PyTorch but not Hydra:
# the wheels come from .whl/ (README of the device tool). SHAPES / SHAPE_BATCHES / SHAPE_REPEATS / ZOO_BATCHES override
# the sizes, TESTS the test files; T_TESTS / T_ZOO / T_SHAPES / T_PROBE are each part's time limit in seconds (0 skips the part).
source docs/scripts/gpu/setup.sh

part "cuda tests" "${T_TESTS:-150}" python3 -m pytest -m cuda -p no:cacheprovider -q -n 8 --durations=8 \
  ${TESTS:-tests/test_cuda_graphs.py tests/test_host_syncs.py tests/test_speculative.py tests/test_train.py} 2>&1 \
  | tail -n 40 | tee $OUT/tests.log
part "zoo samplers compiled" "${T_ZOO:-170}" python3 -m vgen bench +experiment=gpu device=cuda shapes=[] compile=true \
  repeats=2 num_samples=8 "batch_sizes=${ZOO_BATCHES:-[1,8]}" \
  'samplers=[ar,"sjd:window=4","scd:window=8","eagle:window=8","zipar:window=4"]' outdir=/tmp/zoo 2>&1 \
  | tee $OUT/zoo.log | grep -v Warning | tail -n 25
cp /tmp/zoo/bench.json $OUT/zoo.json 2>/dev/null
part "shapes" "${T_SHAPES:-230}" python3 -m vgen bench +experiment=gpu device=cuda "shapes=${SHAPES:-[B,XL]}" \
  shape_dtypes=[bfloat16] "shape_batches=${SHAPE_BATCHES:-[1,8]}" samplers=[ar] batch_sizes=[1] num_samples=1 \
  repeats="${SHAPE_REPEATS:-2}" compile=true outdir=/tmp/shapes 2>&1 | tee $OUT/shapes.log | grep -v Warning | tail -n 30
cp /tmp/shapes/bench.json $OUT/shapes.json 2>/dev/null
part "inductor probe" "${T_PROBE:-60}" python3 docs/scripts/gpu/inductor_probe.py bfloat16 2>&1 | grep -E "OK|FAIL" \
  | tee $OUT/probe.log
echo "== end: $(date +%T)"
