#!/bin/bash
# The testbed's experiments, each resumable: rerun this script after an interruption and every
# finished run is skipped. Logs: runs/<experiment>.log. One CPU thread per run (OMP_NUM_THREADS=1).
#   scripts/experiments/run_all.sh             # one after another (leaves a core for other work)
#   scripts/experiments/run_all.sh --parallel  # two workers, one per core, each taking every other
#                                              # run of each experiment (--shard 0/2 and 1/2); a last
#                                              # pass without --shard writes the reports
set -e
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PY=${PYTHON:-.venv/bin/python}
mkdir -p runs
# name|script and options
EXPERIMENTS=(
    "srcl_testbed_main|srcl_testbed.py --out runs/srcl_testbed --grid main"
    "srcl_testbed_ablations|srcl_testbed.py --out runs/srcl_testbed --grid ablations"
    "srcl_testbed_removal|srcl_testbed.py --out runs/srcl_testbed --grid removal"
    "ltd_testbed|ltd_testbed.py --out runs/ltd_testbed"
    "zoo_testbed|zoo_testbed.py --out runs/zoo_testbed"
    "srcl_calibration|srcl_calibration.py --out runs/srcl_calibration"
    "srcl_calibration_sweep|srcl_calibration.py --out runs/srcl_calibration --grid sweep"
)
all() {  # all [extra options] [log suffix]
    for e in "${EXPERIMENTS[@]}"; do
        $PY scripts/experiments/${e#*|} $1 >> "runs/${e%%|*}$2.log" 2>&1
    done
}
if [ "${1:-}" = "--parallel" ]; then
    all "--shard 0/2" _shard0 &
    a=$!
    all "--shard 1/2" _shard1 &
    b=$!
    wait $a
    wait $b
fi
all
