; =============================================================================
; Discord-PXE -- image pipeline test fixture (image/testdata/kernel/kernel.asm)
;
; A minimal kernel.bin with the same shape as the real kernel: one flat binary
; that is a PE32+ EFI application (file offset == RVA, a .reloc block) and a
; Multiboot v1 kernel (a.out-kludge header in the first 8 KiB, load_addr =
; ImageBase = 0x100000). Its 32-bit Multiboot entry reports what the boot
; loader handed over on COM1 and exits QEMU through isa-debug-exit:
;
;   fixture: magic=ok loader=<name> cmdline=<text> mmap=<n> upper=<KiB> drive=<n>
;   fixture: pattern=ok (or pattern=bad@<dword index>)
;
; then writes EXIT_PASS to port 0xF4 (QEMU exit status 33), or EXIT_FAIL when
; EAX did not hold the Multiboot magic. Its EFI entry returns EFI_UNSUPPORTED.
; Assemble: nasm -f bin -I <dir>/ -o kernel.bin kernel.asm
; =============================================================================

%include "version.inc"

BITS 32

IMAGE_BASE		equ 0x100000		; = Multiboot load_addr (file offset 0)
SECTION_ALIGN		equ 0x1000		; = FileAlignment: file offset == RVA
PE_MACHINE_AMD64	equ 0x8664		; PE/COFF spec 3.3.1
PE_CHARACTERISTICS	equ 0x0022		; EXECUTABLE_IMAGE | LARGE_ADDRESS_AWARE (3.3.2)
PE_OPT_MAGIC_PE32PLUS	equ 0x020B		; PE/COFF spec 3.4
PE_SUBSYSTEM_EFI_APP	equ 10			; IMAGE_SUBSYSTEM_EFI_APPLICATION
PE_DIRS			equ 16
SCN_TEXT		equ 0x60000020		; CNT_CODE | MEM_EXECUTE | MEM_READ
SCN_RELOC		equ 0x42000040		; CNT_INITIALIZED_DATA | MEM_DISCARDABLE | MEM_READ
PATTERN_DWORDS		equ 24576		; 96 KiB: the loader must read it in several chunks
PATTERN_MUL		equ 0x9E3779B1		; dword i of the pattern is i * PATTERN_MUL

MB_MAGIC		equ 0x1BADB002		; Multiboot v1 spec 3.1.2
MB_FLAGS		equ 0x00010002		; MEMINFO | AOUT_KLUDGE
MB_LOADER_MAGIC		equ 0x2BADB002

COM1			equ 0x3F8
DEBUG_EXIT_PORT		equ 0xF4		; QEMU -device isa-debug-exit,iobase=0xf4
EXIT_PASS		equ 0x10		; QEMU exits with (0x10 << 1) | 1 = 33
EXIT_FAIL		equ 0x11		; 35

%define RVA(x) ((x) - $$)
%define VA(x) (IMAGE_BASE + (x) - $$)

; --- DOS header --------------------------------------------------------------
dos:
	db "MZ"
	times 0x3C - ($ - $$) db 0
	dd pe - $$				; e_lfanew

; --- PE headers ----------------------------------------------------------------
	times 0x40 - ($ - $$) db 0
pe:
	db "PE", 0, 0
	dw PE_MACHINE_AMD64
	dw 2					; sections
	dd 0, 0, 0				; timestamp, symbols
	dw opt_end - opt			; SizeOfOptionalHeader
	dw PE_CHARACTERISTICS
opt:
	dw PE_OPT_MAGIC_PE32PLUS
	db 0, 0					; linker version
	dd text_end - text			; SizeOfCode
	dd reloc_end - reloc			; SizeOfInitializedData
	dd 0					; SizeOfUninitializedData
	dd RVA(efi_entry)			; AddressOfEntryPoint
	dd RVA(text)				; BaseOfCode
	dq IMAGE_BASE
	dd SECTION_ALIGN			; SectionAlignment
	dd SECTION_ALIGN			; FileAlignment
	dw 0, 0, 0, 0, 0, 0			; OS, image, subsystem versions
	dd 0					; Win32VersionValue
	dd RVA(image_end)			; SizeOfImage
	dd RVA(text)				; SizeOfHeaders
	dd 0					; CheckSum
	dw PE_SUBSYSTEM_EFI_APP
	dw 0					; DllCharacteristics
	dq 0x10000, 0x10000, 0, 0		; stack and heap
	dd 0					; LoaderFlags
	dd PE_DIRS
	times 5 dq 0				; export, import, resource, exception, security
	dd RVA(reloc), reloc_end - reloc	; base relocation table
	times PE_DIRS - 6 dq 0
opt_end:
	db ".text", 0, 0, 0
	dd text_end - text, RVA(text), reloc - text, RVA(text), 0, 0
	dw 0, 0
	dd SCN_TEXT
	db ".reloc", 0, 0
	dd reloc_end - reloc, RVA(reloc), image_end - reloc, RVA(reloc), 0, 0
	dw 0, 0
	dd SCN_RELOC

; --- Multiboot header (a.out kludge) -------------------------------------------
	align 4
