#!/usr/bin/env bash
# One GPU run (2026-11-27, the third H200 loan, after profile_t2i.sh found the GEMMs of a 4-token pass slow): the
# small-GEMM table (small_gemm.py), then pass_profile.py on photos-gpt at batch 1 three ways in separate processes:
# as shipped, with linears of <= 16 rows as W @ x^T on CUDA (WXT=16), and with TF32 float32 matmuls (TF32=1).
source docs/scripts/gpu/setup.sh
export DEVICE=cuda BATCH=1 IMAGES=4
export CELLS="${CELLS:-ar;sjd:window=4;scd:window=4;scd:window=8;zipar:window=4}"
part "small gemm" "${T_GEMM:-60}" python3 docs/scripts/gpu/small_gemm.py $OUT/small_gemm.json 2>&1 | grep -E "rows +(1|2|4|8|16|64):|==|Error"
part "profile as shipped" "${T_BASE:-100}" python3 docs/scripts/gpu/pass_profile.py $OUT/profile_base.json 2>/dev/null | cut -c1-150
part "profile WXT=16" "${T_WXT:-100}" env WXT=16 python3 docs/scripts/gpu/pass_profile.py $OUT/profile_wxt.json 2>/dev/null | cut -c1-150
part "profile TF32" "${T_TF32:-90}" env TF32=1 python3 docs/scripts/gpu/pass_profile.py $OUT/profile_tf32.json 2>/dev/null | cut -c1-150
echo "== end: $(date +%T)"
