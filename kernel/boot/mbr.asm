; =============================================================================
; Discord-PXE -- BIOS MBR loader (kernel/boot/mbr.asm)
;
; A Multiboot v1 boot loader for USB sticks and disks booted by a PC BIOS.
; It has two parts, assembled into one file (nasm -f bin -o mbr.bin mbr.asm):
;
;   bytes 0..439	stage 1, the boot code of the master boot record. The BIOS
;			loads it to 0000:7C00. It repairs a bogus boot drive
;			number, programs COM1, checks the INT 13h extensions
;			and reads stage 2.
;   bytes 512..		stage 2, STAGE2_SECTORS sectors that the image builder
;			writes at STAGE2_LBA, the last sectors of the "MBR gap"
;			before the first partition. Stage 1 loads them to 0000:7E00,
;			right behind itself, so one ORG serves both.
;
; Why two stages: a FAT-style BPB area that some BIOSes overwrite (90 bytes),
; the patch block (32 bytes) and the partition table leave 326 bytes for code,
; and a loader that collects the memory map, reads the config and the kernel,
; prints its progress and fails with a message does not fit in them.
;
; Stage 2 collects the E820 memory map, turns A20 on, reads kernel.bin (at
; most 512 KiB) from the MBR gap (kernel_lba, normally LBA 1) into a staging
; buffer at 0x10000, reads the node config file \DPXE.CFG of the FAT32
; partition by LBA, builds a Multiboot information record, enters flat 32-bit
; protected mode, copies the kernel to its load_addr and jumps to its entry.
;
; The image builder (Go, image/mbrloader) patches the fields of the patch block
; at PATCH_OFFSET from the validated Multiboot header of kernel.bin and from
; the FAT of the USB image, and reads STAGE2_LBA/STAGE2_SECTORS from it. Bytes
; 440..511 (disk signature, partition table, 0x55AA) belong to the partition
; tool: this file leaves them zero and the builder does not copy them.
;
; Hand-off (Multiboot v1 spec, section 3.2 "Machine state"):
;   EAX = 0x2BADB002, EBX = physical address of the Multiboot info record,
;   CS = flat 32-bit code, DS/ES/FS/GS/SS = flat 32-bit data, A20 on,
;   CR0.PE = 1, CR0.PG = 0, IF = 0, ESP undefined (the kernel sets its own).
;   The info record, memory map, command line and loader name lie below
;   0x8200; the kernel must copy what it keeps before reusing low memory.
; =============================================================================

BITS 16
ORG 0x7C00

; --- Constants -----------------------------------------------------------------

MB_LOADER_MAGIC		equ 0x2BADB002		; Multiboot v1 spec 3.2: EAX at entry
MBI_FLAG_MEM		equ 1 << 0		; Multiboot v1 spec 3.3: mem_lower/upper valid
MBI_FLAG_BOOTDEV	equ 1 << 1		; boot_device valid
MBI_FLAG_CMDLINE	equ 1 << 2		; cmdline valid
MBI_FLAG_MMAP		equ 1 << 6		; mmap_length/mmap_addr valid
MBI_FLAG_LOADER		equ 1 << 9		; boot_loader_name valid
MBI_FLAGS		equ MBI_FLAG_MEM | MBI_FLAG_BOOTDEV | MBI_FLAG_CMDLINE | MBI_FLAG_MMAP | MBI_FLAG_LOADER
MBI_NO_PARTITION	equ 0x00FFFFFF		; boot_device part1..3 = 0xFF: the whole disk

E820_SMAP		equ 0x534D4150		; 'SMAP', ACPI spec 15.1 (INT 15h E820h)
E820_FUNC		equ 0xE820		; query system address map
E820_ENTRY_LEN		equ e820_size		; base, length, type: the Multiboot record body
E820_TYPE_RAM		equ 1			; usable RAM
MMAP_RECORD_LEN		equ 24			; Multiboot mmap record: size field + 20 bytes
ONE_MIB			equ 0x100000		; mem_upper counts RAM from here

