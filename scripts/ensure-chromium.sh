#!/bin/sh
# Make sure Debian's chromium is installed, for the browser test of report.html (scripts/ensure-apt.sh does it;
# idempotent: nothing happens when chromium is already there).
exec sh "$(dirname "$0")/ensure-apt.sh" chromium:chromium
