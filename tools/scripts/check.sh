#!/usr/bin/env bash
# check.sh: the static checks `make test` runs first.
set -euo pipefail
cd "$(dirname "$0")/../.."
files=$(git ls-files '*.go' | grep -v '_templ.go$' || true)
bad=$(gofmt -l $files 2>/dev/null || true)
if [ -n "$bad" ]; then echo "gofmt would change: $bad" >&2; exit 1; fi
go vet ./...
if git ls-files '*.templ' | grep -q .; then
  go tool templ generate -path web/templates >/dev/null
  if ! git diff --quiet -- web/templates; then
    echo "templ generated files are stale: run 'go tool templ generate -path web/templates' and commit" >&2
    git diff --stat -- web/templates >&2
    exit 1
  fi
fi
