#!/bin/sh
# prerm of the dpxe package: stop the service before its binary goes. The
# state in /var/lib/dpxe is kept.
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl stop dpxe-serve.service >/dev/null 2>&1 || true
fi
exit 0
