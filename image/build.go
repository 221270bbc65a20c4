package image

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"sort"

	"github.com/discord-pxe/dpxe/image/mbrloader"
)

// Default source paths inside the kernel tree (kernel/embed.go).
const (
	DefaultRoot      = "kernel.asm"
	DefaultMBRLoader = "boot/mbr.asm"
	VersionFile      = "version.inc"
)

// Artifact file names inside the output directory.
const (
	KernelFile       = "kernel.bin"
	NetbootDir       = "netboot"
	IPXETemplateFile = "netboot/boot.ipxe.tmpl"
	USBImageFile     = "usb.img"
	ManifestFile     = "manifest.json"
)

// ErrSources means the kernel tree lacks a file the build needs.
var ErrSources = errors.New("kernel sources incomplete")

// Options configure Build.
type Options struct {
	Sources   fs.FS  // the kernel tree (kernel.Sources, or os.DirFS of a checkout)
	Root      string // file to assemble for kernel.bin; default DefaultRoot
	MBRLoader string // file to assemble for the MBR loader; default DefaultMBRLoader
	OutDir    string // where the artifacts go; created if missing
	NASM      Assembler
	// Trust are the PEM bundles of the TLS trust anchors; none: the
	// default set (DefaultTrustPEM).
	Trust []TrustSource
}

// Manifest describes a build: every artifact with its size and SHA-256, and
// every input that decides the bytes. Two builds with equal manifests
// produced equal files.
type Manifest struct {
	Schema        int          `json:"schema"`
	KernelVersion string       `json:"kernel_version"`
	NASMVersion   string       `json:"nasm_version"`
	SourcesSHA256 string       `json:"kernel_sources_sha256"`
	Module        *ModuleInfo  `json:"module,omitempty"`
	Inputs        Inputs       `json:"inputs"`
	Kernel        KernelInfo   `json:"kernel"`
	USB           *USBLayout   `json:"usb"`
	Trust         *TrustInfo   `json:"trust"`
	Artifacts     []FileDigest `json:"artifacts"`
}

// ModuleInfo identifies the dpxe build that made the artifacts.
type ModuleInfo struct {
	Path     string `json:"path"`
	Version  string `json:"version,omitempty"`
	Revision string `json:"vcs_revision,omitempty"`
	Modified bool   `json:"vcs_modified,omitempty"`
}

// Inputs are the build inputs besides the tools.
type Inputs struct {
	KernelRoot      string       `json:"kernel_root"`
	MBRLoader       string       `json:"mbr_loader"`
	NASMKernelArgs  []string     `json:"nasm_kernel_args"`
	NASMLoaderArgs  []string     `json:"nasm_loader_args"`
	SourceDateEpoch int64        `json:"source_date_epoch"`
	Sources         []FileDigest `json:"kernel_sources"`
}

// KernelInfo is what the validators found in kernel.bin.
type KernelInfo struct {
	LoadAddr        uint32 `json:"load_addr"`
	LoadEndAddr     uint32 `json:"load_end_addr"`
	BSSEndAddr      uint32 `json:"bss_end_addr"`
	EntryAddr       uint32 `json:"multiboot_entry_addr"`
	MultibootOffset int    `json:"multiboot_header_offset"`
	MultibootFlags  uint32 `json:"multiboot_flags"`
	ImageBase       uint64 `json:"pe_image_base"`
	EFIEntryRVA     uint32 `json:"pe_entry_rva"`
	Sections        int    `json:"pe_sections"`
	RelocBlocks     int    `json:"pe_reloc_blocks"`
}

