package image

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestKernelVersion(t *testing.T) {
	for _, tc := range []struct {
		text, want string
		err        error
	}{
		{"%define KERNEL_VERSION \"0.1.0\"\n", "0.1.0", nil},
		{"; banner\n  %define   KERNEL_VERSION   \"1.2.3-rc1\" ; why\n", "1.2.3-rc1", nil},
		{"; %define KERNEL_VERSION \"9.9.9\"\n", "", ErrNoVersion},
		{"%define KERNEL_VERSION 0.1.0\n", "", ErrNoVersion},
		{"%define KERNEL_VERSION \"\"\n", "", ErrNoVersion},
		{"", "", ErrNoVersion},
	} {
		got, err := KernelVersion([]byte(tc.text))
		if got != tc.want || !errors.Is(err, tc.err) {
			t.Errorf("KernelVersion(%q) = %q, %v; want %q, %v", tc.text, got, err, tc.want, tc.err)
		}
	}
}

// The real kernel's version.inc must keep the form the builder reads.
func TestKernelVersionOfKernelTree(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "kernel", VersionFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := KernelVersion(b); err != nil {
		t.Fatal(err)
	}
}

func TestValidateKernelFixture(t *testing.T) {
	dir, _ := builtFixture(t)
	b, err := os.ReadFile(filepath.Join(dir, KernelFile))
	if err != nil {
		t.Fatal(err)
	}
	k, err := ValidateKernel(b)
	if err != nil {
		t.Fatal(err)
	}
	if k.PE.ImageBase != 0x100000 || k.Multiboot.LoadAddr != 0x100000 || k.Multiboot.EntryOffset() != 0x1000 {
		t.Errorf("fixture kernel: PE %+v, Multiboot %+v", k.PE, k.Multiboot)
	}
	// Too big for the BIOS loader: 513 KiB loaded.
	big := make([]byte, 513<<10)
	copy(big, b)
	// load_end_addr is at header offset + 20; point it at the end of the file.
	mb := k.Multiboot.Offset
	putLE32(big[mb+20:], 0)
	putLE32(big[mb+24:], 0)
	if _, err := ValidateKernel(big); !errors.Is(err, ErrKernelTooBig) {
		t.Errorf("513 KiB kernel: %v, want ErrKernelTooBig", err)
	}
}

func putLE32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}
