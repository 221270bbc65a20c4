#!/usr/bin/env bash
# run.sh -- `make run`: the main job on embedded defaults.
#
# Starts `dpxe serve` on 127.0.0.1:8080 with its SQLite inventory in ./var,
# then boots one shard-kernel node in QEMU with its serial console on this
# terminal. Ctrl-C stops the node and the server; nothing else is touched.
# (The full lab -- a network namespace, netbooted QEMU nodes and the Gateway
# emulator -- arrives with issue 10; see the README.)
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-out}
LISTEN=${LISTEN:-127.0.0.1:8080}
NODE=${NODE:-demo-1}
FIRMWARE=${FIRMWARE:-bios}

mkdir -p var bin
go build -o bin/dpxe ./cmd/dpxe

serve_pid=""
cleanup() {
  if [ -n "$serve_pid" ] && kill -0 "$serve_pid" 2>/dev/null; then
    kill -TERM "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT INT TERM

bin/dpxe serve --db var/dpxe.db --listen "$LISTEN" >var/serve.log 2>&1 &
serve_pid=$!
for _ in $(seq 1 100); do
  if curl -fsS "http://$LISTEN/healthz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$serve_pid" 2>/dev/null; then
    echo "run: dpxe serve exited; its log:" >&2
    cat var/serve.log >&2
    exit 1
  fi
  sleep 0.1
done

cat <<MSG

  Discord-PXE is running.
    fleet manager:  http://$LISTEN/   (API under /v1/, see docs/api.md)
    admin token:    var/admin.token   (curl -H "Authorization: Bearer \$(cat var/admin.token)" http://$LISTEN/v1/nodes)
    server log:     var/serve.log
    inventory:      var/dpxe.db

  Booting node "$NODE" in QEMU ($FIRMWARE firmware); its serial console follows.
  Ctrl-C stops the node and the server.

MSG

# The guest reaches the host as 10.0.2.2 through QEMU's user network: the
# kernel brings up its e1000, takes a DHCP lease and prints a status line
# every 5 s. It does not check in yet (TCP arrives with the rest of issue 7).
args=(-machine q35 -m 256 -display none -vga none -no-reboot -serial stdio -monitor none
      -nic user,model=e1000 -kernel "$OUT/kernel.bin")
cfg="node=$NODE controller=http://10.0.2.2:${LISTEN##*:}"
if [ "$FIRMWARE" = uefi ]; then
  cp /usr/share/OVMF/OVMF_VARS_4M.fd var/OVMF_VARS.fd
  args+=(-drive if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd
         -drive if=pflash,format=raw,unit=1,file=var/OVMF_VARS.fd
         -fw_cfg "name=opt/org.discord-pxe/config,string=$cfg")
else
  args+=(-append "$cfg")
fi
qemu-system-x86_64 "${args[@]}" || true
