#!/usr/bin/env bash
# Installs the system packages the test-suite drives for real: Debian chromium (Playwright
# browser tests), PostgreSQL (catalog tests), and for tests/cluster `unshare` (util-linux),
# `ip` (iproute2) and `systemd-analyze` (systemd). Best effort: tests that need a missing part
# skip with a message that names it.
set -u
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup-test-system: installing ${need[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") >/tmp/kscope-apt.log 2>&1 \
      || echo "setup-test-system: apt-get failed (see /tmp/kscope-apt.log); dependent tests will skip"
  else
    echo "setup-test-system: cannot install ${need[*]} (not root or no apt-get); dependent tests will skip"
  fi
fi
exit 0
