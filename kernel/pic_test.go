package kernel

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"
)

// TestNoAbsoluteLabelIndexing keeps the kernel position-independent. With
// DEFAULT REL, NASM encodes [label] RIP-relative, but [label + register]
// cannot be: it becomes a 32-bit absolute address, right only while the
// image sits at its link address. A UEFI loader may place the image
// anywhere (OVMF moves an image over about 7 MiB), so such an operand reads
// or writes the wrong memory there. Write `lea reg, [label]` and index reg.
func TestNoAbsoluteLabelIndexing(t *testing.T) {
	registers := map[string]bool{}
	for _, r := range strings.Fields("rax rbx rcx rdx rsi rdi rbp rsp eax ebx ecx edx esi edi ebp esp") {
		registers[r] = true
	}
	for i := 8; i <= 15; i++ {
		for _, s := range []string{"", "d", "w", "b"} {
			registers["r"+itoa(i)+s] = true
		}
	}
	operand := regexp.MustCompile(`\[([^\]]+)\]`)
	ident := regexp.MustCompile(`^[a-z_][a-z_0-9.]*$`)
	bad := 0
	err := fs.WalkDir(Sources, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path == "boot/mbr.asm" { // the MBR loader is 16/32-bit code at fixed addresses
			return err
		}
		b, err := Sources.ReadFile(path)
		if err != nil {
			return err
		}
		for n, line := range strings.Split(string(b), "\n") {
			code, _, _ := strings.Cut(line, ";")
			for _, m := range operand.FindAllStringSubmatch(code, -1) {
				var label, reg bool
				for _, term := range regexp.MustCompile(`[+-]`).Split(m[1], -1) {
					term, _, _ = strings.Cut(strings.TrimSpace(term), "*")
					term = strings.TrimSpace(term)
					switch {
					case registers[term]:
						reg = true
					case ident.MatchString(term) && term != "rel" && !strings.HasSuffix(term, "_len"):
						label = true
					}
				}
				if label && reg {
					bad++
					t.Errorf("%s:%d: %s: a label plus a register is an absolute address", path, n+1, strings.TrimSpace(line))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if bad == 0 {
		t.Logf("no [label + register] operand in the kernel sources")
	}
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return "1" + string(rune('0'+i-10))
}
