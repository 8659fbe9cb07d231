#!/bin/bash
# The testbed's experiments, each resumable: rerun this script after an interruption and every
# finished run is skipped. Logs: runs/<experiment>.log. One CPU thread per run (OMP_NUM_THREADS=1).
#   scripts/experiments/run_all.sh             # one after another (leaves a core for other work)
#   scripts/experiments/run_all.sh --parallel  # two chains at once, one per core:
#                                              #   SRCL main -> ablations -> removal  |  LTD -> loss zoo
set -e
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PY=${PYTHON:-.venv/bin/python}
mkdir -p runs
srcl_chain() {
    $PY scripts/experiments/srcl_testbed.py --out runs/srcl_testbed --grid main >> runs/srcl_testbed_main.log 2>&1
    $PY scripts/experiments/srcl_testbed.py --out runs/srcl_testbed --grid ablations >> runs/srcl_testbed_ablations.log 2>&1
    $PY scripts/experiments/srcl_testbed.py --out runs/srcl_testbed --grid removal >> runs/srcl_testbed_removal.log 2>&1
}
ltd_zoo_chain() {
    $PY scripts/experiments/ltd_testbed.py --out runs/ltd_testbed >> runs/ltd_testbed.log 2>&1
    $PY scripts/experiments/zoo_testbed.py --out runs/zoo_testbed >> runs/zoo_testbed.log 2>&1
}
if [ "${1:-}" = "--parallel" ]; then
    srcl_chain &
    a=$!
    ltd_zoo_chain &
    b=$!
    wait $a
    wait $b
else
    srcl_chain
    ltd_zoo_chain
fi
