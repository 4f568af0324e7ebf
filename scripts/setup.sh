#!/usr/bin/env bash
# Installs what attn needs (Debian packages), builds it, installs the Python module `attn` for
# Debian's /usr/bin/python3, and runs either the demo or every test.
#   bash scripts/setup.sh demo   install, build (Release), install the module, run `attn demo`
#                                (its pictures in out/demo/)
#   bash scripts/setup.sh test   the same until the demo, then every test twice, Release and ASan + UBSan
#                                (each replaying the three fuzzers' seed corpora), and the threaded
#                                kernels' suites under ThreadSanitizer (clang + libomp)
set -euo pipefail
mode=${1:-demo}
case "$mode" in demo | test) ;; *) echo "usage: $0 demo|test" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."

# Every dependency, and why, is listed in docs/design.md ("Dependencies").
packages=(cmake ninja-build g++ libgtest-dev libgmock-dev libcli11-dev librandom123-dev libhwy-dev libpng-dev libfreetype-dev
          fonts-dejavu-core python3-numpy python3-torch python3-dev pybind11-dev python3-pytest python3-hypothesis clang libclang-rt-dev libomp-dev
          pkg-config python3-pip python3-setuptools python3-wheel python3-venv libopenmpi-dev openmpi-bin python3-mpi4py
          doxygen python3-statsmodels r-cran-kernsmooth libbenchmark-dev)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

jobs=$(nproc)
build() {  # build DIR [cmake options...]
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
}

build build/release -DCMAKE_BUILD_TYPE=Release
# `import attn` for /usr/bin/python3: the built package (python/attn and its compiled attn/_attn)
# copied into the site-packages directory of packages installed outside apt,
# /usr/local/lib/python3.11/dist-packages (python/CMakeLists.txt). A module of attn 0.1 (one file,
# attn.cpython-*.so) installed there earlier is removed: the package replaces it.
platlib=$(/usr/bin/python3 -c "import sysconfig; print(sysconfig.get_path('platlib'))")
$sudo rm -f "$platlib"/attn.cpython-*.so
$sudo cmake --install build/release --component python
# Idle OpenMP threads sleep instead of spinning: CTest runs tests side by side on few cores, and a
# shared machine's other work gets the cores the demo's threads wait on.
export OMP_WAIT_POLICY=passive
if [ "$mode" = demo ]; then
  exec build/release/attn demo --out-dir out/demo
fi

ctest --test-dir build/release --output-on-failure -j "$jobs"
# The example programs are not tests: the Release build has them.
build build/sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_SANITIZE=ON -DATTN_BUILD_EXAMPLES=OFF
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/sanitize --output-on-failure -j "$jobs"
# ThreadSanitizer needs clang++ and LLVM's libomp (CMakeLists.txt, ATTN_TSAN): only the suites of
# threaded code are built and run (tests/CMakeLists.txt, threaded_tests: the SIMD kernels' on the
# best SIMD target, as the threading is the same on every target; all at 1 and 2 threads).
cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DATTN_TSAN=ON \
  -DATTN_BUILD_PYTHON=OFF -DATTN_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build/tsan -j "$jobs" --target threaded_tests
ctest --test-dir build/tsan -L "unit|simd" --output-on-failure -j "$jobs"
