#!/usr/bin/env bash
# Build the Kubernetes control plane + kubelet (Debian bookworm's kubernetes 1.20.2
# source) and the pod-infrastructure ("pause") binary, cached under
# ${FIBER_CACHE_DIR:-/var/cache/fiber}/k8s/<version>/bin. Idempotent: exits at once when
# the cache is complete. Non-interactive (CI runs it as root without stdin).
set -euo pipefail

VERSION="${FIBER_K8S_VERSION:-1.20.2}"
CACHE="${FIBER_CACHE_DIR:-/var/cache/fiber}/k8s"
OUT="$CACHE/$VERSION"
BINARIES=(kube-apiserver kubelet kube-scheduler kube-controller-manager)

export DEBIAN_FRONTEND=noninteractive
PACKAGES=(golang-go etcd-server containernetworking-plugins
          golang-github-modern-go-reflect2-dev gcc docker.io openssl iproute2 dpkg-dev rsync jq util-linux curl)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
    apt-get -o DPkg::Lock::Timeout=900 update -q
    apt-get -o DPkg::Lock::Timeout=900 install -y -q --no-install-recommends "${missing[@]}" </dev/null
fi

if [[ -f "$OUT/.complete" ]]; then
    echo "k8s $VERSION: cached in $OUT"
    exit 0
fi

# Source package: needs a deb-src entry for bookworm on the same Debian mirror.
SRC_LIST=/etc/apt/sources.list.d/fiber-k8s-src.sources
if ! apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Package: kubernetes'; then
    # the mirror the machine's own Debian sources use
    MIRROR=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | grep -v security \
             | awk '{print $2}' | head -n1 || true)
    [[ -n "$MIRROR" ]] || MIRROR=$(grep -hs '^deb ' /etc/apt/sources.list \
             | grep -v security | awk '$2 ~ /^http/ {print $2}' | head -n1 || true)
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
    cat >"$SRC_LIST" <<SRC
Types: deb-src
URIs: $MIRROR
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get -o DPkg::Lock::Timeout=900 update -q
fi

WORK="$CACHE/build-$VERSION"
mkdir -p "$WORK"
cd "$WORK"
TREE=$(find . -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
if [[ -z "$TREE" ]]; then
    rm -f ./*.dsc ./*.tar.* ./*.debian.tar.*
    apt-get source --download-only kubernetes </dev/null
    dsc=$(ls ./*.dsc | head -n1)
    grep -q "$VERSION" "$dsc" || { echo "source package $dsc is not $VERSION" >&2; exit 1; }
    dpkg-source --no-check -x "$dsc" kubernetes-src.tmp
    mv kubernetes-src.tmp "kubernetes-$VERSION"
    TREE="kubernetes-$VERSION"
fi
cd "$TREE"

# The vendored reflect2 crashes kube-apiserver under Go >= 1.18: use Debian's.
if [[ ! -f vendor/.fiber-reflect2-replaced ]]; then
    rm -rf vendor/github.com/modern-go/reflect2
    cp -a /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
    touch vendor/.fiber-reflect2-replaced
fi

# A failed earlier run can leave empty tool binaries behind.
[[ -d _output ]] && find _output -type f -empty -delete
start=$(date +%s)
make WHAT="cmd/kube-apiserver cmd/kubelet cmd/kube-scheduler cmd/kube-controller-manager" </dev/null
echo "k8s build took $(( $(date +%s) - start )) s"

mkdir -p "$OUT/bin"
for b in "${BINARIES[@]}"; do
    install -m 0755 "_output/bin/$b" "$OUT/bin/$b" 2>/dev/null \
        || install -m 0755 "$(find _output -type f -name "$b" | head -n1)" "$OUT/bin/$b"
done
gcc -Os -Wall -static -o "$OUT/bin/pause" build/pause/linux/pause.c
strip "$OUT/bin/pause" || true
touch "$OUT/.complete"
cd /
rm -rf "$WORK"
echo "k8s $VERSION: built into $OUT"
