#!/usr/bin/env bash
# The plan job of the release preview (.github/workflows/release-preview.yml), in one script so that the tests run
# exactly these commands against their local Hub server (HF_ENDPOINT). Read-only and anonymous: no token reaches
# release. Plans the committed release manifest (release.lock.json, written by 'release manifest' after a real
# build) against the live sibling repos without the weights, and writes the artifact into OUT: comment.md (the
# pull-request comment), pr-number, plan.md, plan.json and cards/. Without a committed manifest, or when the plan
# fails, comment.md says so.
set -euo pipefail
out=${1:?usage: preview.sh OUT (with PR_NUMBER set)}
lock=release.lock.json
marker='<!-- release-push-preview -->'
if [[ ! "${PR_NUMBER:-}" =~ ^[0-9]+$ ]]; then
  echo "error: PR_NUMBER must be the pull request's number (digits)" >&2
  exit 2
fi
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN
export HF_HUB_DISABLE_IMPLICIT_TOKEN=1 HF_HUB_DISABLE_TELEMETRY=1

status=0
if [[ ! -f "$lock" ]]; then
  mkdir -p "$out"
  printf '%s\n### Release preview\n\nNo `%s` is committed, so there is nothing to plan: it is written by `release manifest` after a real build of the release, and committed with it (the tiny demo model is not a release).\n' \
    "$marker" "$lock" > "$out/comment.md"
else
  errors=$(mktemp)
  # --retag: a change to a published version shows as a tag move in the plan instead of failing it
  release push --dry-run --from-manifest "$lock" --org np-cr --retag --preview "$out" > /dev/null 2> "$errors" \
    || status=$?
  cat "$errors" >&2
  if [[ "$status" -ne 0 ]]; then
    mkdir -p "$out"
    { printf '%s\n### Release preview failed\n\n`release push --dry-run --from-manifest %s` exited with %s:\n\n```\n' \
        "$marker" "$lock" "$status"
      grep '^error: ' "$errors" | head -n 5 | cut -c 1-2000
      printf '```\n'; } > "$out/comment.md"
  fi
  rm -f "$errors"
fi
printf '%s\n' "$PR_NUMBER" > "$out/pr-number"
exit "$status"
