#!/usr/bin/env bash
# Install Debian's Chromium for the browser test of the built book (tests/test_book.py), with a
# font that has Chinese glyphs (the glossary's terms) so screenshots show them.
# Called from .ci/run. Idempotent: a no-op when /usr/bin/chromium already exists.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  echo "install_browser.sh: chromium already installed ($(/usr/bin/chromium --version 2>/dev/null || echo '?'))"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_browser.sh: need root or sudo to apt-get install chromium" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core fonts-wqy-microhei >/dev/null
[ -x /usr/bin/chromium ] || { echo "install_browser.sh: apt-get finished but /usr/bin/chromium is missing" >&2; exit 1; }
echo "install_browser.sh: installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
