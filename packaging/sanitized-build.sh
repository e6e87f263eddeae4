# Sourced by the sanitizer legs (sanitize.sh, fuzz.sh, tsan.sh): configures
# one instrumented build folder.
#   configure_sanitized BUILD_DIR "COMPILE FLAGS" "LINK FLAGS" [cmake args...]
# The build type's own "-O2 -g -DNDEBUG" are replaced by the leg's flags (they
# would double the compile time, and these builds keep library assertions
# such as nlohmann's JSON_ASSERT on); CUDA is off (no sanitizer covers
# device code).
# On failure it prints the configure log and exits.
source "$root/packaging/generator.sh"

configure_sanitized() {
  local build=$1 flags=$2 link=$3
  shift 3
  mkdir -p "$build"
  # shellcheck disable=SC2046
  cmake -S "$root" -B "$build" $(generator_args "$build") -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDSCOPE_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$link" \
    -DCMAKE_SHARED_LINKER_FLAGS="$link" "$@" > "$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
}

# The ASan + UBSan build, one for two legs: sanitize.sh runs every suite from
# it and fuzz.sh its libFuzzer targets (built in the same pass). It takes
# clang, which libFuzzer needs; everything is instrumented for libFuzzer's
# coverage (-fsanitize=fuzzer-no-link) but the kernels
# (packaging/coverage-ignore.txt), and the executables that are not fuzz
# targets resolve the coverage hooks to ASan's runtime, which ignores them.
# Two builds (g++ for the suites, clang for the fuzz targets) compiled the
# same libraries twice: 961 s and 394 s of CPU, against 901 s for this one.
# The suites' own files are built without the sanitizers; the libraries and
# the engine they run keep them, and the suites link ASan's runtime, whose
# allocator guards every heap block, theirs included. The engine links
# without PIE, which spares every rank ASan's relocations as it starts
# (engine/CMakeLists.txt). Nothing is timed here, so the benchmarks are
# left out, and so are the corpus replays, which fuzz.sh's runs include.
asan_build="${SHARDSCOPE_ASAN_BUILD_DIR:-$root/build-asan}"
configure_asan() {
  command -v clang++ >/dev/null || { echo "the ASan build needs clang++; packaging/setup-deps.sh installs it" >&2; exit 1; }
  export CC=clang CXX=clang++
  configure_sanitized "$asan_build" \
    "-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g1 -fsanitize-coverage-ignorelist=$root/packaging/coverage-ignore.txt -Wno-unused-command-line-argument" \
    "-fsanitize=address,undefined" -DSHARDSCOPE_FUZZ=ON -DSHARDSCOPE_FUZZ_REPLAY=OFF \
    -DSHARDSCOPE_TEST_COMPILE_OPTIONS=-fno-sanitize=address,undefined,fuzzer-no-link -DSHARDSCOPE_ENGINE_NO_PIE=ON \
    -DSHARDSCOPE_BUILD_BENCHES=OFF
}
