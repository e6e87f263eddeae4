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