// FileDigest is a file's path (slash-separated, relative), size and SHA-256.
type FileDigest struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Build assembles the kernel and the MBR loader, validates kernel.bin, and
// writes kernel.bin, netboot/kernel.bin, netboot/boot.ipxe.tmpl, usb.img and
// manifest.json to opts.OutDir. It returns the manifest it wrote.
func Build(ctx context.Context, opts Options) (*Manifest, error) {
	if opts.Root == "" {
		opts.Root = DefaultRoot
	}
	if opts.MBRLoader == "" {
		opts.MBRLoader = DefaultMBRLoader
	}
	if opts.Sources == nil || opts.OutDir == "" {
		return nil, errors.New("build: Sources and OutDir are required")
	}
	nasmVersion, err := opts.NASM.Version(ctx)
	if err != nil {
		return nil, err
	}
	src, err := os.MkdirTemp("", "dpxe-kernel-src-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(src)
	sources, sourcesSum, err := copySources(opts.Sources, src)
	if err != nil {
		return nil, err
	}
	for _, need := range []string{opts.Root, opts.MBRLoader, VersionFile} {
		if _, err := os.Stat(filepath.Join(src, filepath.FromSlash(need))); err != nil {
			return nil, fmt.Errorf("%w: no %s", ErrSources, need)
		}
	}
	versionInc, err := os.ReadFile(filepath.Join(src, VersionFile))
	if err != nil {
		return nil, err
	}
	version, err := KernelVersion(versionInc)
	if err != nil {
		return nil, err
	}

	trust := opts.Trust
	if len(trust) == 0 {
		trust = []TrustSource{{Name: DefaultTrustName, PEM: DefaultTrustPEM}}
	}
	anchors, trustInfo, err := TrustAnchors(trust)
	if err != nil {
		return nil, err
	}
	anchorsPath := filepath.Join(src, filepath.FromSlash(AnchorsFile))
	if err := os.MkdirAll(filepath.Dir(anchorsPath), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(anchorsPath, anchors, 0o644); err != nil {
		return nil, err
	}

	// nasm arguments use paths relative to the source directory so that the
	// manifest (and any path nasm embeds in messages) does not depend on it.
	kernelArgs := []string{"-f", "bin", "-I", "./", "-o", KernelFile, opts.Root}
	loaderArgs := []string{"-f", "bin", "-o", "mbr.bin", opts.MBRLoader}
	asm := opts.NASM
	kernelBin, err := asm.assembleIn(ctx, src, KernelFile, kernelArgs...)
	if err != nil {
		return nil, fmt.Errorf("assembling the kernel: %w", err)
	}
	loaderBin, err := asm.assembleIn(ctx, src, "mbr.bin", loaderArgs...)
	if err != nil {
		return nil, fmt.Errorf("assembling the MBR loader: %w", err)
	}
	k, err := ValidateKernel(kernelBin)
	if err != nil {
		return nil, fmt.Errorf("refusing kernel.bin: %w", err)
	}
	loader, err := mbrloader.Parse(loaderBin)
	if err != nil {
		return nil, fmt.Errorf("refusing the MBR loader: %w", err)
	}

	out := opts.OutDir
	if err := os.MkdirAll(filepath.Join(out, NetbootDir), 0o755); err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{
		KernelFile:                        kernelBin,
		path.Join(NetbootDir, KernelFile): kernelBin,
		IPXETemplateFile:                  []byte(IPXETemplate),
	} {
		if err := writeFileAtomic(filepath.Join(out, filepath.FromSlash(name)), data); err != nil {
			return nil, err
		}
	}
	layout, err := WriteUSBImage(filepath.Join(out, USBImageFile), k, loader, ConfigTemplate())
	if err != nil {
		return nil, err
	}

	m := &Manifest{
		Schema:        1,
		KernelVersion: version,
		NASMVersion:   nasmVersion,
		SourcesSHA256: sourcesSum,
		Module:        moduleInfo(),
		Inputs: Inputs{
			KernelRoot: opts.Root, MBRLoader: opts.MBRLoader,
			NASMKernelArgs: kernelArgs, NASMLoaderArgs: loaderArgs,
			SourceDateEpoch: sourceDateEpoch(), Sources: sources,
		},
		Kernel: KernelInfo{
			LoadAddr: k.Multiboot.LoadAddr, LoadEndAddr: k.Multiboot.LoadEndAddr, BSSEndAddr: k.Multiboot.BSSEndAddr,
			EntryAddr: k.Multiboot.EntryAddr, MultibootOffset: k.Multiboot.Offset, MultibootFlags: k.Multiboot.Flags,
			ImageBase: k.PE.ImageBase, EFIEntryRVA: k.PE.EntryRVA, Sections: len(k.PE.Sections), RelocBlocks: k.PE.RelocBlocks,
		},
		USB:   layout,
		Trust: trustInfo,
	}
	for _, name := range []string{KernelFile, path.Join(NetbootDir, KernelFile), IPXETemplateFile, USBImageFile} {
		d, err := digestFile(filepath.Join(out, filepath.FromSlash(name)))
		if err != nil {
			return nil, err
		}
		d.Path = name
		m.Artifacts = append(m.Artifacts, d)
	}
	js, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(filepath.Join(out, ManifestFile), append(js, '\n')); err != nil {
		return nil, err
	}
	return m, nil
}

// assembleIn runs nasm in dir and returns the output file's bytes.
func (a Assembler) assembleIn(ctx context.Context, dir, out string, args ...string) ([]byte, error) {
	a2 := a
	p, err := a.path()
	if err != nil {
		return nil, err
	}
	a2.Path = p
	a2.dir = dir
	return a2.Assemble(ctx, filepath.Join(dir, out), args...)
}

// copySources writes every regular file of src under dir and returns their
// digests in path order and one SHA-256 over all of them (path, NUL, size as
// 8 bytes little endian, content, for each file in order).
func copySources(src fs.FS, dir string) ([]FileDigest, string, error) {
	var files []string
	err := fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrSources, err)
	}
	sort.Strings(files)
	all := sha256.New()
	var digests []FileDigest
	for _, p := range files {
		data, err := fs.ReadFile(src, p)
		if err != nil {
			return nil, "", err
		}
		dst := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, "", err
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return nil, "", err
		}
		sum := sha256.Sum256(data)
		digests = append(digests, FileDigest{Path: p, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])})
		all.Write([]byte(p))
		all.Write([]byte{0})
		all.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(data))))
		all.Write(data)
	}
	return digests, hex.EncodeToString(all.Sum(nil)), nil
}

func digestFile(name string) (FileDigest, error) {
	f, err := os.Open(name)
	if err != nil {
		return FileDigest{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := f.WriteTo(h)
	if err != nil {
		return FileDigest{}, err
	}
	return FileDigest{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// writeFileAtomic writes data to a temporary file next to name and renames it.
func writeFileAtomic(name string, data []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// moduleInfo reports the dpxe module version and VCS state, when the Go
// toolchain recorded them.
func moduleInfo() *ModuleInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	mi := &ModuleInfo{Path: bi.Main.Path, Version: bi.Main.Version}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			mi.Revision = s.Value
		case "vcs.modified":
			mi.Modified = s.Value == "true"
		}
	}
	return mi
}
