#!/usr/bin/env bash
# One GPU run (2026-11-28 session): where sjd's compiled pass at batch 1 spends its time (pass_profile.py on
# photos-gpt), then LlamaGen-T2I's GPT-XL shapes (random weights, bfloat16): pass cost eager and as CUDA graphs, AR
# compiled against the official eager loop at batch 1 (vgen.eval.shapes, the +experiment=gpu code). T_PROFILE /
# T_T2I: each part's time limit in seconds (0 skips it); CELLS: pass_profile.py's cells.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:/tmp/site VGEN_CACHE=/tmp/vc PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; nproc; } 2>&1 | tee $OUT/gpu.txt
part() {
  local name=$1 limit=$2; shift 2
  echo "== $name: $(date +%T), limit ${limit}s"
  [ "$limit" -gt 0 ] || { echo "(skipped)"; return 0; }
  timeout "$limit" "$@"
  echo "== $name ended: rc $?"
}
part "pass profile" "${T_PROFILE:-170}" env TORCH_LOGS=perf_hints DEVICE=cuda BATCH=${BATCH:-1} \
  python3 docs/scripts/gpu/pass_profile.py $OUT/pass_profile.json 2> $OUT/pass_profile.err
grep -i "skip\|error\|Traceback" $OUT/pass_profile.err | head -n 20
part "t2i shapes" "${T_T2I:-200}" python3 -c "
import json, os
from omegaconf import OmegaConf
from vgen.eval import shapes
cfg = OmegaConf.create(dict(device='cuda', shapes=['XL-t2i'], shape_dtypes=['bfloat16'], pass_widths=[1, 2, 4, 8, 16, 32],
                            repeats=1, shape_batches=[1], batch_sizes=[1], compile=True))
save = lambda r: json.dump(r, open(os.environ['OUT'] + '/t2i_shapes.json', 'w'), indent=1)
r = shapes.run(cfg, done=save); save(r); print(shapes.markdown(r))" 2>&1 | grep -v Warning | tail -n 20
echo "== end: $(date +%T)"
