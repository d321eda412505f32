#!/bin/sh
# Make sure Debian's chromium is installed, for the browser test of report.html.
# Idempotent: does nothing when /usr/bin/chromium is already there.
set -eu

if [ -x /usr/bin/chromium ]; then
    exit 0
fi

install_cmd='apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium'

if [ "$(id -u)" -eq 0 ]; then
    sh -c "$install_cmd"
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo sh -c "$install_cmd"
else
    echo "ensure-chromium: /usr/bin/chromium is missing and this user cannot install packages." >&2
    echo "ensure-chromium: as root run: apt-get update && apt-get install -y chromium" >&2
    exit 1
fi

if [ ! -x /usr/bin/chromium ]; then
    echo "ensure-chromium: apt-get finished but /usr/bin/chromium is still missing" >&2
    exit 1
fi
