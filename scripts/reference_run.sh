#!/usr/bin/env bash
# The reference run on a GPU machine that has torch but not the Jupyter stack.
#
#   bash scripts/reference_run.sh [execute.py arguments ...]
#
# If .whl/ holds wheels (fetched beforehand on a machine with a registry, e.g. with
# `pip download nbclient ipykernel jupytext ipywidgets myst-nb docutils py-spy -d .whl`), they are
# installed into /tmp/site first. Then scripts/execute.py runs with the given arguments (default:
# every notebook in _toc.yml). With $OUT set, the executed notebooks and the files they wrote for
# the book are packed into $OUT/executed.tgz (after each notebook); the log is
# $OUT/reference_run.log (else .cache/reference_run.log). A second invocation in the same $OUT
# writes executed-2.tgz and reference_run-2.log, and so on.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cache
if compgen -G ".whl/*.whl" >/dev/null; then
  # a run split over several calls on one machine installs the same wheels once
  stamp=/tmp/site/.wheels-$(ls .whl | sha256sum | cut -c1-16)
  if [ ! -e "$stamp" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      2>&1 | grep -v -i warning
    [ "${PIPESTATUS[0]}" -eq 0 ] && touch "$stamp"
  fi
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
[ -d .tools/bin ] && export PATH=$PWD/.tools/bin:$PATH
# Preflight: what every page imports from the Jupyter stack, before any ceilings are measured (the
# first call of 5 December measured them, then all ten pages stopped at their first glue: myst_nb
# needs docutils, and .whl/ lacked it).
if ! python3 -c "import nbclient, jupytext, ipykernel, docutils; from myst_nb import glue"; then
  echo "reference_run.sh: the Jupyter stack does not import here (above); add the missing wheels" \
       "to .whl/ (pip download NAME --no-deps -d .whl) and call again" >&2
  exit 2
fi
# The commit the notebooks name: the device tool copies the working tree, but its .git can be
# the session's first checkout, so HEAD there is stale (run 439fc20 of 7 December stamped
# 752cc28, run 07ca410 stamped d4ef1cd). A tree whose tracked files differ from its HEAD names
# its commit with PERFLAB_GIT_COMMIT (e.g. `export PERFLAB_GIT_COMMIT=$(git rev-parse HEAD)`
# on the machine that sends the run, pasted into the command), or the run stops here.
if [ -z "${PERFLAB_GIT_COMMIT:-}" ] && git rev-parse --git-dir >/dev/null 2>&1 \
   && ! git diff --quiet HEAD -- book labs perflab scripts 2>/dev/null; then
  echo "reference_run.sh: the working tree differs from its HEAD ($(git rev-parse --short HEAD))," \
       "so HEAD is not the commit that runs: set PERFLAB_GIT_COMMIT to it and call again" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv 2>/dev/null
# The log survives a run stopped at a time limit: python writes unbuffered, grep passes each line
# on as it comes (--line-buffered; a block-buffered grep left an empty log when killed) and tee
# writes it at once. Without $OUT it stays in the clone (.cache/, git-ignored).
# Two invocations in one device call (the chapters, then some labs) write to the same $OUT: the
# second must not replace the first's archive and log (on 6 December it did, and five executed
# chapters were lost). So the Nth invocation writes executed-N.tgz and reference_run-N.log; unpack
# executed.tgz, then executed-2.tgz, ... in that order.
suffix=""
if [ -n "${OUT:-}" ]; then
  n=1
  while [ -e "$OUT/executed${suffix}.tgz" ] || [ -e "$OUT/reference_run${suffix}.log" ]; do
    n=$((n + 1)); suffix="-$n"
  done
fi
log="${OUT:-.cache}/reference_run${suffix}.log"
mkdir -p "$(dirname "$log")"
# With $OUT, execute.py packs everything the run wrote under book/, labs/ and perflab/data/
# into $OUT/executed.tgz after each notebook, so a run stopped at a time limit still returns
# the notebooks it finished.
pack=(); [ -n "${OUT:-}" ] && pack=(--pack "$OUT/executed${suffix}.tgz")
# One run in several calls: the device tool sends a fresh copy of the working tree with every
# call, so what an earlier call of the run wrote (chapter 9's notebook, which lab 9 reads; the
# run's ceilings file, which execute.py then reuses instead of measuring again) is gone from the
# tree. The machine keeps it, by run id ($PERFLAB_RUN_ID), outside the tree ($PERFLAB_RUN_COPIES,
# default /tmp/perflab-runs), and a later call of the same run puts it back first.
keep=""
if [ -n "${PERFLAB_RUN_ID:-}" ]; then
  keep="${PERFLAB_RUN_COPIES:-/tmp/perflab-runs}/$(printf %s "$PERFLAB_RUN_ID" | tr -c 'A-Za-z0-9._-' _)-tree"
  if [ -d "$keep" ]; then
    cp -a "$keep/." .
    echo "restored what earlier calls of run $PERFLAB_RUN_ID wrote ($(find "$keep" -type f | wc -l) files)"
  fi
fi
# Labs read the chapters' notebooks (lab 1 its reference table, lab 9 chapter 9's run): in one
# run they must be this run's. On 5 December the labs' call came to a fresh machine, which had
# not kept the earlier calls' notebooks, and the labs quoted the previous run's H200 beside the
# H100 they ran on. Unpack the chapters' executed.tgz into the tree before such a call.
# PERFLAB_LABS_ANY_CHAPTERS=1 runs them anyway (a chapter that failed keeps an older notebook).
if [ -n "${PERFLAB_RUN_ID:-}" ] && [ -z "${PERFLAB_LABS_ANY_CHAPTERS:-}" ] \
   && printf '%s\n' "$@" | grep -q '^labs/'; then
  if ! python3 - "$PERFLAB_RUN_ID" <<'PY'
import glob, json, sys
run = sys.argv[1]
other = []
for f in sorted(glob.glob("book/*.ipynb")):
    meta = json.load(open(f)).get("metadata", {}).get("reference_run") or {}
    if ((meta.get("ceilings") or {}).get("run")) != run:
        other.append(f)
if other:
    print(f"reference_run.sh: {len(other)} chapter notebook(s) in the tree are not from run "
          f"{run} (e.g. {other[0]}); the labs would quote another run. Run the chapters first "
          "on this machine, or unpack their executed.tgz into the tree.", file=sys.stderr)
    sys.exit(1)
PY
  then
    exit 2
  fi
fi
# A page that reads other pages' notebooks (front matter `perflab: reads: [...]`: the roofline
# explorer draws chapter 1's roofs) must run after them in the same run: either they are in
# this invocation's list before it, or the tree already holds this run's notebooks of them. On
# 6 December the explorer ran in the second call and chapter 1 in the fourth, and the explorer
# drew the previous run's chapter 1 (stale by order). PERFLAB_READS_ANY_RUN=1 runs it anyway.
readers=no
for a in "$@"; do grep -qs '^  reads:' "${a%.md}.md" && readers=yes; done
if [ -n "${PERFLAB_RUN_ID:-}" ] && [ -z "${PERFLAB_READS_ANY_RUN:-}" ] && [ $readers = yes ]; then
  if ! python3 - "$PERFLAB_RUN_ID" "$@" <<'PY'
import json, sys
from pathlib import Path
import yaml
run, pages, before = sys.argv[1], sys.argv[2:], set()
for arg in pages:
    src = Path(arg if arg.endswith(".md") else arg + ".md")
    text = src.read_text() if src.exists() else ""
    meta = yaml.safe_load(text.split("\n---", 1)[0][3:]) if text.startswith("---") else {}
    reads = ((meta or {}).get("perflab") or {}).get("reads") or []
    for name in reads:
        other = src.parent / f"{name}.ipynb"
        ref = (json.loads(other.read_text()).get("metadata", {}).get("reference_run") or {}
               if other.exists() else {})
        if (src.parent / name).as_posix() not in before and \
                (ref.get("ceilings") or {}).get("run") != run:
            print(f"reference_run.sh: {src} reads {other}, which is not from run {run} and "
                  "does not run before it in this call: run it first (in this call or an "
                  "earlier call of the run), then this page.", file=sys.stderr)
            sys.exit(1)
    before.add(src.with_suffix("").as_posix())
PY
  then
    exit 2
  fi
fi
# The run's tree goes to $keep after the ceilings and after each notebook (execute.py --keep),
# not at the end of this script: a call stopped at its time limit never reaches the end (on 6
# December that lost the first call's ceilings, and the next call measured them again).
[ -n "$keep" ] && pack+=(--keep "$keep")
python3 scripts/execute.py "${pack[@]}" "$@" 2>&1 | grep --line-buffered -v "running over TCP without encryption" | tee "$log"
rc=${PIPESTATUS[0]}
if [ -n "$keep" ] && [ -n "${OUT:-}" ]; then
  mkdir -p "$keep"
  for t in "$OUT"/executed*.tgz; do [ -e "$t" ] && tar xzf "$t" -C "$keep"; done
fi
exit $rc
