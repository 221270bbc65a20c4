package smoke

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
)

// artifacts are the files of one `make image` output directory, checked
// once before any boot: every file the manifest lists against its SHA-256
// (usb.img excepted, which `dpxe config` personalises), the kernel copies
// inside usb.img against kernel.bin, and usb.img's DPXE.CFG against the
// boot config rules. Each medium then knows whether it can boot.
type artifacts struct {
	out      string
	manifest *image.Manifest
	// version is the kernel version the console must show.
	version string

	// Errors that stop a medium, nil when it may boot.
	kernelErr  error // kernel.bin
	netbootErr error // netboot/kernel.bin and netboot/boot.ipxe.tmpl
	usbErr     error // usb.img

	// usbConfig is usb.img's DPXE.CFG, parsed.
	usbConfig appliance.BootConfig
	template  string // netboot/boot.ipxe.tmpl

	copyOnce sync.Once
	copyPath string
	copyErr  error
}

// loadArtifacts checks the output directory out. It never fails as a
// whole: what it finds wrong lands in the error of each medium it breaks.
func loadArtifacts(out, wantVersion string) *artifacts {
	a := &artifacts{out: out}
	m, err := readManifest(out)
	if err != nil {
		a.kernelErr, a.netbootErr, a.usbErr = err, err, err
		return a
	}
	a.manifest, a.version = m, m.KernelVersion
	if wantVersion != "" && m.KernelVersion != wantVersion {
		err := fmt.Errorf("%s says kernel %s, want %s (--kernel-version)", a.rel(image.ManifestFile), m.KernelVersion, wantVersion)
		a.kernelErr, a.netbootErr, a.usbErr = err, err, err
		return a
	}
	a.kernelErr = a.checkDigest(image.KernelFile)
	a.netbootErr = errors.Join(a.checkDigest(path.Join(image.NetbootDir, image.KernelFile)), a.checkDigest(image.IPXETemplateFile))
	if a.netbootErr == nil {
		b, err := os.ReadFile(a.file(image.IPXETemplateFile))
		a.template, a.netbootErr = string(b), err
	}
	a.usbErr = a.kernelErr
	if a.usbErr == nil {
		a.usbErr = a.checkUSB()
	}
	return a
}

// readManifest reads out/manifest.json.
func readManifest(out string) (*image.Manifest, error) {
	p := filepath.Join(out, image.ManifestFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no %s: build the artifacts first (make image, or dpxe build --out %s)", p, out)
	}
	if err != nil {
		return nil, err
	}
	var m image.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if m.KernelVersion == "" || len(m.Artifacts) == 0 {
		return nil, fmt.Errorf("%s: no kernel_version or no artifacts: not a dpxe build manifest", p)
	}
	return &m, nil
}

func (a *artifacts) file(name string) string { return filepath.Join(a.out, filepath.FromSlash(name)) }

// rel names a file of the output directory in messages.
func (a *artifacts) rel(name string) string { return filepath.ToSlash(filepath.Join(a.out, name)) }

// checkDigest compares a file with its manifest entry.
func (a *artifacts) checkDigest(name string) error {
	var want *image.FileDigest
	for i := range a.manifest.Artifacts {
		if a.manifest.Artifacts[i].Path == name {
			want = &a.manifest.Artifacts[i]
		}
	}
	if want == nil {
		return fmt.Errorf("%s does not list %s", a.rel(image.ManifestFile), name)
	}
	f, err := os.Open(a.file(name))
	if err != nil {
		return fmt.Errorf("%s: %w", a.rel(name), err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return fmt.Errorf("%s: %w", a.rel(name), err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != want.Size || got != want.SHA256 {
		return fmt.Errorf("%s is %d bytes with sha256 %.16s..., %s says %d bytes with sha256 %.16s...: the file changed after the build",
			a.rel(name), n, got, image.ManifestFile, want.Size, want.SHA256)
	}
	return nil
}

// checkUSB checks usb.img: its layout and DPXE.CFG (image.ReadUSBConfig
// and the boot config rules) and both kernel copies
// (image.CheckUSBKernel).
func (a *artifacts) checkUSB() error {
	img := a.file(image.USBImageFile)
	kernel, err := os.ReadFile(a.file(image.KernelFile))
	if err != nil {
		return err
	}
	kerr := image.CheckUSBKernel(img, kernel)
	if errors.Is(kerr, image.ErrNotDPXEImage) {
		return kerr
	}
	cfg, err := image.ReadUSBConfig(img)
	if err != nil {
		return errors.Join(kerr, err)
	}
	c, err := appliance.ParseBootConfig(cfg.Raw)
	if err != nil {
		return errors.Join(kerr, fmt.Errorf("%s: \\DPXE.CFG: %w (see it with: dpxe config show %s)", a.rel(image.USBImageFile), err, a.rel(image.USBImageFile)))
	}
	a.usbConfig = c
	return kerr
}

// smokeConfig is the boot config the disk and USB paths boot: usb.img's
// own DPXE.CFG with selftest=1 and the run's seed, a node ID when it has
// none, and no development tests (tcptest, cryptotest).
func (a *artifacts) smokeConfig(seed uint32) appliance.BootConfig {
	c := a.usbConfig
	if c.NodeID == "" {
		c.NodeID = "smoke"
	}
	c.SelfTest, c.Seed, c.HasSeed = true, seed, true
	c.CryptoTest, c.TCPTest = false, ""
	return c
}

// usbCopy returns a private copy of usb.img with the smoke config in
// DPXE.CFG, made once in dir. The disk and USB paths boot it with QEMU's
// snapshot=on, so they share it read-only and in parallel.
func (a *artifacts) usbCopy(dir string, seed uint32) (string, error) {
	a.copyOnce.Do(func() {
		p := filepath.Join(dir, image.USBImageFile)
		if a.copyErr = copyFile(a.file(image.USBImageFile), p); a.copyErr != nil {
			return
		}
		raw, err := image.RenderConfig(a.smokeConfig(seed))
		if err != nil {
			a.copyErr = fmt.Errorf("%s: DPXE.CFG with selftest=1: %w", a.rel(image.USBImageFile), err)
			return
		}
		if err := image.WriteUSBConfig(p, raw); err != nil {
			a.copyErr = fmt.Errorf("writing DPXE.CFG into the copy of %s: %w", a.rel(image.USBImageFile), err)
			return
		}
		a.copyPath = p
	})
	return a.copyPath, a.copyErr
}

// copyFile copies from to to, leaving holes where from has zero blocks
// (usb.img is mostly empty).
func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<16)
	var off int64
	for {
		n, err := io.ReadFull(src, buf)
		if n > 0 {
			if !allZero(buf[:n]) {
				if _, werr := dst.WriteAt(buf[:n], off); werr != nil {
					dst.Close()
					return werr
				}
			}
			off += int64(n)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			dst.Close()
			return err
		}
	}
	if err := dst.Truncate(off); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
