#!/bin/sh
# Install what the ssh backend's test hosts need (idempotent, non-interactive):
# OpenSSH server and client, iproute2 (ip netns, bridges), util-linux (nsenter,
# unshare) and iptables. Does nothing when everything is already there.
set -eu
missing=""
[ -x /usr/sbin/sshd ] || missing="$missing openssh-server"
command -v ssh-keygen >/dev/null 2>&1 || missing="$missing openssh-client"
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
command -v nsenter >/dev/null 2>&1 || missing="$missing util-linux"
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -q
  # shellcheck disable=SC2086
  apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends $missing
fi
mkdir -p /run/sshd
