#!/usr/bin/env bash
# Builds the GPU checks here and packs them, with every library they load, for
# a GPU machine that has the NVIDIA driver and CUDA but none of this project's
# dependencies and no package registry (tests/gpu/README.md):
#   tests/gpu/bundle.sh            -> .gpu-bundle/shardscope-gpu.tar.xz
# Then carry .gpu-bundle with the working tree and run tests/gpu/run.sh there.
#
# What goes in: shardscope-engine and the suites tst_cuda_ops, tst_cuda_models,
# tst_strategies, tst_train (a Release build with nvcc for sm_80 and sm_90,
# the explorer left out); the shared libraries they and OpenMPI's plugins
# need (ldd), except the C and C++ runtimes, which the GPU machine has newer;
# OpenMPI's mpirun, orted, plugins and help texts, relocated with OPAL_PREFIX.
# cuBLAS, NCCL and the driver are the GPU machine's own (loaded at run time).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${SHARDSCOPE_GPU_BUILD_DIR:-$root/build-gpu}"
out="$root/.gpu-bundle"
jobs="${SHARDSCOPE_JOBS:-$(nproc)}"
suites=(tst_cuda_ops tst_cuda_models tst_strategies tst_train)

command -v /usr/local/cuda/bin/nvcc >/dev/null || { echo "bundle: nvcc not found in /usr/local/cuda" >&2; exit 1; }
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSHARDSCOPE_BUILD_GUI=OFF > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j "$jobs" --target shardscope-engine "${suites[@]}"
if "$build/engine/shardscope-engine" info | grep -q "built without CUDA"; then
  echo "bundle: this build has no cuda backend (see $build/configure.log)" >&2
  exit 1
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/usr/bin" "$stage/usr/share"
cp "$build/engine/shardscope-engine" "$stage/bin/"
for s in "${suites[@]}"; do cp "$build/tests/$s" "$stage/bin/"; done

# OpenMPI's launcher and what it loads at run time, at the paths OPAL_PREFIX relocates.
ompi_lib=/usr/lib/x86_64-linux-gnu/openmpi
mkdir -p "$stage/usr/lib/x86_64-linux-gnu"
cp -a "$ompi_lib" "$stage/usr/lib/x86_64-linux-gnu/"
rm -rf "$stage/usr/lib/x86_64-linux-gnu/openmpi/include"
cp /usr/bin/orterun /usr/bin/orted "$stage/usr/bin/"
ln -s orterun "$stage/usr/bin/mpirun"
cp -a /usr/share/openmpi "$stage/usr/share/"
[[ -d /usr/share/pmix ]] && cp -a /usr/share/pmix "$stage/usr/share/"

# The shared libraries everything above loads, but the system's core runtime.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.)'
objects=("$stage"/bin/* "$stage"/usr/bin/orterun "$stage"/usr/bin/orted)
while IFS= read -r -d '' so; do objects+=("$so"); done < <(find "$stage/usr/lib" -name '*.so*' -type f -print0)
for o in "${objects[@]}"; do
  ldd "$o" 2>/dev/null | awk '/=> \// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [[ -e "$stage/lib/$name" ]] || cp -L "$path" "$stage/lib/$name"
  done
done
# oneDNN, OpenBLAS, the ICU data and the kernels' fatbin (the same in each of
# the five programs) make most of the bundle: xz -9's 64 MiB window packs the
# five copies as one, which keeps the bundle and the tree under a lent
# machine's 64 MiB.
mkdir -p "$out"
tar -C "$stage" -cf - . | xz -9 -T2 > "$out/shardscope-gpu.tar.xz.tmp"
mv "$out/shardscope-gpu.tar.xz.tmp" "$out/shardscope-gpu.tar.xz"
echo "bundle: $out/shardscope-gpu.tar.xz ($(du -h "$out/shardscope-gpu.tar.xz" | cut -f1)); carry .gpu-bundle with the tree"
