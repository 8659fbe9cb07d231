#!/bin/bash
# The testbed's experiments in sequence, each resumable: rerun this script after an interruption and
# every finished run is skipped. Logs: runs/<experiment>.log. One CPU thread per run (OMP_NUM_THREADS=1),
# so a second job can share a 2-core machine.
set -e
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PY=${PYTHON:-.venv/bin/python}
mkdir -p runs
$PY scripts/experiments/srcl_testbed.py --out runs/srcl_testbed --grid main >> runs/srcl_testbed_main.log 2>&1
$PY scripts/experiments/ltd_testbed.py --out runs/ltd_testbed >> runs/ltd_testbed.log 2>&1
$PY scripts/experiments/zoo_testbed.py --out runs/zoo_testbed >> runs/zoo_testbed.log 2>&1
$PY scripts/experiments/srcl_testbed.py --out runs/srcl_testbed --grid ablations >> runs/srcl_testbed_ablations.log 2>&1
$PY scripts/experiments/srcl_testbed.py --out runs/srcl_testbed --grid removal >> runs/srcl_testbed_removal.log 2>&1
