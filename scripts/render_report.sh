#!/usr/bin/env bash
# Render a comparison report.html to a PNG screenshot in headless Chromium, to check by eye
# that the page and its inlined images load (no server, no network).
#   scripts/render_report.sh multirun/<date>/<time>/report.html [out.png]
# Needs Debian's chromium (apt-get install chromium); the flags keep it off the network.
set -euo pipefail
report=$(realpath "$1")
out=$(realpath -m "${2:-${report%.html}.png}")
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --hide-scrollbars --window-size=1400,2200 \
  --screenshot="$out" "file://$report" 2>/dev/null
echo "$out"
