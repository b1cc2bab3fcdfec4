#!/usr/bin/env bash
# Counts the exported API of the root package: types, functions, methods on
# exported types, constants and variables (each category and the total),
# then the exported fields of exported struct types, with
# internal/tools/apicount (go/ast; a cgo/no-cgo twin counts once as an
# identifier, twice as a declaration).
#   scripts/api-count.sh [-list] [dir]
# dir is another package folder, for example a worktree of an older commit
# (git worktree add /tmp/old <commit>; scripts/api-count.sh /tmp/old);
# -list prints every identifier.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
args=()
dir=$repo
for a in "$@"; do
	case $a in
	-*) args+=("$a") ;;
	*) dir=$(cd "$a" && pwd) ;;
	esac
done
cd "$repo"
go run ./internal/tools/apicount "${args[@]}" "$dir"
