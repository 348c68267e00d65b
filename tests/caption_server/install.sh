#!/usr/bin/env bash
# The caption tier's server (tests/caption_server, marker caption_server): llama-cpp-python's
# OpenAI-compatible server, 0.3.36, in a venv of its own (it brings its own fastapi, pydantic
# and numpy, none of which the project's venv should take). Built from source once (cmake and
# g++; ~5 min on 2 quiet cores, much longer on a busy machine) and kept as a wheel, with its
# dependencies, under $ROOT/wheels: later runs install from there without building or the
# network. The tests look for $ROOT/venv/bin/python (or $GGUF_TRAINER_CAPTION_SERVER_PYTHON).
#   bash tests/caption_server/install.sh
set -euo pipefail
ROOT="${GGUF_TRAINER_CAPTION_SERVER_HOME:-$HOME/.cache/gguf-trainer-caption-server}"
VENV="$ROOT/venv"
WHEELS="$ROOT/wheels"
SPEC="llama-cpp-python[server]==0.3.36"
ready() {
  "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as m
import llama_cpp.server.app  # noqa: F401 - the server and its dependencies import
assert m.version("llama-cpp-python") == "0.3.36"
PY
}
if ready; then
  echo "caption server: ready in $VENV"
  exit 0
fi
mkdir -p "$WHEELS"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip wheel
if ! ls "$WHEELS"/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
  echo "caption server: building $SPEC (minutes; the wheel is kept in $WHEELS)"
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "$VENV/bin/pip" wheel -q "$SPEC" -w "$WHEELS"
fi
"$VENV/bin/pip" install -q --find-links "$WHEELS" "$SPEC"
ready
echo "caption server: installed in $VENV"
