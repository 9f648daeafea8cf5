#!/usr/bin/env bash
# Install Debian's container registry (docker-registry: the CNCF distribution registry)
# if it is missing. Its own service is not started (the tests start their own, on
# 127.0.0.1 or in a test cluster's network namespace). Idempotent; run as root.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
if command -v docker-registry >/dev/null 2>&1; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -q
apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends docker-registry
command -v docker-registry >/dev/null
