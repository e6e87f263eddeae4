#!/usr/bin/env bash
# Installs every Debian package ShardScope needs to build, test and run, and
# fetches the Brown Corpus into the cache (fetch-corpus.sh).
# This is the one list: add a package here, never by hand on a machine.
# Safe to run repeatedly; it only calls apt when something is missing.
set -euo pipefail

packages=(
  # toolchain
  g++ cmake make ninja-build pkg-config dpkg-dev file procps
  # GUI: Qt 6 Widgets/Sql/Test/PrintSupport/Svg, SQLite driver, plots
  qt6-base-dev qt6-base-dev-tools libqt6sql6-sqlite libxkbcommon-dev qt6-svg-dev
  libqcustomplot-dev libqcustomplot2.1-qt6
  # engine: MPI, BLAS, JSON, command line
  openmpi-bin libopenmpi-dev libopenblas-dev nlohmann-json3-dev libcli11-dev
  # engine: bf16 GEMMs on CPU (AVX512-BF16 kernels; see engine/cpu/README.md)
  libdnnl-dev
  # engine: Unicode regexes and NFC for Hugging Face tokenizers (engine/text/)
  libicu-dev
  # fuzzing and sanitizers (packaging/fuzz.sh): clang with libFuzzer and its OpenMP
  clang libclang-rt-14-dev libomp-14-dev
  # headless display and screenshots for GUI tests and the demo
  xvfb xauth imagemagick fonts-dejavu-core
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup-deps: all ${#packages[@]} packages present"
  "$here/fetch-corpus.sh"
  exit 0
fi

echo "setup-deps: installing ${#missing[@]} missing packages: ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup-deps: not root and no sudo; install as root: apt-get install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup-deps: done"
"$here/fetch-corpus.sh"
