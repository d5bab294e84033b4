#!/usr/bin/env bash
# The plan job of the release preview (.github/workflows/release-preview.yml), in one script so that the tests run
# exactly these commands against their local Hub server (HF_ENDPOINT). Read-only and anonymous: no token reaches
# release. Writes the artifact into OUT: comment.md (the pull-request comment, the card diffs inline and collapsed),
# pr-number, and
# - with a committed release manifest (release.lock.json, written by 'release manifest' after a real build): its plan
#   against the live repos of the org in builds/release.yaml, without the weights (plan.md, plan.json, cards/);
# - without one: the cards this checkout renders from the committed card inputs (tests/data/cards/), diffed against
#   the cards the base commit (BASE_SHA) renders from its own inputs with its own code (cards.diff, cards/). No Hub
#   plan: those inputs are the tests' data, not a release's results, and must not be planned against the live repos.
# When the command fails, comment.md says so. OUT is replaced whole, so it must be new, empty, or this script's
# previous artifact (it holds pr-number).
set -euo pipefail
out=${1:?usage: preview.sh OUT (with PR_NUMBER set, and BASE_SHA for the card diff)}
lock=release.lock.json
inputs=tests/data/cards
marker='<!-- release-push-preview -->'
if [[ ! "${PR_NUMBER:-}" =~ ^[0-9]+$ ]]; then
  echo "error: PR_NUMBER must be the pull request's number (digits)" >&2
  exit 2
fi
if [[ ! "${BASE_SHA:-}" =~ ^([0-9a-f]{40}|[0-9a-f]{64})?$ ]]; then
  echo "error: BASE_SHA must be the base commit's full id (hex digits), or empty" >&2
  exit 2
fi
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN
export HF_HUB_DISABLE_IMPLICIT_TOKEN=1 HF_HUB_DISABLE_TELEMETRY=1
if [[ -L "$out" || ( -e "$out" && ! -f "$out/pr-number" && -n "$(ls -A "$out" 2> /dev/null || echo x)" ) ]]; then
  echo "error: $out: not a preview this script wrote (no pr-number in it), and it is replaced whole; give a new folder" >&2
  exit 2
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
art="$scratch/artifact"  # the release command writes here; the artifact replaces OUT once complete

if [[ -f "$lock" ]]; then
  what="release push --dry-run --from-manifest $lock"
  # the org is release.yaml's; --retag: a change to a published version shows as a tag move instead of failing
  command=(release push --dry-run --from-manifest "$lock" --retag --preview "$art")
else
  what="release card --dist $inputs"
  if [[ -d "$inputs" ]]; then cp -R "$inputs" "$scratch/head"; fi  # else 'release card' fails, and says why
  base=()
  note="No \`$lock\` is committed (\`release manifest\` writes it after a real build), so nothing is planned against"
  note+=" the Hub. The cards are rendered by this pull request's code, templates, catalogs and build files from the"
  note+=" card inputs committed in \`$inputs/\` (provenance, verification reports, tables, selection: the tests'"
  note+=" data, not a release's results)"
  if [[ -z "${BASE_SHA:-}" ]]; then
    note+="; no base commit was given (BASE_SHA), so there is nothing to compare them with."
  elif ! git cat-file -e "$BASE_SHA^{commit}" 2> /dev/null; then
    note+="; the base commit \`$BASE_SHA\` is not in the checkout (fetch-depth), so there is nothing to compare with."
  else
    mkdir "$scratch/tree"
    git archive "$BASE_SHA" | tar -x -C "$scratch/tree"
    if [[ ! -d "$scratch/tree/$inputs" ]]; then
      note+="; the base commit \`${BASE_SHA:0:12}\` has no \`$inputs/\` to compare with."
    elif cp -R "$scratch/tree/$inputs" "$scratch/base" \
        && (cd "$scratch/tree" && PYTHONPATH="$scratch/tree" release card --dist "$scratch/base") \
          > /dev/null 2> "$scratch/base-errors"; then
      base=(--base "$scratch/base")
      note+=", and compared with the cards the base commit \`${BASE_SHA:0:12}\` renders from its own inputs with its"
      note+=" own code."
    else
      note+="; the base commit \`${BASE_SHA:0:12}\` could not render its cards ($(grep -m 1 '^error: ' \
        "$scratch/base-errors" | cut -c 1-300 || true)), so there is nothing to compare with."
    fi
  fi
  command=(release card --dist "$scratch/head" --preview "$art" "${base[@]}" --note "$note")
fi
status=0
"${command[@]}" > /dev/null 2> "$scratch/errors" || status=$?
cat "$scratch/errors" >&2
if [[ "$status" -ne 0 ]]; then
  rm -rf "$art" && mkdir "$art"
  { printf '%s\n### Release preview failed\n\n`%s` exited with %s:\n\n```\n' "$marker" "$what" "$status"
    grep '^error: ' "$scratch/errors" | head -n 5 | cut -c 1-2000
    printf '```\n'; } > "$art/comment.md"
fi
printf '%s\n' "$PR_NUMBER" > "$art/pr-number"
rm -rf "$out" && mv "$art" "$out"
exit "$status"
