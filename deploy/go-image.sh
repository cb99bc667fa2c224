#!/usr/bin/env bash
# Makes a Go toolchain image FROM scratch out of the local Go installation
# (go env GOROOT), for building deploy/Dockerfile where no image can be
# pulled. Prints the image's name (brain-go:<go version>); makes it only
# once per Go version.
#
#   GO_IMAGE=$(deploy/go-image.sh) docker-compose build
set -euo pipefail
export PATH="/usr/local/go/bin:$PATH"
goroot="$(go env GOROOT)"
version="$(go env GOVERSION)"
image="brain-go:${version#go}"
if docker image inspect "$image" >/dev/null 2>&1; then
	echo "$image"
	exit 0
fi
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
echo "==> making $image from $goroot (no base image)" >&2
mkdir -p "$ctx/root/usr/local" "$ctx/root/tmp" "$ctx/root/etc/ssl/certs" "$ctx/root/go" "$ctx/root/root"
# The toolchain without its tests and docs.
b="$(basename "$goroot")"
tar -C "$goroot/.." --anchored --exclude="$b/test" --exclude="$b/doc" --exclude="$b/api" --exclude="$b/pkg/obj" \
	-cf - "$(basename "$goroot")" | tar -C "$ctx/root/usr/local" -xf -
[ "$(basename "$goroot")" = go ] || mv "$ctx/root/usr/local/$(basename "$goroot")" "$ctx/root/usr/local/go"
# HTTPS to the module proxy needs the CA bundle.
for ca in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
	[ -f "$ca" ] && { cp "$ca" "$ctx/root/etc/ssl/certs/ca-certificates.crt"; break; }
done
cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY root/ /
ENV PATH=/usr/local/go/bin:/go/bin GOPATH=/go HOME=/root TMPDIR=/tmp
DOCKERFILE
docker build -q -t "$image" "$ctx" >&2
echo "$image"
