#!/usr/bin/env bash
# Build and install pycuda (an sdist: it compiles against the CUDA toolkit's cuda.h and links libcuda)
# on a machine that has the toolkit's headers but perhaps no NVIDIA driver (CI, a CPU box).
#
#   bash scripts/build_pycuda.sh            # pip-installs pycuda into the current Python
#   TARGET=/tmp/site bash scripts/build_pycuda.sh   # ... into a directory instead (pip --target)
#
# The headers: $CUDA_ROOT (default: the directory above nvcc's bin/). The library it links: the driver's
# libcuda.so when the loader knows one, else the toolkit's lib64/stubs/libcuda.so, else the test suite's
# stub driver (tests/gpu/stub_libcuda.c, compiled here with cc). At run time pycuda loads whatever
# libcuda.so.1 the loader finds (the real driver on a GPU machine; the stub in the stub-driver tests).
# Measured: 668 s with this script (826 s by hand) on a loaded 2-core VM, 2026-12-03 (the bundled
# Boost.Python is most of it).
set -euo pipefail
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${CUDA_ROOT:-}" ]; then
  NVCC=$(command -v nvcc || true)
  for c in ${NVCC:+"$(dirname "$(dirname "$(readlink -f "$NVCC")")")"} /usr/local/cuda /usr/local/cuda-*; do
    [ -f "$c/include/cuda.h" ] && { CUDA_ROOT=$c; break; }
  done
fi
if [ -z "${CUDA_ROOT:-}" ] || [ ! -f "$CUDA_ROOT/include/cuda.h" ]; then
  echo "build_pycuda: no cuda.h (set CUDA_ROOT to the CUDA toolkit)" >&2
  exit 2
fi
WORK=$(mktemp -d /tmp/build_pycuda.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
LIBDIR=""
sys_lib=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
if [ -n "$sys_lib" ]; then
  LIBDIR=$(dirname "$sys_lib")
  [ -e "$LIBDIR/libcuda.so" ] || { mkdir -p "$WORK/lib"; ln -s "$sys_lib" "$WORK/lib/libcuda.so"; LIBDIR=$WORK/lib; }
elif [ -f "$CUDA_ROOT/lib64/stubs/libcuda.so" ]; then
  LIBDIR=$CUDA_ROOT/lib64/stubs
else
  LIBDIR=$("$PY" -c "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; from stubcuda import build
print(build(Path(sys.argv[2])))" "$ROOT/tests/gpu" "$WORK/stub")
fi
echo "build_pycuda: headers $CUDA_ROOT/include, linking libcuda from $LIBDIR"
"$PY" -m pip download -q --no-deps --no-binary pycuda pycuda -d "$WORK"
tar -xzf "$WORK"/pycuda-*.tar.gz -C "$WORK"
SRC=$(ls -d "$WORK"/pycuda-*/ | head -n 1)
cat >"$SRC/siteconf.py" <<EOF
CUDA_ROOT = "$CUDA_ROOT"
CUDA_ENABLE_CURAND = False
CUDADRV_LIB_DIR = ["$LIBDIR"]
CUDADRV_LIBNAME = ["cuda"]
CUDART_LIB_DIR = ["$CUDA_ROOT/lib64"]
EOF
# --no-as-needed: pycuda's extension must name libcuda.so.1 even when the library it links is a stub
# that defines few of its symbols (they are resolved when it loads the real one)
export LDFLAGS="${LDFLAGS:-} -Wl,--no-as-needed"
t0=$(date +%s)
if [ -n "${TARGET:-}" ]; then
  "$PY" -m pip install -q --no-deps --no-build-isolation --target "$TARGET" "$SRC"
  "$PY" -m pip install -q --target "$TARGET" pytools platformdirs mako
else
  "$PY" -m pip install -q --no-build-isolation "$SRC"
fi
echo "build_pycuda: built and installed in $(( $(date +%s) - t0 )) s"
