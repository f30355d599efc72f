#!/usr/bin/env bash
# The GPU path measured in one prepared run (issues 41 and 51): the CUDA-marked tests (the
# ensemble's equality with one-model runs included), the ensemble's per-member step time
# against S with its MFU and seeds per minute (bench/bench_ensemble.py), and `reproduce isoloss
# --scale quick` end to end without the ensemble path (today's runs: the global RNG's dropout,
# 2 local workers) and with it (--dropout-draws keyed --ensemble 64, in this process): wall time,
# runs finished and seeds per minute of each. GPU_CHECK_FULL=1 adds issue 41's training
# throughput and worker-count sections. Each section has its own timeout and the script goes on
# after a failing one; everything goes to $OUT (default ./gpu_out): summary.md and one log per
# section. GPU_CHECK_CPU_DRY=1: every section in its smoke form on the CPU (how this script is
# checked without a GPU; the two reproduce runs on algorithms --scale smoke, whose results must
# then be the same: the CPU's ensembles are the one-model runs bit for bit). A rerun on what time a
# device has left: GPU_CHECK_SKIP="tests ensemble" leaves those sections out, GPU_CHECK_SECONDS
# (default 480) is the whole script's time.
set -u
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
# src first; a PYTHONPATH already set (carried wheels, e.g. submitit in /tmp/site) stays after it
export PYTHONUNBUFFERED=1 PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
PY=${PYTHON:-python3}
DRY=${GPU_CHECK_CPU_DRY:-0}
FULL=${GPU_CHECK_FULL:-0}
SUM="$OUT/summary.md"
T0=$(date +%s)
: >"$SUM"
say() { echo "$*" | tee -a "$SUM"; }
section() {  # name, timeout seconds, command...
  local name=$1 limit=$2; shift 2
  case " ${GPU_CHECK_SKIP:-} " in *" $name "*) say ""; say "## $name: skipped (GPU_CHECK_SKIP)"; return;; esac
  say ""; say "## $name (limit ${limit}s, started at +$(( $(date +%s) - T0 ))s)"
  local s=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  say "exit $rc after $(( $(date +%s) - s ))s$([ $rc = 124 ] && echo ' (TIMED OUT)')"
  say '```'; tail -n 40 "$OUT/$name.log" | tee -a "$SUM"; say '```'
}
left() {  # seconds left of the script's $GPU_CHECK_SECONDS (8 minutes), less $1 kept for later sections (at least 30)
  local l=$(( ${GPU_CHECK_SECONDS:-480} - $1 - ($(date +%s) - T0) )); [ $l -lt 30 ] && l=30; echo $l
}
# wall time, runs finished (summary.json) against runs planned, seeds per minute of a study folder
finished() {  # folder, seconds, seeds, log
  local n=$(find "$1" -name summary.json 2>/dev/null | wc -l)
  say "$(basename "$1"): $n runs finished (summary.json) in $2 s; report: $([ -f "$1/report.md" ] && echo written || echo none)$( \
    [ -f "$1/report.md" ] && $PY -c "print(f'; {60 * $3 / max($2, 1):.2f} seeds/min')"); last progress: $( \
    grep -o '\[[0-9]*/[0-9]*\] [^;]*; study [0-9]*/[0-9]* units' "$4" 2>/dev/null | tail -1)"
}

say "# gpu_check $(date -u +%FT%TZ) dry=$DRY full=$FULL"
say '```'
{ nvidia-smi 2>&1 | head -20; $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())"; nproc; git log -1 --oneline 2>/dev/null; } 2>&1 | tee -a "$SUM"
say '```'

if [ "$DRY" = 1 ]; then
  section tests 180 env SAMELOSS_TEST_DEVICE=cpu $PY -m pytest -m cuda tests/cuda -q -p no:cacheprovider
  section ensemble 120 $PY bench/bench_ensemble.py --smoke --strategy vmap --dropout 0.1 --json "$OUT/ensemble.json"
  if [ "$FULL" = 1 ]; then
    section throughput 120 $PY bench/gpu_throughput.py --smoke --json "$OUT/throughput.json"
    section workers 180 $PY bench/gpu_workers.py --smoke --json "$OUT/workers.json"
  fi
  RECIPE=algorithms; SCALE=smoke; DEV=cpu; SEEDS=1; LIM_ONE=240; LIM_ENS=240; ONE_LAUNCH="--launcher inprocess"
  ENS_DRAWS=global  # the CPU's (loop) ensembles take the global RNG's dropout: the same runs, compared below