EDD_CHECK		equ 0x41		; INT 13h AH=41h: extensions present? (EDD 3.0)
EDD_READ		equ 0x42		; INT 13h AH=42h: extended read
EDD_CHECK_SIG		equ 0x55AA		; BX in for AH=41h
EDD_CHECK_REPLY		equ 0xAA55		; BX out when extensions are present
EDD_API_PACKET		equ 1 << 0		; CX bit 0: packet (AH=42h) access supported
DISK_RESET		equ 0x00		; INT 13h AH=00h: reset before a retry
DISK_TRIES		equ 3			; reads are retried: USB sticks can be slow to wake

A20_BIOS_ENABLE		equ 0x2401		; INT 15h AX=2401h: enable A20 gate
A20_FAST_PORT		equ 0x92		; System Control Port A ("fast A20")
A20_FAST_BIT		equ 1 << 1		; bit 1 = A20
A20_RESET_BIT		equ 1 << 0		; bit 0 = fast reset: never set it

A20_TEST_LOW		equ 0x0500		; scratch byte for the A20 check (config buffer, unused yet)
KBC_DATA		equ 0x60		; 8042 keyboard controller data port
KBC_STATUS		equ 0x64		; 8042 status register (read)
KBC_COMMAND		equ 0x64		; 8042 command register (write)
KBC_STATUS_INPUT_FULL	equ 1 << 1		; controller has not taken the last byte yet
KBC_WRITE_OUTPUT	equ 0xD1		; command: next data byte goes to the output port
KBC_OUTPUT_A20_ON	equ 0xDF		; output port: A20 on, no reset, keyboard enabled

COM1			equ 0x3F8		; first serial port (16550 UART)
UART_FCR		equ 2			; FIFO control register
UART_LCR		equ 3			; line control register
UART_LSR		equ 5			; line status register
UART_LSR_THRE		equ 1 << 5		; transmit holding register empty
UART_LCR_DLAB		equ 0x80		; divisor latch access
UART_LCR_8N1		equ 0x03		; 8 data bits, no parity, 1 stop bit
UART_FCR_ENABLE		equ 0x07		; enable and clear both FIFOs
UART_DIV_115200		equ 1			; 115200 baud = 1843200 / (16 * 1), as the kernel

VIDEO_TELETYPE		equ 0x0E		; INT 10h AH=0Eh: teletype output
VIDEO_PAGE_COLOUR	equ 0x0007		; BH = page 0, BL = grey (graphics modes)

CR0_PE			equ 1 << 0		; Intel SDM 2.5: protection enable

; Low-memory layout (free conventional memory above the BIOS data area).
CFG_SEG			equ 0x0050		; DPXE.CFG buffer 0050:0000 = 0x0500..0x14FF
CFG_BUF			equ CFG_SEG << 4
CFG_MAX			equ 4096		; appliance.MaxBootConfigLen
ZERO_START		equ CFG_BUF + CFG_MAX	; zeroed area; its first byte ends the config text
MBINFO			equ ZERO_START + 16	; Multiboot info record
MMAP			equ MBINFO + 0x80	; Multiboot memory map records
MMAP_MAX		equ 128			; records kept; more are dropped
MMAP_END		equ MMAP + MMAP_MAX * MMAP_RECORD_LEN
ZERO_WORDS		equ (MMAP_END - ZERO_START) / 2
STACK_TOP		equ 0x7C00		; stack grows down below stage 1
STAGE2_ADDR		equ 0x7E00		; stage 2 lands right behind stage 1
STAGE_SEG		equ 0x1000		; kernel staging buffer from 1000:0000 = 0x10000
STAGE_LIMIT		equ 0x90000		; staging ends here: below any EBDA
CHUNK_SECTORS		equ 64			; 32 KiB per read: never crosses a 64 KiB boundary
CHUNK_PARAS		equ CHUNK_SECTORS * 512 / 16
SECTOR_SIZE		equ 512
MAX_KERNEL_SECTORS	equ (STAGE_LIMIT - (STAGE_SEG << 4)) / SECTOR_SIZE	; 1024 = 512 KiB

