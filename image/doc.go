// Package image turns the kernel sources into bootable artifacts: it
// assembles kernel.bin and the BIOS MBR loader with nasm, validates
// kernel.bin's PE32+ and Multiboot headers, and writes the netboot tree, the
// hybrid BIOS/UEFI USB image and a manifest, reproducibly.
//
// It also owns the node config file \DPXE.CFG inside a USB image: where it
// lives, how a fresh image's template looks, and how `dpxe config` reads and
// rewrites it in place. See docs/images.md and docs/boot-config.md.
package image
