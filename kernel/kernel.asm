; =============================================================================
; Discord-PXE shard kernel -- root file
;
; One flat binary (nasm -f bin) that is at once:
;   * a PE32+ EFI application (MZ/PE headers at offset 0, file offset == RVA,
;     a .reloc section with one no-op block, position-independent code), and
;   * a Multiboot v1 kernel (a.out-kludge header in the first 8 KiB, loaded
;     at 0x100000 so that address - 0x100000 == file offset == RVA).
; Both entry stubs fill one BOOTINFO record and jump to kmain, which is shared
; 64-bit position-independent code (DEFAULT REL).
;
; Calling conventions, as the code has them (docs/kernel.md "Conventions"
; says the same at more length). Every routine's header names its IN and
; OUT registers; what follows is the pattern those headers follow.
;   Everywhere: the result is in RAX (or EAX); CF set means an error or
;   "no" (CF clear: success, "yes", "equal"); every register a routine does
;   not return is preserved, flags aside. DF is always clear. Interrupts are
;   off except inside idle_wait (core/irq.inc). No heap: buffers belong to
;   the caller, who passes their address and size.
;   Formulas of the seeds (shard/): RDI = the SHARD (or SHARDRT), then RSI,
;   RDX, RCX, R8, R9 in order, e.g. RSI = now, RDX = cycles per ms: the
;   order of the seeds' and appliance/'s function signatures.
;   Bytes and strings (lib/str.inc, lib/, putsn, the network layers): the
;   roles of the x86 string instructions, RSI = source, RDI = destination,
;   RCX = count; a received packet is RSI + RCX, and each layer hands the
;   next only its own bytes.
;   JSON: the reader takes RSI = cursor, RDX = end of the document (RSI moves
;   past what it read); the writer takes RDI = its JW, the value in RSI (or
;   RSI + RCX, or AL).
;   Numbers to print: RDI (putdec, puthex64), EDI for an IPv4 address in
;   network order (putip), DIL for a byte (putc).
;   Addresses and ports: IPv4 addresses stay in network order in EDI (a
;   dword load of a packet field), ports in host order in ESI or EDX.
;   Time: "now" is a TSC value read once per main-loop pass (node/run.inc)
;   and passed in RDI to every *_tick. Below the ticks it travels where each
;   room needs it: RSI for http_poll and the shard formulas, RDX for ARP,
;   DNS and DHCP helpers, R8 for the DNS cache, R9 inside tcp_tick, R13 in
;   the Gateway. Deadlines are absolute TSC values (tsc_deadline_ms).
;   The Gateway (gateway/): RBX = the shard's SHARD, R12 = its GWS, R13 =
;   now, for every gw_* routine that works on one shard; gw_reset also takes
;   EAX = GWR_* mode and RSI = reason.
;   Reasons: a parser that refuses input returns CF and RAX = a NUL-terminated
;   reason naming the field or byte at fault (cmdline, ctl_parse_plan).
;   EFI calls use the MS x64 ABI and are made only from boot/efi_entry.inc.
; =============================================================================

%include "version.inc"
%include "core/defs.inc"
%include "core/macros.inc"

	BITS	64
	DEFAULT	REL
	ORG	IMAGE_BASE

section .text
image_start:
%include "boot/header.inc"		; MZ, PE32+, section table, Multiboot header (page 0)
%include "boot/reloc.inc"		; .reloc section (page 1)

	align	4096, db 0
text_start:
%include "boot/mb_entry.inc"		; 32-bit Multiboot entry -> long mode
%include "boot/efi_entry.inc"		; 64-bit EFI entry -> ExitBootServices
%include "core/kmain.inc"		; shared 64-bit code from here on
%include "core/serial.inc"
%include "core/print.inc"
%include "lib/str.inc"		; strings and memory
%include "lib/rand.inc"		; splitmix64 (self-tests, WebSocket keys, TCP ISN key)
%include "core/idt.inc"
%include "core/tsc.inc"
%include "core/paging.inc"
%include "core/irq.inc"
%include "core/pci.inc"
%include "core/acpi.inc"
%include "core/fwcfg.inc"
%include "core/cmdline.inc"
%include "core/power.inc"
%include "drivers/nic.inc"
%include "drivers/e1000.inc"
%include "drivers/virtio_net.inc"
%include "net/net.inc"
%include "net/http.inc"		; HTTP/1.1 client
%include "lib/json.inc"		; JSON reader and writer
%include "node/run.inc"		; the main loop: receive, then every tick
%include "node/checkin.inc"		; the check-in loop and the lease
%include "node/ctltls.inc"		; controller_pin= and the check-in's scheme rules
%include "node/ttime.inc"		; trusted time: the controller's clock over pinned https
%include "shard/shard.inc"
%include "shard/route.inc"
%include "selftest/selftest.inc"
%include "selftest/net_selftest.inc"
%include "selftest/dns_selftest.inc"	; host names: "dns" and "gwurl" digests
%include "net/tcp_selftest.inc"
%include "lib/sha1.inc"		; SHA-1 (WebSocket accept key)
%include "lib/base64.inc"
%include "lib/ws.inc"			; RFC 6455 framing
%include "lib/inflate.inc"		; zlib / DEFLATE streaming inflate
%include "lib/gwscan.inc"		; streaming Gateway message scanner
%include "lib/nats.inc"		; NATS protocol reader (server to client)
%include "crypto/sym.inc"		; hashes, MACs, HKDF, AEADs
%include "crypto/asym.inc"		; X25519, P-256/P-384, ECDSA, RSA
%include "tls/tls.inc"			; TLS 1.3 (before gateway/: GWS holds a TLS_CONN)
%include "gateway/gateway.inc"	; per-shard Gateway sessions
%include "node/natsnode.inc"		; event delivery: the node's NATS client
%include "node/natscmd.inc"		; ... and the Gateway commands workers send back
%include "selftest/lib_selftest.inc"
%include "selftest/inflate_selftest.inc"	; lib/inflate.inc
%include "selftest/gwscan_selftest.inc"	; lib/gwscan.inc
%include "selftest/nats_selftest.inc"	; lib/nats.inc
%include "selftest/crypto_selftest.inc"	; cryptotest=1
%include "core/data.inc"		; read-only tables and strings

	align	4096, db 0		; PE FileAlignment: the file ends on a page
file_end:

section .bss nobits align=4096
bss_start:
%include "core/bss.inc"
	alignb	4096
image_end:

; EOF
