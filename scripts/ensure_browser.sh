#!/usr/bin/env bash
# The admin's browser tests (tests/e2e/test_console_browser.py) drive Debian's chromium through playwright;
# playwright never downloads a browser here. Install the package only when it is missing. Never fails the
# test command: without a browser those tests skip and say why.
set -u
CHROMIUM=/usr/bin/chromium
[ -x "$CHROMIUM" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's chromium for the browser tests"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends chromium >/dev/null \
    || echo "could not install chromium; the browser tests will skip" >&2
else
  echo "chromium is missing and this user cannot apt-get it; the browser tests will skip" >&2
fi
exit 0
