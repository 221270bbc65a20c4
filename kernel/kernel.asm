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
; Calling convention for every kernel function (written down once, here):
;   arguments in RDI, RSI, RDX, RCX, R8, R9; result in RAX; carry flag set on
;   error; every other register preserved. EFI calls use the MS x64 ABI and
;   are made only from boot/efi_entry.inc.
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
%include "node/checkin.inc"		; the check-in loop and the lease
%include "shard/shard.inc"
%include "shard/route.inc"
%include "selftest/selftest.inc"
%include "selftest/net_selftest.inc"
%include "net/tcp_selftest.inc"
%include "lib/sha1.inc"		; SHA-1 (WebSocket accept key)
%include "lib/base64.inc"
%include "lib/ws.inc"			; RFC 6455 framing
%include "lib/inflate.inc"		; zlib / DEFLATE streaming inflate
%include "gateway/gateway.inc"	; per-shard Gateway sessions
%include "selftest/lib_selftest.inc"
%include "selftest/inflate_selftest.inc"	; lib/inflate.inc
%include "crypto/sym.inc"		; hashes, MACs, HKDF, AEADs
%include "crypto/asym.inc"		; X25519, P-256/P-384, ECDSA, RSA
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
