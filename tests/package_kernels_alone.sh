#!/bin/sh
# package.kernels_alone (tests/package.cmake): BUILD_DIR SOURCE_DIR WORK_DIR.
# attn::attn, the kernels, must build and run on a machine without libpng and FreeType (libpng-dev,
# libfreetype-dev). Without a container, they are hidden here instead:
#   - from CMake: examples/consumer is configured with CMAKE_DISABLE_FIND_PACKAGE_PNG and _Freetype,
#     so any find_package of them (by attnConfig.cmake, for attn::attn) finds nothing; a project that
#     asks for attn::io under the same settings must fail, which shows the hiding works;
#   - from pkg-config: PKG_CONFIG_LIBDIR holds only attn's .pc files and Highway's, so
#     `pkg-config attn` must resolve without libpng.pc and freetype2.pc (and attn-io must not);
#   - from the compiler and linker: no libpng or FreeType header is read compiling the consumer,
#     libattn.a leaves no png_ or FT_ symbol undefined, attn::attn's exported interface names
#     neither library, and the consumer programs do not load them.
# Fails on the first step that fails.
set -eu
build=$1 source=$2 work=$3
rm -rf "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" --component development >/dev/null
fail() { echo "package.kernels_alone: $*" >&2; exit 1; }

echo "-- attn::attn's interface"
targets=$prefix/lib/cmake/attn/attnTargets.cmake
[ -f "$targets" ] || fail "$targets was not installed"
if grep -Ein 'png|freetype|mpi' "$targets"; then fail "attnTargets.cmake (attn::attn) names the lines above"; fi
undefined=$(nm -u "$prefix/lib/libattn.a" | grep -E '^ *U (png_|FT_)' || true)
[ -z "$undefined" ] || fail "libattn.a needs libpng or FreeType symbols: $undefined"

echo "-- find_package(attn) with libpng and FreeType hidden"
hide="-DCMAKE_DISABLE_FIND_PACKAGE_PNG=ON -DCMAKE_DISABLE_FIND_PACKAGE_Freetype=ON"
# shellcheck disable=SC2086  # the flags are words
cmake -S "$source/examples/consumer" -B "$work/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" $hide >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "configure failed"; }
cmake --build "$work/cmake" >>"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "build failed"; }
if grep -Ei 'png|freetype' "$work/cmake/build.ninja" | grep -v '^#'; then
  fail "the consumer's build names libpng or FreeType (lines above)"
fi
"$work/cmake/consumer"

# The same settings must hide them: a project asking for attn::io is refused.
mkdir -p "$work/wants_io"
cat >"$work/wants_io/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(wants_io LANGUAGES CXX)
find_package(attn CONFIG REQUIRED COMPONENTS io)
CMAKE
# shellcheck disable=SC2086
if cmake -S "$work/wants_io" -B "$work/wants_io/build" -DCMAKE_PREFIX_PATH="$prefix" $hide >"$work/wants_io.log" 2>&1; then
  cat "$work/wants_io.log"; fail "find_package(attn COMPONENTS io) succeeded with libpng and FreeType hidden"
fi
grep -q "attn::io needs libpng and FreeType" "$work/wants_io.log" || { cat "$work/wants_io.log"; fail "no reason given"; }

echo "-- pkg-config attn with libpng and FreeType hidden"
# attn's own directory (its .pc files find their prefix from where they lie) and one holding Highway's alone.
hwydir=$work/pkgconfig-hwy
mkdir -p "$hwydir"
ln -s "$(pkg-config --variable=pcfiledir libhwy)/libhwy.pc" "$hwydir"
pclibdir=$prefix/lib/pkgconfig:$hwydir
flags=$(PKG_CONFIG_LIBDIR=$pclibdir pkg-config --cflags --libs attn) || fail "pkg-config attn needs more than Highway"
if PKG_CONFIG_LIBDIR=$pclibdir pkg-config --exists attn-io 2>/dev/null; then fail "pkg-config found libpng and FreeType"; fi
if g++ -std=c++20 -fopenmp -I"$prefix/include" -M "$source/examples/consumer/main.cpp" | grep -Ei 'png|freetype|ft2build'; then
  fail "compiling the consumer reads the headers above"
fi
# shellcheck disable=SC2086  # the flags are words
g++ -O2 "$source/examples/consumer/main.cpp" -o "$work/consumer_pc" $flags
"$work/consumer_pc"

for program in "$work/cmake/consumer" "$work/consumer_pc"; do
  if ldd "$program" | grep -Ei 'libpng|libfreetype'; then fail "$program loads the libraries above"; fi
done
rm -rf "$work"
echo "package.kernels_alone: attn::attn builds and runs with libpng and FreeType hidden, both ways"
