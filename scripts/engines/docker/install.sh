#!/usr/bin/env bash
# Install the Docker engine (Debian's docker.io: dockerd, containerd, runc, docker-init)
# if dockerd is missing. Idempotent and non-interactive; run as root.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
if command -v dockerd >/dev/null 2>&1; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -q
apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends docker.io
command -v dockerd >/dev/null
