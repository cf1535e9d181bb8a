#!/bin/sh
# Builds the CRI benchmark's sandbox image as an OCI image layout archive,
# with no registry: one layer holding a static `/pause` (pause.c), a config
# whose entrypoint is it, a manifest and an index naming the image. Import
# it with `ctr -n k8s.io images import ARCHIVE` and point the CRI plugin's
# sandbox_image at the name printed.
#
# Usage: mkimage.sh OUT.tar [NAME]   (NAME: docker.io/cnid-bench/pause:1)
set -eu
out=$1
name=${2:-docker.io/cnid-bench/pause:1}
here=$(cd "$(dirname "$0")" && pwd)
CC=${CC:-cc}
case $(uname -m) in
x86_64) arch=amd64 ;;
aarch64) arch=arm64 ;;
*) arch=$(uname -m) ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs" "$work/oci/blobs/sha256"
$CC -O2 -static -o "$work/rootfs/pause" "$here/pause.c"
strip "$work/rootfs/pause" 2>/dev/null || :
# A reproducible layer: fixed owner and mtime, no compression.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
	-C "$work/rootfs" -cf "$work/layer.tar" pause
blob() { # FILE -> moves it into blobs/, prints "DIGEST SIZE"
	d=$(sha256sum "$1" | cut -d' ' -f1)
	s=$(stat -c %s "$1")
	mv "$1" "$work/oci/blobs/sha256/$d"
	echo "$d $s"
}
set -- $(blob "$work/layer.tar")
layer=$1 layer_size=$2
printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"cnid/benches/cri/mkimage.sh"}]}' \
	"$arch" "$layer" >"$work/config.json"
set -- $(blob "$work/config.json")
config=$1 config_size=$2
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
	"$config" "$config_size" "$layer" "$layer_size" >"$work/manifest.json"
set -- $(blob "$work/manifest.json")
manifest=$1 manifest_size=$2
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
	"$manifest" "$manifest_size" "$arch" "$name" "${name##*:}" >"$work/oci/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci/oci-layout"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
	-C "$work/oci" -cf "$out" oci-layout index.json blobs
echo "$name"
