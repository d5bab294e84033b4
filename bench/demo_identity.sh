#!/usr/bin/env bash
# Are the demo's outputs byte-identical between two commits? Each commit is exported (git archive, so no .git: the
# recorded tool commit is "unknown" in both) and its `make demo` is run with this checkout's .venv, the exported
# package first on the path, and the same SOURCE_DATE_EPOCH; then every file the demo wrote (fixture, build folders,
# tables, selection, cards, plots, the local push) and the demo's standard output (the push plan) are compared.
# Usage: bench/demo_identity.sh REV_A REV_B WORK   (one commit given twice checks the demo's determinism)
# A commit's run is kept in WORK and reused while WORK/<commit>/demo.stdout exists.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
a=$(git -C "$here" rev-parse "$1") b=$(git -C "$here" rev-parse "$2") work=$(realpath -m "$3")
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1767225600}
run() {
  local rev=$1 dir=$work/$1
  [ -s "$dir/demo.stdout" ] && return
  rm -rf "$dir" && mkdir -p "$dir"
  git -C "$here" archive "$rev" | tar -x -C "$dir"
  # -o venv: use the given venv as it is (no install into it); the cache is the export's own
  (cd "$dir" && PYTHONPATH=$dir RELEASE_CACHE=$dir/.cache/release \
     make -o venv demo VENV="$here/.venv" >"$dir/demo.stdout" 2>"$dir/demo.stderr") \
    || { echo "make demo failed at $rev: $dir/demo.stderr" >&2; exit 1; }
  grep -q "^$dir/release/__init__.py$" <(cd "$dir" && PYTHONPATH=$dir "$here/.venv/bin/python" -c \
    'import release; print(release.__file__)') || { echo "$rev: the export's package was not the one run" >&2; exit 1; }
}
run "$a"
run "$b"
status=0
# the push target's lock file holds the pushing process's id, nothing of the release
diff -r -x .release-push.lock "$work/$a/demo" "$work/$b/demo" >"$work/diff.txt" || status=1
# the standard output names each export's folder; the rest must be the same
diff <(sed "s|$work/$a|WORK|g" "$work/$a/demo.stdout") <(sed "s|$work/$b|WORK|g" "$work/$b/demo.stdout") \
  >>"$work/diff.txt" || status=1
files=$(find "$work/$a/demo" -type f ! -name .release-push.lock | wc -l)
if [ $status = 0 ]; then
  echo "identical: $files files and the demo's standard output ($a vs $b, $work)"
else
  echo "DIFFERENT ($a vs $b): $work/diff.txt" >&2
  head -40 "$work/diff.txt" >&2
fi
exit $status
