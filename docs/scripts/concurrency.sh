#!/usr/bin/env bash
# One `vgen sample num_samples=8` job alone against two started together, under an OpenMP wait setting, on an
# otherwise idle machine (docs/lab/benchmarks-log.md, "CPU threads"). Prints each job's sampling seconds
# (stats.json's sample_seconds: model load and imports excluded).
#
#   bash docs/scripts/concurrency.sh                                 # vgen's default (GOMP_SPINCOUNT=1000)
#   bash docs/scripts/concurrency.sh OMP_WAIT_POLICY=                # libgomp's own default (spin, then sleep)
#   bash docs/scripts/concurrency.sh OMP_WAIT_POLICY=PASSIVE         # never spin
#   EXTRA=threads=1 bash docs/scripts/concurrency.sh                 # one thread per job
set -euo pipefail
ENVS=("$@")
OUT=$(mktemp -d)
job() {
  env "${ENVS[@]}" X=1 vgen sample num_samples=8 ${EXTRA:-} outdir="$OUT/$1" progress=false > "$OUT/$1.log" 2>&1
  python -c "import json; print('$1', round(json.load(open('$OUT/$1/stats.json'))['sample_seconds'], 2))"
}
job alone
job pair-a & job pair-b & wait
rm -rf "$OUT"