mb_header:
	dd MB_MAGIC
	dd MB_FLAGS
	dd -(MB_MAGIC + MB_FLAGS)
	dd VA(mb_header)			; header_addr
	dd IMAGE_BASE				; load_addr
	dd VA(image_end)			; load_end_addr
	dd VA(image_end)			; bss_end_addr: no BSS
	dd VA(mb_entry)				; entry_addr

; --- .text ---------------------------------------------------------------------
	times SECTION_ALIGN - ($ - $$) db 0
text:
mb_entry:
	mov esp, VA(stack_top)
	mov edi, EXIT_FAIL
	cmp eax, MB_LOADER_MAGIC
	jne .fail
	mov edi, EXIT_PASS
	mov esi, VA(s_magic)
	call puts
	mov esi, VA(s_loader)
	call puts
	test dword [ebx], 1 << 9
	jz .no_loader
	mov esi, [ebx + 64]
	call puts
.no_loader:
	mov esi, VA(s_cmdline)
	call puts
	test dword [ebx], 1 << 2
	jz .no_cmdline
	mov esi, [ebx + 16]
	call puts_line
.no_cmdline:
	mov esi, VA(s_mmap)
	call puts
	mov eax, [ebx + 44]			; mmap_length / 24
	xor edx, edx
	mov ecx, 24
	div ecx
	call put_dec
	mov esi, VA(s_upper)
	call puts
	mov eax, [ebx + 8]
	call put_dec
	mov esi, VA(s_drive)
	call puts
	mov eax, [ebx + 12]			; boot_device: BIOS drive in bits 31..24
	shr eax, 24
	call put_dec
	mov esi, VA(s_end)
	call puts
	call check_pattern
	jmp .exit
.fail:
	mov esi, VA(s_bad)
	call puts
.exit:
	mov eax, edi
	out DEBUG_EXIT_PORT, al
.halt:
	cli
	hlt
	jmp .halt

; check_pattern: verify the 96 KiB pattern at the end of .text, dword by
; dword, and report on COM1; EDI = EXIT_FAIL when it differs
check_pattern:
	mov esi, VA(s_pattern)
	call puts
	xor ecx, ecx
.next:
	mov eax, ecx
	imul eax, eax, PATTERN_MUL
	cmp eax, [VA(pattern) + ecx * 4]
	jne .bad
	inc ecx
	cmp ecx, PATTERN_DWORDS
	jb .next
	mov esi, VA(s_ok)
	call puts
	ret
.bad:
	mov edi, EXIT_FAIL
	mov esi, VA(s_bad_at)
	call puts
	mov eax, ecx
	call put_dec
	mov esi, VA(s_end)
	call puts
	ret

; puts: ESI = NUL-terminated string -> COM1
puts:
	lodsb
	test al, al
	jz .done
	call putc
	jmp puts
.done:
	ret

; puts_line: like puts, but shows line breaks as '|' to keep one line
puts_line:
	lodsb
	test al, al
	jz .done
	cmp al, 10
	jne .put
	mov al, '|'
.put:
	cmp al, 13
	je puts_line
	call putc
	jmp puts_line
.done:
	ret

; putc: AL -> COM1
putc:
	push edx
	push eax
	mov dx, COM1 + 5
.wait:
	in al, dx
	test al, 0x20
	jz .wait
	pop eax
	mov dx, COM1
	out dx, al
	pop edx
	ret

; put_dec: EAX unsigned -> COM1 in decimal
put_dec:
	push ebx
	mov ebx, 10
	xor ecx, ecx
.div:
	xor edx, edx
	div ebx
	push edx
	inc ecx
	test eax, eax
	jnz .div
.out:
	pop eax
	add al, '0'
	call putc
	loop .out
	pop ebx
	ret

BITS 64
efi_entry:
	mov rax, 0x8000000000000003		; EFI_UNSUPPORTED
	ret

s_magic:	db "fixture: magic=ok", 0
s_loader:	db " loader=", 0
s_cmdline:	db " cmdline=", 0
s_mmap:		db " mmap=", 0
s_upper:	db " upper=", 0
s_drive:	db " drive=", 0
s_end:		db 13, 10, 0
s_bad:		db "fixture: bad multiboot magic", 13, 10, 0
s_version:	db KERNEL_VERSION, 0
s_pattern:	db "fixture: pattern=", 0
s_ok:		db "ok", 13, 10, 0
s_bad_at:	db "bad@", 0
	align 16
stack:		times 256 db 0
stack_top:
	align 4
pattern:
%assign i 0
%rep PATTERN_DWORDS
	dd (i * PATTERN_MUL) & 0xFFFFFFFF
%assign i i + 1
%endrep
text_end:

; --- .reloc: one block of padding entries (nothing to fix up) -----------------
	align SECTION_ALIGN, db 0
reloc:
	dd RVA(text)				; page RVA
	dd 12					; block size: header + two entries
	dw 0, 0					; IMAGE_REL_BASED_ABSOLUTE (padding)
reloc_end:
	align SECTION_ALIGN, db 0
image_end:

; EOF
