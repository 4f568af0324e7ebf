#!/bin/sh
# package.consumer (tests/package.cmake): BUILD_DIR SOURCE_DIR WORK_DIR VERSION.
# Installs BUILD_DIR into WORK_DIR/prefix, builds examples/consumer against it twice (the CMake package,
# then pkg-config), runs both and compares the versions; runs its consumer of attn::io and attn::train
# (fit) both ways too; where attn::distributed was installed, runs its ring attention consumer on 2
# ranks. Fails on the first step that fails.
set -eu
build=$1 source=$2 work=$3 version=$4
rm -rf "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" --component development >/dev/null
cmake --install "$build" --prefix "$prefix" --component cli >/dev/null
for f in include/attn/attn.hpp include/attn/diagnostics.hpp include/attn/version.hpp lib/libattn.a lib/libattn_io.a \
         lib/libattn_train.a lib/cmake/attn/attnConfig.cmake lib/cmake/attn/attnConfigVersion.cmake \
         lib/cmake/attn/attnTargets.cmake lib/cmake/attn/attnIoTargets.cmake lib/cmake/attn/attnTrainTargets.cmake \
         lib/pkgconfig/attn.pc lib/pkgconfig/attn-io.pc lib/pkgconfig/attn-train.pc bin/attn; do
  [ -f "$prefix/$f" ] || { echo "package.consumer: $f was not installed under $prefix" >&2; exit 1; }
done

echo "-- find_package(attn 0.2 CONFIG REQUIRED)"
cmake -S "$source/examples/consumer" -B "$work/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake.log" || { cat "$work/cmake.log"; exit 1; }
cmake --build "$work/cmake" >>"$work/cmake.log" || { cat "$work/cmake.log"; exit 1; }
"$work/cmake/consumer" | tee "$work/cmake.out"
grep -q "attn headers $version, library $version;" "$work/cmake.out"
[ -x "$work/cmake/fit" ] || { echo "package.consumer: find_package(attn COMPONENTS io train) found no attn::io or attn::train" >&2; exit 1; }
(cd "$work" && "$work/cmake/fit" "$work/fit_cmake.npy")

if [ -x "$work/cmake/ring" ]; then  # attn::distributed was installed: ring attention on 2 ranks
  echo "-- attn::distributed"
  OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 \
    mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 2 "$work/cmake/ring"
fi

echo "-- pkg-config attn"
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs attn)
[ "$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --modversion attn)" = "$version" ]
# shellcheck disable=SC2086  # the flags are words
g++ -O2 "$source/examples/consumer/main.cpp" -o "$work/consumer_pc" $flags
"$work/consumer_pc"
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs attn-io attn-train)
# shellcheck disable=SC2086
g++ -O2 "$source/examples/consumer/fit.cpp" -o "$work/fit_pc" $flags
"$work/fit_pc" "$work/fit_pc.npy"

echo "-- attn --version"
[ "$("$prefix/bin/attn" --version)" = "attn $version" ]
echo "package.consumer: the installed package builds and runs both ways, version $version"
