#!/usr/bin/env bash
# Commit subjects a reader can scan: every commit since the rule began (the commit below) says
# what changed in at most 72 characters; the why and the figures go in its body. .ci/run runs
# this; scripts/git-hooks/commit-msg checks a message as it is written
# (`git config core.hooksPath scripts/git-hooks`).
set -euo pipefail
cd "$(dirname "$0")/.."
since=06fd6e9
if ! git cat-file -e "$since^{commit}" 2>/dev/null; then
    echo "check-commits: $since is not in this clone's history; nothing to check" >&2
    exit 0
fi
long=$(git log --format='%h %s' "$since..HEAD" | awk '{ subject = substr($0, index($0, " ") + 1); if (length(subject) > 72) print }')
if [ -n "$long" ]; then
    echo "check-commits: commit subjects over 72 characters (say what changed; the why goes in the body):" >&2
    echo "$long" >&2
    exit 1
fi
echo "check-commits: $(git rev-list --count "$since..HEAD") commit subject(s) within 72 characters"
