#!/usr/bin/env bash
# run.sh -- `make run`: the whole Discord-PXE system live on one machine.
#
# Builds bin/dpxe, bin/gateway-emulator and bin/dpxe-lab, then runs the lab
# (tools/lab, docs/lab.md): a network namespace with a bridge, the Gateway
# emulator and `dpxe serve` (authoritative DHCP, TFTP, HTTP boot, API,
# dashboard) inside it, the dashboard relayed to the host's 127.0.0.1:8080,
# and NODES QEMU machines that PXE-boot the shard kernel. Without root,
# /dev/net/tun or QEMU it says what is missing and runs simulated nodes
# over HTTP instead. Ctrl-C removes everything the lab created; a lab that
# crashed is cleaned up by the next run.
#
# Options (make variables or environment): NODES, SHARDS, MAX_CONCURRENCY,
# FIRMWARE=bios|uefi|mixed, LISTEN, GATEWAY_LISTEN, SIMULATE=1, MESSAGE_RATE
# (synthetic messages per second per shard, default 1) and PING_EVERY (every
# N-th one is "!ping", default 5): bin/pingbot answers
# the pings through the emulator's REST API and the table counts the replies.
# TLS=1 (the default): the emulator serves https:// and wss:// from a CA it
# generates (var/lab/gateway-ca.pem), QEMU nodes boot an image built to trust
# it and check in and claim over https:// pinned to dpxe serve's key
# (--tls-listen); TLS=0 runs the old plain http:// and ws:// lab.
# NATS_AUTH=1 (the default) runs dpxe serve --nats-auth: nodes publish with
# node credentials, pingbot reads with a worker's; NATS_AUTH=0 turns it off.
set -euo pipefail
cd "$(dirname "$0")/../.."

NODES=${NODES:-3}
SHARDS=${SHARDS:-16}
MAX_CONCURRENCY=${MAX_CONCURRENCY:-1}
FIRMWARE=${FIRMWARE:-mixed}
LISTEN=${LISTEN:-127.0.0.1:8080}
GATEWAY_LISTEN=${GATEWAY_LISTEN:-127.0.0.1:7878}
MESSAGE_RATE=${MESSAGE_RATE:-1}
PING_EVERY=${PING_EVERY:-5}
NATS_AUTH=${NATS_AUTH:-1}
TLS=${TLS:-1}

mkdir -p bin var
go build -o bin/dpxe ./cmd/dpxe
go build -o bin/gateway-emulator ./tools/cmd/gateway-emulator
go build -o bin/dpxe-lab ./tools/lab/cmd/dpxe-lab
go build -o bin/pingbot ./examples/pingbot

args=(-nodes "$NODES" -shards "$SHARDS" -max-concurrency "$MAX_CONCURRENCY" -firmware "$FIRMWARE"
      -listen "$LISTEN" -gateway-listen "$GATEWAY_LISTEN"
      -message-rate "$MESSAGE_RATE" -ping-every "$PING_EVERY" -pingbot bin/pingbot)
if [ "$NATS_AUTH" = 1 ]; then
  args+=(-nats-auth)
fi
case "$TLS" in
  1) ;;
  0) args+=(-plain) ;;
  *) echo "run.sh: TLS=$TLS: want 1 (wss:// and https://, the default) or 0 (plain)" >&2; exit 2 ;;
esac
if [ "${SIMULATE:-0}" = 1 ]; then
  args+=(-simulate)
fi
# exec: Ctrl-C reaches the lab itself, which tears down in order.
exec bin/dpxe-lab "${args[@]}"
