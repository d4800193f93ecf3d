#!/usr/bin/env bash
# Install Debian's bubblewrap (and util-linux's setpriv) for the grader's sandbox
# (scripts/grade.py, tests/test_grade.py). Called from .ci/run. Idempotent: a no-op when both exist.
set -euo pipefail
if command -v bwrap >/dev/null && command -v setpriv >/dev/null; then
  echo "install_sandbox.sh: bubblewrap already installed ($(bwrap --version 2>/dev/null || echo '?'))"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_sandbox.sh: need root or sudo to apt-get install bubblewrap" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends bubblewrap util-linux >/dev/null
command -v bwrap >/dev/null || { echo "install_sandbox.sh: apt-get finished but bwrap is missing" >&2; exit 1; }
echo "install_sandbox.sh: installed $(bwrap --version 2>/dev/null || echo bubblewrap)"