else
  section tests 100 $PY -m pytest -m cuda tests/cuda -q -rs -p no:cacheprovider
  # per-member step time against S (tiny transformer, batch 256, keyed dropout 0.1): MFU, seeds/min
  section ensemble 100 $PY bench/bench_ensemble.py --strategy vmap --dropout 0.1 --sizes 1,4,16,64 --rounds 3 \
    --json "$OUT/ensemble.json"
  if [ "$FULL" = 1 ]; then
    section throughput 100 $PY bench/gpu_throughput.py --seconds 4 --json "$OUT/throughput.json"
    section workers 115 env OMP_NUM_THREADS=2 $PY bench/gpu_workers.py --seconds 5 --startup 15 --json "$OUT/workers.json"
  fi
  # quick's seeds: the most any of its tests has (design.QUICK_PLAN); without ensembles one local worker
  # per seed (each its own process on the card, 3 of the 16 host cores each)
  SEEDS=$($PY -c "from sameloss.experiments.recipes.isoloss.design import QUICK_PLAN as p; print(max(n for _, n in p))")
  RECIPE=isoloss; SCALE=quick; DEV=cuda; ONE_LAUNCH="--launcher local --workers $SEEDS"; ENS_DRAWS=keyed
  export OMP_NUM_THREADS=3
  # the ensemble's run first (at least 130 s kept for the one-model run), the one-model run what is left
  LIM_ENS=$(left 130); LIM_ONE=0
fi
rm -rf /tmp/gpu_check_one /tmp/gpu_check_ens
s=$(date +%s)
section reproduce_ensemble "$LIM_ENS" $PY -m sameloss.cli reproduce $RECIPE --scale $SCALE --launcher inprocess \
  --ensemble 64 --dropout-draws $ENS_DRAWS --device $DEV --out /tmp/gpu_check_ens --no-progress
ENS_S=$(( $(date +%s) - s ))
N_ENS=$(grep -c "^ensemble of" "$OUT/reproduce_ensemble.log")
MAX_ENS=$(grep -o '^ensemble of [0-9]*' "$OUT/reproduce_ensemble.log" | awk '{print $3}' | sort -n | tail -1)
say "ensembles trained: $N_ENS (${MAX_ENS:-0} members at most)"
[ "$LIM_ONE" = 0 ] && LIM_ONE=$(left 15)
s=$(date +%s)
section reproduce_one "$LIM_ONE" $PY -m sameloss.cli reproduce $RECIPE --scale $SCALE $ONE_LAUNCH \
  --device $DEV --out /tmp/gpu_check_one --no-progress
ONE_S=$(( $(date +%s) - s ))
say ""; say "## reproduce $RECIPE --scale $SCALE: with and without ensembles"
finished "$(ls -d /tmp/gpu_check_ens/$RECIPE-$SCALE* 2>/dev/null | head -1)" $ENS_S $SEEDS "$OUT/reproduce_ensemble.log"
finished "$(ls -d /tmp/gpu_check_one/$RECIPE-$SCALE* 2>/dev/null | head -1)" $ONE_S $SEEDS "$OUT/reproduce_one.log"
# the study folders without their checkpoints (cost.json per finished seed: where its time went),
# checkpoints, in one file (the device tool brings back at most 8)
tar czf "$OUT/runs.tgz" --exclude=checkpoints --exclude='*.safetensors' --exclude='*.pt' \
  -C /tmp gpu_check_ens gpu_check_one 2>/dev/null
say "CPU seconds per stage, from each finished seed's cost.json (on the card: the host waiting on it too): $($PY -c "
import collections, glob, json
for w in ('ens', 'one'):
    t = collections.Counter()
    for f in glob.glob(f'/tmp/gpu_check_{w}/**/cost.json', recursive=True):
        for r in json.load(open(f))['rows']:  # tidy rows: point, fork, stage, cpu_seconds
            t[r['stage']] += float(r['cpu_seconds'])
    print(w, {k: round(v) for k, v in sorted(t.items())}, end='; ')
" 2>&1)"
if [ "$DRY" = 1 ]; then  # the CPU's ensembles are the one-model runs: the same results, bit for bit
  say "results the same: $($PY -c "
import sys; sys.path.insert(0, 'tests/experiments')
from test_smoke_digests import results_digest as d
a, b = (d(f'/tmp/gpu_check_{w}/$RECIPE-$SCALE/results.csv') for w in ('ens', 'one'))
print(a == b, a, b)" 2>&1)"
fi
ls /tmp/gpu_check_ens/* /tmp/gpu_check_one/* >"$OUT/reproduce_tree.txt" 2>&1
say ""; say "total $(( $(date +%s) - T0 ))s"
