package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
)

// The cryptography self-tests (cryptotest=1, kernel/selftest/crypto_selftest.inc)
// run in one QEMU boot per CPU model that every crypto test of this package
// reads. Test files register the vector sections they need in
// cryptoSections from an init function; the boot's first Multiboot module
// is "DPXEVEC1" followed by every section as tag (8 bytes), u32 little-endian
// length and payload, in tag order.

// cryptoSections maps an 8-byte section tag to the function that builds
// its payload. Register from init functions only.
var cryptoSections = map[string]func() ([]byte, error){}

// cryptoModule builds the vector module from cryptoSections.
func cryptoModule() ([]byte, error) {
	tags := make([]string, 0, len(cryptoSections))
	for tag := range cryptoSections {
		if len(tag) != 8 {
			panic("crypto vector section tag " + tag + " is not 8 bytes")
		}
		tags = append(tags, tag)
	}
	sort.Strings(tags)
	var b bytes.Buffer
	b.WriteString("DPXEVEC1")
	for _, tag := range tags {
		payload, err := cryptoSections[tag]()
		if err != nil {
			return nil, err
		}
		b.WriteString(tag)
		binary.Write(&b, binary.LittleEndian, uint32(len(payload)))
		b.Write(payload)
	}
	return b.Bytes(), nil
}

// cryptoCPU names the QEMU CPU models the crypto self-tests boot on: the
// default qemu64 (no AES-NI, PCLMULQDQ, RDRAND or RDSEED, so every software
// path runs) and max (TCG emulates those instructions, so the accelerated
// paths run).
var cryptoCPUs = []string{"qemu64", "max"}

type cryptoBoot struct {
	once sync.Once
	res  *qemu.Result
	err  error
}

var cryptoBoots = map[string]*cryptoBoot{"qemu64": {}, "max": {}}

// cryptoSelfTest boots kernel.bin once per process and CPU model with
// cryptotest=1 and the vector module, and returns the run. A boot that
// did not pass fails the calling test.
func cryptoSelfTest(t *testing.T, cpu string) *qemu.Result {
	t.Helper()
	needQEMU(t, qemu.SeaBIOS)
	cb := cryptoBoots[cpu]
	if cb == nil {
		t.Fatalf("no crypto boot for CPU model %q", cpu)
	}
	cb.once.Do(func() {
		mod, err := cryptoModule()
		if err != nil {
			cb.err = err
			return
		}
		dir, err := os.MkdirTemp("", "dpxe-cryptotest-")
		if err != nil {
			cb.err = err
			return
		}
		defer os.RemoveAll(dir)
		path := filepath.Join(dir, "vectors.bin")
		if err := os.WriteFile(path, mod, 0o644); err != nil {
			cb.err = err
			return
		}
		cfg := appliance.BootConfig{NodeID: "cryptotest", CryptoTest: true, Seed: selfTestSeed, HasSeed: true}
		cb.res, cb.err = qemu.Run(context.Background(), qemu.Options{
			Firmware: qemu.SeaBIOS,
			Kernel:   filepath.Join(outDir(t), image.KernelFile),
			Append:   cfg.String(),
			Initrd:   path,
			Timeout:  4 * time.Minute,
			Extra:    []string{"-cpu", cpu},
			NoKVM:    true, // the CPU model must be the one asked for
		})
	})
	if cb.err != nil {
		t.Fatal(cb.err)
	}
	logSerialOnFailure(t, cb.res)
	if !cb.res.Passed() {
		t.Errorf("cryptotest on CPU %s: QEMU exit status %d (timed out: %v), want %d (pass)", cpu, cb.res.ExitCode, cb.res.TimedOut, qemu.ExitPass)
	}
	return cb.res
}

// cryptoFailures returns the "cryptotest FAIL" lines of a run.
func cryptoFailures(res *qemu.Result) []string {
	var out []string
	for _, line := range strings.Split(res.Serial, "\n") {
		if strings.HasPrefix(line, "cryptotest FAIL") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// TestKernelCryptoSelfTest boots the crypto self-tests on every CPU model
// and wants each to pass with no failure line.
func TestKernelCryptoSelfTest(t *testing.T) {
	for _, cpu := range cryptoCPUs {
		t.Run(cpu, func(t *testing.T) {
			res := cryptoSelfTest(t, cpu)
			for _, f := range cryptoFailures(res) {
				t.Errorf("%s", f)
			}
			if !strings.Contains(res.Serial, "cryptotest: seed=") {
				t.Error("no cryptotest banner: the kernel did not take cryptotest=1")
			}
		})
	}
}
