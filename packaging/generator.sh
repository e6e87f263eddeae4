# Sourced by build.sh and sanitized-build.sh.
#   generator_args BUILD_DIR  prints "-G Ninja" for a new build folder where
# ninja is installed (it keeps both cores busy across targets); an existing
# folder keeps the generator it was configured with.
generator_args() {
  [[ -f "$1/CMakeCache.txt" ]] || ! command -v ninja >/dev/null || echo "-G Ninja"
}
