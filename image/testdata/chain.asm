; =============================================================================
; Discord-PXE -- test chainloader (image/testdata/chain.asm)
;
; Sector 0 of a test image. Relocates itself to 0000:0600, reads the real MBR
; loader's stage 1 from LBA STAGE1_LBA to 0000:7C00 and jumps to it with the
; boot drive number DRIVE in DL, to imitate BIOSes that pass a wrong number.
; Assemble: nasm -f bin -DDRIVE=0x00 -DSTAGE1_LBA=2045 -o chain.bin chain.asm
; =============================================================================

BITS 16
ORG 0x0600

RELOC		equ 0x0600		; where this sector runs after relocation
LOAD		equ 0x7C00		; where a boot sector expects to run

start:
	cli
	xor ax, ax
	mov ds, ax
	mov es, ax
	mov ss, ax
	mov sp, LOAD
	mov si, LOAD			; move this sector out of the way
	mov di, RELOC
	mov cx, 256
	cld
	rep movsw
	jmp 0:relocated
relocated:
	sti
	mov si, dap			; the real drive is still in DL
	mov ah, 0x42
	int 0x13
	jc .halt
	mov dl, DRIVE			; the wrong number under test
	jmp 0:LOAD
.halt:
	cli
	hlt
	jmp .halt

dap:
	db 16, 0
	dw 1				; one sector
	dw LOAD, 0			; to 0000:7C00
	dq STAGE1_LBA

	times 440 - ($ - $$) db 0

; EOF
