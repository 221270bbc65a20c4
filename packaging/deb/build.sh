#!/usr/bin/env bash
# build.sh OUTDIR builds the dpxe Debian package into OUTDIR with nfpm
# (run from the module proxy at a pinned version): the binary, the
# hardened dpxe-serve.service, /etc/dpxe/serve.json and the docs.
# `make deb` runs it; packaging/deb's test runs it into a temporary directory.
set -euo pipefail
NFPM=github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0
out=${1:?usage: build.sh OUTDIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
GO=${GO:-go}
# The version: 0.0.0 (no release tags yet), then the commit date and hash.
rev=$(git -C "$root" log -1 --format=%cd.%h --date=format:%Y%m%d%H%M%S 2>/dev/null || echo unknown)
export DPXE_VERSION="0.0.0~git${rev}"
export DPXE_ROOT="$root"
export DPXE_BIN="$out/dpxe"
(cd "$root" && CGO_ENABLED=1 $GO build -trimpath -o "$DPXE_BIN" ./cmd/dpxe)
# nfpm expands variables only in some fields: write the configuration
# with the paths and version in place.
sed -e "s|\${DPXE_VERSION}|$DPXE_VERSION|g" -e "s|\${DPXE_ROOT}|$root|g" -e "s|\${DPXE_BIN}|$DPXE_BIN|g" \
  "$root/packaging/deb/nfpm.yaml" > "$out/nfpm.yaml"
# nfpm is run outside the module so that it does not enter go.mod.
(cd "$out" && $GO run "$NFPM" package --config "$out/nfpm.yaml" --packager deb --target "$out/")
rm -f "$DPXE_BIN" "$out/nfpm.yaml"
ls "$out"/dpxe_*.deb
