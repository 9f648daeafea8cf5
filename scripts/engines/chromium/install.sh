#!/bin/sh
# Install what the dashboard's browser test drives (idempotent, non-interactive):
# Debian's Chromium and its WebDriver (chromedriver, of the same version). Does nothing
# when both are already there.
set -eu
missing=""
[ -x /usr/bin/chromium ] || missing="$missing chromium"
[ -x /usr/bin/chromedriver ] || missing="$missing chromium-driver"
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -q
  # shellcheck disable=SC2086
  apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends $missing
fi
