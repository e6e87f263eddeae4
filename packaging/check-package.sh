#!/usr/bin/env bash
# Builds the .deb with CPack and checks that it installs the app, the engine,
# the resources where both look for them, the desktop entry and the icon.
set -euo pipefail
build="$1"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
(cd "$build" && cpack -G DEB -B "$out" >/dev/null)
deb="$(ls "$out"/*.deb)"
list="$(dpkg-deb -c "$deb" | awk '{print $6}')"
missing=0
for path in ./usr/bin/shardscope ./usr/bin/shardscope-engine ./usr/share/shardscope/models/small-llama.json \
            ./usr/share/shardscope/hardware/h100-sxm.json ./usr/share/applications/shardscope.desktop \
            ./usr/share/icons/hicolor/scalable/apps/shardscope.svg; do
  if ! grep -qx "$path" <<<"$list"; then echo "check-package: $path is not in $(basename "$deb")"; missing=1; fi
done
if grep -q "screenshots" <<<"$list"; then echo "check-package: screenshots should not be installed"; missing=1; fi
dpkg-deb -f "$deb" Depends | grep -q "libqt6" || { echo "check-package: Depends lacks the Qt libraries"; missing=1; }
# Unpacked anywhere, the engine finds its presets next to itself.
dpkg-deb -x "$deb" "$out/root"
presets="$(env -u SHARDSCOPE_RESOURCES "$out/root/usr/bin/shardscope-engine" presets | wc -l)"
[[ "$presets" -gt 0 ]] || { echo "check-package: the unpacked engine finds no presets"; missing=1; }
[[ $missing -eq 0 ]] && echo "check-package: $(basename "$deb") holds the app, the engine, resources, desktop entry and icon"
exit $missing