BPB_END			equ 0x5A		; a FAT32 BPB ends here (jmp + OEM + EBPB)
PATCH_OFFSET		equ 0x198		; patch block; image/mbrloader mirrors it
BOOT_CODE_END		equ 0x1B8		; the disk signature starts here (MBR layout)
PATCH_MAGIC		equ 'DPXB'		; marks a Discord-PXE MBR loader
STAGE2_MAGIC		equ 'DPX2'		; first dword of stage 2: proves it was read
STAGE2_SECTORS		equ 2			; stage 2 size; the builder reads it from the patch block
STAGE2_LBA		equ 2048 - STAGE2_SECTORS	; the end of the 1 MiB gap

; --- Structures ----------------------------------------------------------------

struc mbinfo				; Multiboot v1 spec 3.3 "Boot information format"
	.flags:			resd 1
	.mem_lower:		resd 1		; KiB below 1 MiB
	.mem_upper:		resd 1		; KiB from 1 MiB to the first hole
	.boot_device:		resd 1		; drive in bits 31..24, partitions 0xFF
	.cmdline:		resd 1
	.mods_count:		resd 1
	.mods_addr:		resd 1
	.syms:			resd 4
	.mmap_length:		resd 1
	.mmap_addr:		resd 1
	.drives_length:		resd 1
	.drives_addr:		resd 1
	.config_table:		resd 1
	.boot_loader_name:	resd 1
	.apm_table:		resd 1
endstruc

struc e820				; ACPI 6.5 §15.1 address range descriptor (20-byte form)
	.base:			resq 1
	.length:		resq 1
	.type:			resd 1
endstruc

struc dap				; EDD 3.0 disk address packet (built on the stack)
	.size:			resb 1		; 16
	.reserved:		resb 1
	.count:			resw 1		; sectors to transfer
	.offset:		resw 1		; buffer offset
	.segment:		resw 1		; buffer segment
	.lba:			resq 1		; first sector
endstruc

; =============================================================================
; Stage 1 (MBR boot code, bytes 0..439)
; =============================================================================

start:
	jmp short stage1			; EB xx 90: what a BIOS expects in front of a BPB
	nop
	times BPB_END - ($ - $$) db 0		; some BIOSes rewrite "BPB" fields here: no code or data

; -----------------------------------------------------------------------------
; stage1 -- normalise the CPU state, check the drive, load and run stage 2
;  IN:	DL = BIOS boot drive (may be bogus)
; OUT:	does not return
; -----------------------------------------------------------------------------
stage1:
	cli
	xor ax, ax
	mov ds, ax
	mov es, ax
	mov ss, ax
	mov sp, STACK_TOP
	jmp 0:.flat				; some BIOSes enter at 07C0:0000: normalise CS
