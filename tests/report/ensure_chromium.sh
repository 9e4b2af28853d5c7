#!/bin/sh
# Make Debian's `chromium` available for the headless report test: install it when missing and we are root.
# Exit 0 when chromium is on PATH afterwards, 1 otherwise (the test then skips with this script's message).
set -u
command -v chromium >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium is missing and we cannot install it (need root and apt-get); run: apt-get install -y chromium" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null 2>&1
