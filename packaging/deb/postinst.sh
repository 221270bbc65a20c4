#!/bin/sh
# postinst of the dpxe package: the system user dpxe-serve.service runs as.
# The service is not enabled or started: edit /etc/dpxe/serve.json first.
set -e
if [ "$1" != configure ]; then
	exit 0
fi
if [ -n "${DPKG_ROOT:-}" ]; then
	# An installation into another root (dpkg --root with
	# --force-script-chrootless): the host's user database is not it.
	echo "dpxe: not creating the dpxe user under DPKG_ROOT=$DPKG_ROOT" >&2
	exit 0
fi
if ! getent passwd dpxe >/dev/null; then
	if command -v systemd-sysusers >/dev/null 2>&1; then
		systemd-sysusers dpxe.conf
	else
		adduser --system --group --home /var/lib/dpxe --no-create-home --gecos "Discord-PXE controller" dpxe
	fi
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null || true
fi
exit 0
