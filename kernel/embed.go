// Package kernel embeds the NASM sources of the shard kernel and of the BIOS
// MBR loader, so `dpxe build` can assemble them from the dpxe binary alone.
//
// Layout: kernel.asm is the root file (nasm -f bin, include path = this
// directory); boot/ holds the entry stubs and the MBR loader, core/ the
// serial console, interrupts, timing, paging, PCI and command line,
// drivers/ the NIC drivers (e1000, virtio-net), net/ the network stack
// (Ethernet, ARP, IPv4, ICMP, UDP, DHCP, DNS, TCP, HTTP), lib/ strings,
// splitmix64, JSON, SHA-1, base64 and WebSocket framing, crypto/ the
// cryptography, node/ the main loop and the check-in, shard/ the shard
// runtime, gateway/ the Gateway sessions, and selftest/ the in-kernel tests.
package kernel

import "embed"

// Sources holds every .asm and .inc file of the kernel tree.
//
//go:embed *.asm */*.asm */*.inc *.inc
var Sources embed.FS

// Root is the file to assemble for kernel.bin.
const Root = "kernel.asm"

// MBRLoader is the file to assemble for the BIOS loader: a 440-byte MBR
// stage and a second stage that the image pipeline places before the ESP.
const MBRLoader = "boot/mbr.asm"
