#!/usr/bin/env bash
# One GPU run (2026-11-27, the third H200 loan): where sjd's compiled pass at batch 1 spends its time (pass_profile.py on
# photos-gpt), then LlamaGen-T2I's GPT-XL shapes (random weights, bfloat16): pass cost eager and as CUDA graphs, AR
# compiled against the official eager loop at batch 1 (vgen.eval.shapes, the +experiment=gpu code). T_PROFILE /
# T_T2I: each part's time limit in seconds (0 skips it); CELLS: pass_profile.py's cells.
source docs/scripts/gpu/setup.sh
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
