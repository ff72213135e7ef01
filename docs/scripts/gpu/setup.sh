# Sourced by the GPU run scripts here (readiness.sh, profile_t2i.sh, gemm_fix.sh): the wheels the lent machines lack
# (hydra, omegaconf, ... from .whl/, see the device tool's README), the environment, the device in $OUT/gpu.txt, and
# part NAME SECONDS COMMAND...: runs COMMAND under its time limit unless SECONDS is 0, saying when it starts and ends.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:/tmp/site VGEN_CACHE=/tmp/vc PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; nproc; } 2>&1 | tee $OUT/gpu.txt

part() {
  local name=$1 limit=$2; shift 2
  echo "== $name: $(date +%T), limit ${limit}s"
  [ "$limit" -gt 0 ] || { echo "(skipped)"; return 0; }
  timeout "$limit" "$@"
  echo "== $name ended: rc $?"
}