.flat:
	sti
	cld
	test dl, 0x80				; hard disks are 0x80..0x8F (Limine's check)
	jz .bad_drive
	test dl, 0x70
	jz .drive_ok
.bad_drive:
	mov dl, 0x80				; bogus DL (seen on USB boots): the first hard disk
.drive_ok:
	mov [drive], dl

	call serial_init			; first, so every message reaches COM1 readably
	mov si, msg_loading			; "dpxe-mbr: loading"
	call say

	mov ah, EDD_CHECK			; LBA reads need the INT 13h extensions
	mov bx, EDD_CHECK_SIG			; (DL = drive: serial_init and say keep it)
	int 0x13
	jc .no_edd
	cmp bx, EDD_CHECK_REPLY
	jne .no_edd
	test cl, EDD_API_PACKET
	jnz .edd_ok
.no_edd:
	mov si, msg_no_edd
	jmp fatal
.edd_ok:

	mov eax, [patch.stage2_lba]
	mov cx, [patch.stage2_sectors]
	mov bx, STAGE2_ADDR >> 4
	call disk_read
	cmp dword [stage2], STAGE2_MAGIC	; a copy of sector 0 alone has no stage 2
	jne .no_stage2
	jmp stage2_main
.no_stage2:
	mov si, msg_no_stage2
	; fall through to fatal

; -----------------------------------------------------------------------------
; fatal -- say a message and halt for good (no reboot loop)
;  IN:	SI = NUL-terminated message (without the "dpxe-mbr: " prefix)
; OUT:	does not return
; -----------------------------------------------------------------------------
fatal:
	call say
.halt:
	cli
	hlt
	jmp .halt				; an NMI may wake us: halt again

; -----------------------------------------------------------------------------
; disk_read -- read sectors from the boot drive with INT 13h AH=42h, retrying
;  IN:	EAX = first LBA, CX = sector count (1..127), BX = buffer segment (offset 0)
; OUT:	on a read error after DISK_TRIES attempts: message and halt
;	preserves all general registers
; -----------------------------------------------------------------------------
disk_read:
	pushad
	mov bp, DISK_TRIES
.try:
	push dword 0				; dap.lba high dword: LBA < 2^32
	push eax				; dap.lba low dword
	push bx					; dap.segment
	push word 0				; dap.offset
	push cx					; dap.count
	push word 16				; dap.size, dap.reserved
	mov si, sp
	mov dl, [drive]
	mov ah, EDD_READ
	int 0x13
	lea sp, [si + dap_size]			; drop the packet, keep CF
	jnc .done
	xor ah, ah				; AH=00h: reset the drive, then retry
	int 0x13
	dec bp
	jnz .try
	mov si, msg_read_err
	jmp fatal
.done:
	popad
	ret

; -----------------------------------------------------------------------------
; say -- print "dpxe-mbr: " and a message
;  IN:	SI = NUL-terminated message
; OUT:	SI past the NUL; preserves other registers
; -----------------------------------------------------------------------------
say:
	push si
	mov si, msg_prefix
	call print
	pop si
	; fall through to print

; -----------------------------------------------------------------------------
; print -- write a string on the screen (INT 10h) and on COM1
;  IN:	SI = NUL-terminated string
; OUT:	SI past the NUL; preserves other registers
; -----------------------------------------------------------------------------
print:
	pusha
.next:
	lodsb
	test al, al
	jz .done
	mov dx, COM1 + UART_LSR
	mov ah, al
.wait:
	in al, dx				; an absent UART reads 0xFF: no hang
	test al, UART_LSR_THRE
	jz .wait
	mov al, ah
	mov dl, COM1 & 0xFF
	out dx, al
	mov ah, VIDEO_TELETYPE
	mov bx, VIDEO_PAGE_COLOUR
	int 0x10
	jmp .next
.done:
	mov bp, sp
	mov [bp + 2], si			; the pusha image of SI
	popa
	ret

; -----------------------------------------------------------------------------
; serial_init -- COM1 at 115200 8N1 with FIFOs, as the kernel programs it
;  IN:	nothing
; OUT:	AL clobbered; preserves DX
; -----------------------------------------------------------------------------
serial_init:
	push dx
	mov dx, COM1 + UART_LCR
	mov al, UART_LCR_DLAB
	out dx, al
	mov dl, COM1 & 0xFF			; divisor latch, low byte
	mov al, UART_DIV_115200
	out dx, al
	inc dx					; divisor latch, high byte
	xor al, al
	out dx, al
	mov dl, (COM1 + UART_LCR) & 0xFF
	mov al, UART_LCR_8N1
	out dx, al
	mov dl, (COM1 + UART_FCR) & 0xFF
	mov al, UART_FCR_ENABLE
	out dx, al
	pop dx
	ret

msg_prefix:	db "dpxe-mbr: ", 0
msg_loading:	db "loading", 13, 10, 0
msg_no_edd:	db "BIOS lacks INT 13h extensions", 13, 10, 0
msg_read_err:	db "disk read error", 13, 10, 0
msg_no_stage2:	db "stage 2 missing", 13, 10, 0
drive:		db 0x80				; boot drive, set at run time

	times PATCH_OFFSET - ($ - $$) db 0	; fails to assemble when stage 1 is too big

; --- Patch block (little endian; image/mbrloader mirrors these offsets) --------
patch:
.magic:		dd PATCH_MAGIC			; 0x198 marks our loader
.stage2_lba:	dd STAGE2_LBA			; 0x19C where the builder writes stage 2 (read-only)
.stage2_sectors: dw STAGE2_SECTORS		; 0x1A0 its length in sectors (read-only)
.kernel_sectors: dw 0				; 0x1A2 sectors to load: ceil(load size / 512)
.kernel_lba:	dd 1				; 0x1A4 first sector of kernel.bin (the MBR gap)
.config_lba:	dd 0				; 0x1A8 first sector of \DPXE.CFG
.config_sectors: dw 0				; 0x1AC sectors of \DPXE.CFG (8)
.reserved:	dw 0				; 0x1AE zero
.load_addr:	dd 0				; 0x1B0 Multiboot load_addr (>= 1 MiB)
.entry_addr:	dd 0				; 0x1B4 Multiboot entry_addr

%if ($ - $$) != BOOT_CODE_END
%error "patch block must end at byte 440"
%endif
	times 512 - ($ - $$) db 0		; disk signature and partition table: not ours

; =============================================================================
; Stage 2 (STAGE2_SECTORS sectors at STAGE2_LBA, loaded to 0000:7E00)
; =============================================================================

stage2:
	dd STAGE2_MAGIC

; -----------------------------------------------------------------------------
; stage2_main -- collect machine information, load config and kernel, boot it
;  IN:	nothing (DS = ES = SS = 0, [drive] set)
; OUT:	does not return
; -----------------------------------------------------------------------------
stage2_main:
	mov di, ZERO_START			; clear info record and memory map
	mov cx, ZERO_WORDS
	xor ax, ax
	rep stosw

	mov bp, MBINFO
	int 0x12				; AX = KiB of conventional memory
	mov [bp + mbinfo.mem_lower], ax
	call memory_map

	call enable_a20

	mov eax, [patch.config_lba]		; \DPXE.CFG into the low buffer; the
	mov cx, [patch.config_sectors]		; zeroed byte behind it ends the text
	cmp cx, CFG_MAX / SECTOR_SIZE
	ja .bad_patch
	jcxz .no_config
	mov bx, CFG_SEG
	call disk_read
	jmp .config_done
.no_config:
	mov byte [CFG_BUF], 0			; no config: an empty command line
.config_done:

	mov cx, [patch.kernel_sectors]		; kernel.bin into the staging buffer
	cmp cx, MAX_KERNEL_SECTORS
	ja .bad_patch
	jcxz .bad_patch
	mov eax, [patch.load_addr]
	cmp eax, ONE_MIB			; the copy must not hit this loader's data
	jb .bad_patch
	call load_kernel

	mov dword [bp + mbinfo.flags], MBI_FLAGS
	movzx eax, byte [drive]
	shl eax, 24
	or eax, MBI_NO_PARTITION
	mov [bp + mbinfo.boot_device], eax
	mov dword [bp + mbinfo.cmdline], CFG_BUF
	mov dword [bp + mbinfo.mmap_addr], MMAP
	mov dword [bp + mbinfo.boot_loader_name], loader_name

	mov si, msg_boot
	call say

	call protect
	jmp CODE_SEL:pm_entry

.bad_patch:
	mov si, msg_bad_patch
	jmp fatal

; -----------------------------------------------------------------------------
; memory_map -- E820 records into Multiboot mmap records; mem_upper from them
;  IN:	BP = MBINFO (zeroed), the MMAP area zeroed
; OUT:	mbinfo.mmap_length, mbinfo.mem_upper set; EAX, EBX, ECX, EDX, DI clobbered
; -----------------------------------------------------------------------------
memory_map:
	mov di, MMAP + 4			; a record's body follows its 4-byte size field
	xor ebx, ebx				; continuation value: start of the list
.next:
	mov eax, E820_FUNC
	mov edx, E820_SMAP
	mov ecx, E820_ENTRY_LEN
	int 0x15
	jc .done				; carry: past the end (or no E820 at all)
	cmp eax, E820_SMAP
	jne .done
	cmp dword [di + e820.length], 0		; skip empty records (ACPI spec allows them)
	jne .keep
	cmp dword [di + e820.length + 4], 0
	je .skip
.keep:
	mov dword [di - 4], E820_ENTRY_LEN	; Multiboot's size excludes the size field
	cmp dword [di + e820.base], ONE_MIB	; the RAM region at 1 MiB gives mem_upper
	jne .advance
	cmp dword [di + e820.base + 4], 0
	jne .advance
	cmp dword [di + e820.type], E820_TYPE_RAM
	jne .advance
	mov eax, [di + e820.length]		; length in KiB, capped at 4 GiB
	mov edx, [di + e820.length + 4]
	shrd eax, edx, 10
	test edx, 0xFFFFFC00
	jz .upper
	mov eax, 0xFFFFFFFF >> 10
.upper:
	mov [bp + mbinfo.mem_upper], eax
.advance:
	add di, MMAP_RECORD_LEN
	cmp di, MMAP_END
	jae .done
.skip:
	test ebx, ebx				; EBX = 0 after the last record
	jnz .next
.done:
	sub di, MMAP + 4
	mov [bp + mbinfo.mmap_length], di
	ret

; -----------------------------------------------------------------------------
; enable_a20 -- turn the A20 gate on: BIOS, then port 0x92, then the keyboard
;		controller, checking after each; halts with a message if all fail
;  IN:	nothing (run before anything is loaded at A20_TEST_LOW)
; OUT:	AX, CX clobbered
; -----------------------------------------------------------------------------
enable_a20:
	call a20_on
	jnz .done
	mov ax, A20_BIOS_ENABLE			; INT 15h AX=2401h
	int 0x15
	call a20_on
	jnz .done
	in al, A20_FAST_PORT			; System Control Port A
	or al, A20_FAST_BIT
	and al, ~A20_RESET_BIT & 0xFF
	out A20_FAST_PORT, al
	call a20_on
	jnz .done
	call kbc_wait				; 8042: write the output port with A20 set
	mov al, KBC_WRITE_OUTPUT
	out KBC_COMMAND, al
	call kbc_wait
	mov al, KBC_OUTPUT_A20_ON
	out KBC_DATA, al
	call kbc_wait
	call a20_on
	jnz .done
	mov si, msg_no_a20
	jmp fatal
.done:
	ret

; -----------------------------------------------------------------------------
; a20_on -- is the A20 gate on? (does 1 MiB + x alias x?)
;  IN:	nothing
; OUT:	ZF clear when A20 is on; AX clobbered; memory unchanged
; -----------------------------------------------------------------------------
a20_on:
	push ds
	push es
	push si
	push di
	xor ax, ax
	mov ds, ax
	dec ax
	mov es, ax				; FFFF:x = 1 MiB + x - 16
	mov si, A20_TEST_LOW
	mov di, A20_TEST_LOW + 16		; the same address when A20 is off
	mov al, [si]
	mov ah, [es:di]
	push ax
	mov byte [si], 0x00
	mov byte [es:di], 0xFF
	cmp byte [si], 0xFF			; ZF set: the write wrapped to low memory
	pop ax
	mov [es:di], ah				; restore both (mov leaves flags alone)
	mov [si], al
	pop di
	pop si
	pop es
	pop ds
	ret

; -----------------------------------------------------------------------------
; kbc_wait -- wait (bounded) until the 8042 input buffer is empty
;  IN:	nothing
; OUT:	CX, AL clobbered (an absent controller reads 0xFF: the bound ends it)
; -----------------------------------------------------------------------------
kbc_wait:
	mov cx, 0xFFFF
.poll:
	in al, KBC_STATUS
	test al, KBC_STATUS_INPUT_FULL
	loopnz .poll
	ret

; -----------------------------------------------------------------------------
; load_kernel -- read kernel.bin in CHUNK_SECTORS pieces into the staging buffer
;  IN:	CX = sectors (1..MAX_KERNEL_SECTORS)
; OUT:	the kernel at STAGE_SEG:0; EAX, BX, CX, DI clobbered
; -----------------------------------------------------------------------------
load_kernel:
	mov di, cx				; DI = sectors still to read
	mov eax, [patch.kernel_lba]
	mov bx, STAGE_SEG
.chunk:
	mov cx, CHUNK_SECTORS
	cmp di, cx
	jae .read
	mov cx, di				; the last, shorter piece
.read:
	call disk_read
	movzx ecx, cx
	add eax, ecx
	add bx, CHUNK_PARAS
	sub di, cx
	jnz .chunk
	ret

; -----------------------------------------------------------------------------
; protect -- load the GDT and set CR0.PE with interrupts off
;  IN:	nothing
; OUT:	EAX = CR0; still running 16-bit code until the caller's far jump
; -----------------------------------------------------------------------------
protect:
	cli
	lgdt [gdt]
	mov eax, cr0
	or al, CR0_PE
	mov cr0, eax
	ret

BITS 32
; -----------------------------------------------------------------------------
; pm_entry -- flat 32-bit protected mode: move the kernel, hand over to it
;  IN:	nothing
; OUT:	jumps to entry_addr with EAX = 0x2BADB002, EBX = &mbinfo
; -----------------------------------------------------------------------------
pm_entry:
	mov ax, DATA_SEL
	mov ds, ax
	mov es, ax
	mov fs, ax
	mov gs, ax
	mov ss, ax
	mov esi, STAGE_SEG << 4			; staging buffer -> load_addr
	mov edi, [patch.load_addr]
	movzx ecx, word [patch.kernel_sectors]
	shl ecx, 7				; sectors -> dwords (512 / 4)
	rep movsd
	mov eax, MB_LOADER_MAGIC
	mov ebx, MBINFO
	jmp [patch.entry_addr]

; --- Stage 2 data --------------------------------------------------------------

align 8
gdt:					; the null descriptor holds the GDTR image
	dw gdt.end - gdt - 1			; limit
	dd gdt					; base
	dw 0
.code:	dq 0x00CF9A000000FFFF			; base 0, limit 4 GiB, 32-bit, execute/read
.data:	dq 0x00CF92000000FFFF			; base 0, limit 4 GiB, 32-bit, read/write
.end:
CODE_SEL		equ gdt.code - gdt
DATA_SEL		equ gdt.data - gdt

loader_name:	db "dpxe-mbr", 0		; Multiboot boot_loader_name; the kernel keys its boot source on it
msg_boot:	db "starting kernel", 13, 10, 0
msg_no_a20:	db "cannot enable the A20 gate", 13, 10, 0
msg_bad_patch:	db "loader not patched for this kernel (rebuild the image)", 13, 10, 0

	times 512 + STAGE2_SECTORS * SECTOR_SIZE - ($ - $$) db 0	; fails when stage 2 outgrows STAGE2_SECTORS

; EOF
