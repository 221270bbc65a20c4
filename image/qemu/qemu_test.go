package qemu

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

// argAfter returns every value that follows flag in args.
func argAfter(args []string, flag string) []string {
	var out []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			out = append(out, args[i+1])
		}
	}
	return out
}

func TestArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want map[string][]string // flag -> values, in order
	}{
		{"kernel", Options{Kernel: "k.bin", Append: "node=a", Initrd: "m.bin", Accel: "tcg"},
			map[string][]string{"-kernel": {"k.bin"}, "-append": {"node=a"}, "-initrd": {"m.bin"}, "-accel": {"tcg"}, "-cpu": {"qemu64"}, "-nic": {"none"}, "-m": {"256"}}},
		{"disk with a comma in its path", Options{Drives: []Drive{{Path: "/tmp/a,b.img", Snapshot: true}}, Memory: 128},
			map[string][]string{"-drive": {"if=none,id=d0,format=raw,file=/tmp/a,,b.img,snapshot=on"}, "-device": {"isa-debug-exit,iobase=0xf4,iosize=0x04", "ide-hd,drive=d0,bootindex=0"}, "-m": {"128"}}},
		{"usb stick", Options{Drives: []Drive{{Path: "u.img", USB: true}}},
			map[string][]string{"-device": {"isa-debug-exit,iobase=0xf4,iosize=0x04", "qemu-xhci,id=xhci", "usb-storage,bus=xhci.0,drive=d0,bootindex=0"}}},
		{"network", Options{Net: []string{"-netdev", "user,id=n0", "-device", "e1000,netdev=n0"}},
			map[string][]string{"-netdev": {"user,id=n0"}, "-nic": nil}},
		{"fw_cfg config", Options{Kernel: "k.bin", Config: "node=a selftest=1"},
			map[string][]string{"-fw_cfg": {"name=opt/org.discord-pxe/config,string=node=a selftest=1"}, "-append": nil}},
		{"forced KVM", Options{Accel: "kvm"}, map[string][]string{"-accel": {"kvm"}, "-cpu": {"host"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, err := Args(tc.o, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			for flag, want := range tc.want {
				if got := argAfter(args, flag); strings.Join(got, "|") != strings.Join(want, "|") {
					t.Errorf("%s: got %q, want %q\nargs: %q", flag, got, want, args)
				}
			}
		})
	}
}

func TestArgsRejectsCommaInConfig(t *testing.T) {
	if _, err := Args(Options{Kernel: "k", Config: "ip=10.0.0.2/24,10.0.0.1"}, t.TempDir()); err == nil {
		t.Error("a comma in the fw_cfg config was accepted")
	}
}

func TestArgsOVMF(t *testing.T) {
	if _, err := os.Stat(ovmfVars); err != nil {
		t.Skip("no OVMF (apt-get install ovmf)")
	}
	dir := t.TempDir()
	args, err := Args(Options{Firmware: OVMF}, dir)
	if err != nil {
		t.Fatal(err)
	}
	drives := argAfter(args, "-drive")
	if len(drives) != 2 || !strings.Contains(drives[0], "readonly=on,file="+ovmfCode) || !strings.Contains(drives[1], "file="+dir+"/OVMF_VARS.fd") {
		t.Errorf("pflash drives %q", drives)
	}
	if _, err := os.Stat(dir + "/OVMF_VARS.fd"); err != nil {
		t.Errorf("no private copy of the variable store: %v", err)
	}
}

func TestAccelerator(t *testing.T) {
	t.Setenv("DPXE_KVM", "")
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{}, "tcg"},
		{Options{Accel: "tcg"}, "tcg"},
		{Options{Accel: "kvm"}, "kvm"},
		{Options{Accel: "kvm", NoKVM: true}, "kvm"},
	} {
		if got := Accelerator(tc.o); got != tc.want {
			t.Errorf("Accelerator(%+v) = %s, want %s", tc.o, got, tc.want)
		}
	}
}

func TestRunRefusesBadAccel(t *testing.T) {
	if Available(SeaBIOS) != nil {
		t.Skip("no QEMU")
	}
	if _, err := Run(context.Background(), Options{Accel: "hvf"}); err == nil || !strings.Contains(err.Error(), "hvf") {
		t.Errorf("accelerator hvf: err %v", err)
	}
	if !KVMUsable() {
		if _, err := Run(context.Background(), Options{Accel: "kvm"}); !errors.Is(err, ErrNoKVM) {
			t.Errorf("KVM without /dev/kvm: err %v, want ErrNoKVM", err)
		}
	}
}
