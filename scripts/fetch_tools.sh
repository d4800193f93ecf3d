#!/usr/bin/env bash
# Fill .tools/ (ignored by git) with command-line tools the GPU machine lacks, for chapter 4.
#
#   bash scripts/fetch_tools.sh          # on this (Debian) machine, with its package registry
#
# strace: Debian's package and the one library it needs beyond glibc (libunwind8) are downloaded
# with `apt-get download` and unpacked with `dpkg -x` (no installation, no root needed on the
# target). A wrapper .tools/bin/strace points the dynamic loader at the unpacked libraries.
# Carry .tools to the GPU machine (the `run` tool's carry: [".tools"]); the chapter looks for
# strace on PATH first, then in .tools/bin/. The binary needs glibc >= 2.34 on the target.
set -euo pipefail
top=$(git rev-parse --show-toplevel)
dest="$top/.tools"
root="$dest/strace-root"
mkdir -p "$dest/bin" "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
apt-get update -qq
( cd "$tmp" && apt-get download -qq strace libunwind8 )
for deb in "$tmp"/*.deb; do
  dpkg -x "$deb" "$root"
done
cat > "$dest/bin/strace" <<WRAP
#!/bin/sh
# strace unpacked from Debian's package by scripts/fetch_tools.sh
here=\$(dirname "\$(readlink -f "\$0")")
LD_LIBRARY_PATH="\$here/../strace-root/usr/lib/x86_64-linux-gnu:\$here/../strace-root/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
  exec "\$here/../strace-root/usr/bin/strace" "\$@"
WRAP
chmod +x "$dest/bin/strace"
"$dest/bin/strace" -V | head -n 1
echo "strace in $dest/bin/strace (carry .tools to the GPU machine)"
