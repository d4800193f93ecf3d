#!/usr/bin/env bash
# Install Debian's Chromium for the browser test of the built book (tests/test_book.py), with a
# font that has Chinese glyphs (the glossary's terms) so screenshots show them.
# The same font puts the front page's and the bibliography's Chinese titles into the PDF
# (scripts/book_pdf.py prints with this Chromium): without it they print as empty boxes.
# And poppler's pdftotext, with which tests/test_reader.py reads a printed page's tables back.
# Called from .ci/run. Idempotent: a no-op when /usr/bin/chromium, a Chinese font and pdftotext exist.
set -euo pipefail
if [ -x /usr/bin/chromium ] && fc-list :lang=zh 2>/dev/null | grep -q . && command -v pdftotext >/dev/null; then
  echo "install_browser.sh: chromium already installed ($(/usr/bin/chromium --version 2>/dev/null || echo '?')), with a Chinese font and pdftotext"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_browser.sh: need root or sudo to apt-get install chromium" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core fonts-wqy-microhei poppler-utils >/dev/null
[ -x /usr/bin/chromium ] || { echo "install_browser.sh: apt-get finished but /usr/bin/chromium is missing" >&2; exit 1; }
command -v pdftotext >/dev/null || { echo "install_browser.sh: apt-get finished but pdftotext is missing" >&2; exit 1; }
echo "install_browser.sh: installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
