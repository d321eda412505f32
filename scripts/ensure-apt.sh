#!/bin/sh
# Make sure Debian packages the tests use are installed: ensure-apt.sh PROGRAM:PACKAGE ...
# (e.g. espeak-ng:espeak-ng, the speak step's light TTS engine). Idempotent: installs only what is missing.
set -eu

missing=""
for pair in "$@"; do
    program=${pair%%:*}
    package=${pair#*:}
    command -v "$program" >/dev/null 2>&1 || missing="$missing $package"
done
[ -z "$missing" ] && exit 0

install_cmd="apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$missing"

if [ "$(id -u)" -eq 0 ]; then
    sh -c "$install_cmd"
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo sh -c "$install_cmd"
else
    echo "ensure-apt:$missing missing and this user cannot install packages." >&2
    echo "ensure-apt: as root run: apt-get update && apt-get install -y$missing" >&2
    exit 1
fi
