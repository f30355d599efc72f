#!/usr/bin/env bash
# The GPU path measured in one prepared run (issue 41): the CUDA-marked tests, training
# throughput (bench/gpu_throughput.py), the worker-count proxy (bench/gpu_workers.py) and one
# real `reproduce isoloss --scale quick` at the best worker count. Each section has its own
# timeout and the script goes on after a failing one; everything goes to $OUT (default
# ./gpu_out): summary.md and one log per section. GPU_CHECK_CPU_DRY=1: every section in its
# smoke form on the CPU (how this script is checked without a GPU).
set -u
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
# src first; a PYTHONPATH already set (carried wheels, e.g. submitit in /tmp/site) stays after it
export PYTHONUNBUFFERED=1 PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
PY=${PYTHON:-python3}
DRY=${GPU_CHECK_CPU_DRY:-0}
SUM="$OUT/summary.md"
T0=$(date +%s)
: >"$SUM"
say() { echo "$*" | tee -a "$SUM"; }
section() {  # name, timeout seconds, command...
  local name=$1 limit=$2; shift 2
  say ""; say "## $name (limit ${limit}s, started at +$(( $(date +%s) - T0 ))s)"
  local s=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  say "exit $rc after $(( $(date +%s) - s ))s$([ $rc = 124 ] && echo ' (TIMED OUT)')"
  say '```'; tail -n 40 "$OUT/$name.log" | tee -a "$SUM"; say '```'
}

say "# gpu_check $(date -u +%FT%TZ) dry=$DRY"
say '```'
{ nvidia-smi 2>&1 | head -20; $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())"; nproc; git log -1 --oneline 2>/dev/null; } 2>&1 | tee -a "$SUM"
say '```'

if [ "$DRY" = 1 ]; then
  section tests 120 env SAMELOSS_TEST_DEVICE=cpu $PY -m pytest -m cuda tests/cuda -q -p no:cacheprovider
  section throughput 120 $PY bench/gpu_throughput.py --smoke --json "$OUT/throughput.json"
  section workers 180 $PY bench/gpu_workers.py --smoke --json "$OUT/workers.json"
  SCALE=smoke; RLIMIT=240; DEV=cpu
else
  section tests 75 $PY -m pytest -m cuda tests/cuda -q -rs -p no:cacheprovider
  section throughput 100 $PY bench/gpu_throughput.py --seconds 4 --json "$OUT/throughput.json"
  # up to 8 processes on 16 cores: 2 threads each
  section workers 115 env OMP_NUM_THREADS=2 $PY bench/gpu_workers.py --seconds 5 --startup 15 --json "$OUT/workers.json"
  SCALE=quick; DEV=cuda
  # what is left of 6.5 minutes, less 15 s to pack up
  RLIMIT=$(( 390 - 15 - ($(date +%s) - T0) )); [ $RLIMIT -lt 30 ] && RLIMIT=30
fi
# the proxy's best k (2 when it gave none)
K=$($PY -c "import json; r=json.load(open('$OUT/workers.json'))['rows']; print(max(r, key=lambda x: x['seeds_per_min'])['k'])" 2>/dev/null || echo 2)
W=$K  # quick has two seeds: workers beyond its units at once wait idle
say ""; say "best k from the proxy: $K; reproduce runs with --workers $W"
rm -rf /tmp/gpu_check_isoloss
section reproduce "$RLIMIT" $PY -m sameloss.cli reproduce isoloss --scale "$SCALE" --launcher local --workers "$W" \
  --device "$DEV" --out /tmp/gpu_check_isoloss --no-progress
say "reproduce: $(find /tmp/gpu_check_isoloss -name summary.json 2>/dev/null | wc -l) runs finished (summary.json)"
ls /tmp/gpu_check_isoloss/* >"$OUT/reproduce_tree.txt" 2>&1
say ""; say "total $(( $(date +%s) - T0 ))s"
