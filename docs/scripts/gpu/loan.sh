#!/usr/bin/env bash
# The one prepared run for a session lent a GPU (docs/benchmarks-gpu.md): about 9 minutes, each part under its own
# time limit, in order of what matters most, each writing into $OUT as it ends (a part cut at its limit loses only
# itself). Needs the wheels in .whl/ (docs/scripts/gpu/setup.sh) and, for the 64 MiB a run may carry, only the zoo
# folders photos-gpt and photos-t2i in the checkout.
#   1. the cuda-marked tests of test_cuda_graphs and test_host_syncs;
#   2. photos-gpt: AR and the speculative samplers compiled at fixed widths, window=auto as a small job decides it
#      (compiled: AR's loop; eager: the prior), eager AR and window=auto, batch 1 and 8, paired rounds;
#   3. Janus-Pro-1B's released shape (random weights, bfloat16): transformers' generate against vgen's ar, batch 1;
#   4. LlamaGen's GPT-XL (random weights, bfloat16): pass cost by width and AR compiled against the official loop at
#      batch 1;
#   5. the per-pass profile (kernel time against wall time) of AR and two speculative samplers, compiled, batch 1;
#   6. photos-t2i compiled at batch 1: AR, sjd and eagle at width 8.
# T_TESTS / T_ZOO / T_HF / T_XL / T_PROFILE / T_T2I: each part's limit in seconds (0 skips it).
source docs/scripts/gpu/setup.sh
echo "commit $(git rev-parse --short HEAD 2>/dev/null)" >> $OUT/gpu.txt

part "cuda tests" "${T_TESTS:-50}" python3 -m pytest -m cuda -p no:cacheprovider -q -n 8 --durations=5 \
  tests/test_cuda_graphs.py tests/test_host_syncs.py 2>&1 | tail -n 25 | tee $OUT/tests.log

ZOO='[ar,sjd,"sjd:window=8","scd:window=8","eagle:window=8","ar:compile=false","sjd:compile=false","scd:compile=false","eagle:compile=false"]'
part "photos-gpt" "${T_ZOO:-220}" python3 -m vgen bench device=cuda models=[photos-gpt] compile=true as_jobs=true \
  num_samples=4 repeats=3 batch_sizes=[1,8] baseline=false outdir=/tmp/zoo "samplers=$ZOO" 2>&1 | grep -v Warning \
  | tail -n 24 | tee $OUT/zoo.log
cp /tmp/zoo/bench.json $OUT/zoo.json 2>/dev/null

part "janus-pro-1b" "${T_HF:-90}" python3 -m vgen bench +experiment=transformers device=cuda hf_models=[janus-pro-1b] \
  hf_batch_sizes=[1] hf_zoo_models=[] batch_sizes=[1] num_samples=1 outdir=/tmp/hf 2>&1 | grep -v Warning | tail -n 12 | tee $OUT/hf.log
cp /tmp/hf/bench.json $OUT/hf.json 2>/dev/null

part "XL" "${T_XL:-80}" python3 -c "
import json, os
from omegaconf import OmegaConf
from vgen.eval import shapes
cfg = OmegaConf.create(dict(device='cuda', shapes=['XL'], shape_dtypes=['bfloat16'], pass_widths=[1, 2, 4, 8, 16],
                            repeats=1, shape_batches=[1], batch_sizes=[1], compile=True))
save = lambda r: json.dump(r, open(os.environ['OUT'] + '/xl.json', 'w'), indent=1)
r = shapes.run(cfg, done=save); save(r); print(shapes.markdown(r))" 2>&1 | grep -v Warning | tail -n 16

part "pass profile" "${T_PROFILE:-50}" env DEVICE=cuda BATCH=1 IMAGES=2 'CELLS=ar;sjd:window=8;eagle:window=8' \
  python3 docs/scripts/gpu/pass_profile.py $OUT/pass_profile.json 2>&1 | grep -v Warning | tail -n 12

part "photos-t2i" "${T_T2I:-60}" python3 -m vgen bench device=cuda models=[photos-t2i] compile=true num_samples=4 \
  repeats=2 batch_sizes=[1] baseline=false outdir=/tmp/t2i 'samplers=[ar,"sjd:window=8","eagle:window=8"]' 2>&1 \
  | grep -v Warning | tail -n 8 | tee $OUT/t2i.log
cp /tmp/t2i/bench.json $OUT/t2i.json 2>/dev/null
echo "== end: $(date +%T)"
