package appliance

import (
	"errors"
	"strings"
	"testing"
)

func TestParseBootConfig(t *testing.T) {
	cred := "ABCDEFGHijklmnop_-09"
	tests := []struct {
		name    string
		text    string
		want    BootConfig
		wantErr string // substring of the error; "" = accept
	}{
		{name: "empty", text: ""},
		{name: "image name only", text: "kernel.bin"},
		{name: "full", text: "kernel.bin node=rack-1.a_b controller=http://10.0.0.1:8080/api cred=" + cred + " shards=16 total_shards=64 capacity=32 selftest=1 seed=7",
			want: BootConfig{NodeID: "rack-1.a_b", Controller: "http://10.0.0.1:8080/api", Credential: cred, Shards: 16, TotalShards: 64, Capacity: 32,
				SelfTest: true, Seed: 7, HasShards: true, HasTotalShards: true, HasCapacity: true, HasSeed: true}},
		{name: "comments and newlines", text: "# DPXE.CFG\nnode=a # trailing\n\n#x=1\r\nshards=2\n", want: BootConfig{NodeID: "a", Shards: 2, HasShards: true}},
		{name: "NUL ends the text", text: "node=a\x00bogus=1", want: BootConfig{NodeID: "a"}},
		{name: "initrd ignored", text: " initrd=initrd node=a", want: BootConfig{NodeID: "a"}},
		{name: "unknown key", text: "node=a bogus=1", wantErr: `byte 7: key "bogus": unknown key`},
		{name: "second bare token", text: "kernel.bin extra node=a", wantErr: `byte 11: token "extra" is not key=value`},
		{name: "twice", text: "node=a node=b", wantErr: `key "node": given twice`},
		{name: "empty value", text: "node=", wantErr: `key "node": empty value`},
		{name: "node too long", text: "node=" + strings.Repeat("a", 65), wantErr: "node ID must be 1-64"},
		{name: "node bad char", text: "node=a/b", wantErr: `node ID has '/' at position 1`},
		{name: "cred short", text: "cred=abc", wantErr: "credential must be 16-128"},
		{name: "cred bad char", text: "cred=abcdefgh+ijklmnop", wantErr: "outside A-Za-z0-9-_ at position 8"},
		{name: "controller https", text: "controller=https://x:8443/api", want: BootConfig{Controller: "https://x:8443/api"}},
		{name: "controller ftp", text: "controller=ftp://x", wantErr: "must start with http:// or https://"},
		{name: "controller https no host", text: "controller=https://", wantErr: "no host"},
		{name: "controller mixed", text: "controller=http://a,https://b", want: BootConfig{Controller: "http://a,https://b"}},
		{name: "controller pin", text: "controller=https://x controller_pin=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", want: BootConfig{Controller: "https://x", ControllerPin: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}},
		{name: "controller pin short", text: "controller_pin=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde", wantErr: `key "controller_pin": controller pin must be 64 lower-case hex digits (a SHA-256), got 63`},
		{name: "controller pin long", text: "controller_pin=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0", wantErr: "got 65 characters"},
		{name: "controller pin upper", text: "controller_pin=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdeF", wantErr: `controller pin has 'F' at position 63`},
		{name: "controller pin colon", text: "controller_pin=01:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abc", wantErr: `has ':' at position 2`},
		{name: "controller no host", text: "controller=http://:80", wantErr: "no host"},
		{name: "controller port 0", text: "controller=http://h:0", wantErr: `port "0"`},
		{name: "controller port big", text: "controller=http://h:65536", wantErr: `port "65536"`},
		{name: "controller bracket", text: "controller=http://[::1]", wantErr: `has '['`},
		{name: "shards 0", text: "shards=0", wantErr: "out of range 1..128"},
		{name: "shards 129", text: "shards=129", wantErr: "out of range 1..128"},
		{name: "shards sign", text: "shards=+1", wantErr: "not a decimal number"},
		{name: "total too big", text: "total_shards=131073", wantErr: "out of range 1..131072"},
		{name: "seed max", text: "seed=4294967295", want: BootConfig{Seed: 4294967295, HasSeed: true}},
		{name: "seed overflow", text: "seed=4294967296", wantErr: "out of range"},
		{name: "selftest 2", text: "selftest=2", wantErr: "out of range 0..1"},
		{name: "unprintable", text: "node=a\x01", wantErr: "byte 6: byte 0x01 is not printable ASCII"},
		{name: "utf8", text: "node=\xc3\xa9", wantErr: "byte 5: byte 0xc3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBootConfig([]byte(tt.text))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got != tt.want {
				t.Fatalf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseBootConfigTooLong(t *testing.T) {
	long := "node=a " + strings.Repeat(" ", MaxBootConfigLen)
	if _, err := ParseBootConfig([]byte(long)); !errors.Is(err, ErrConfigTooLong) {
		t.Fatalf("error = %v, want ErrConfigTooLong", err)
	}
	// A DPXE.CFG is exactly MaxBootConfigLen bytes padded with NULs: fine.
	padded := make([]byte, MaxBootConfigLen)
	copy(padded, "node=a")
	if c, err := ParseBootConfig(padded); err != nil || c.NodeID != "a" {
		t.Fatalf("padded config: %+v, %v", c, err)
	}
}

func TestBootConfigStringRoundTrip(t *testing.T) {
	c := BootConfig{NodeID: "n1", Controller: "http://h:1/x,https://g", Credential: strings.Repeat("k", 16), Shards: 3, HasShards: true, SelfTest: true, Seed: 0, HasSeed: true,
		ControllerPin: strings.Repeat("9e", 32)}
	got, err := ParseBootConfig([]byte(c.String()))
	if err != nil {
		t.Fatalf("%q: %v", c.String(), err)
	}
	if got != c {
		t.Fatalf("round trip: got %+v want %+v", got, c)
	}
}

func TestBootConfigSet(t *testing.T) {
	var c BootConfig
	if err := c.Set("node=a", "shards=4", "controller=http://x:9"); err != nil {
		t.Fatal(err)
	}
	if c.NodeID != "a" || !c.HasShards || c.Shards != 4 || c.Controller != "http://x:9" {
		t.Fatalf("after set: %+v", c)
	}
	if err := c.Set("shards="); err != nil || c.HasShards {
		t.Fatalf("clearing shards: %+v %v", c, err)
	}
	if err := c.Set("color=red"); err == nil || !strings.Contains(err.Error(), `unknown key "color"`) {
		t.Fatalf("unknown key error = %v", err)
	}
	if err := c.Set("shards=999"); err == nil || !strings.Contains(err.Error(), "shards:") {
		t.Fatalf("bad value error = %v", err)
	}
	if err := c.Set("novalue"); err == nil {
		t.Fatal("want an error for a missing '='")
	}
}

// FuzzParseBootConfig checks that the parser never panics, that an accepted
// config renders (String) to text that parses back to the same config, and
// that errors always say where.
func FuzzParseBootConfig(f *testing.F) {
	for _, s := range []string{"", "kernel.bin node=a", "node=a controller=http://h:80 cred=ABCDEFGHIJKLMNOP shards=1 seed=3",
		"# c\nnode=a\x00x", "node=a node=b", "controller=https://10.0.0.1:8443,http://h controller_pin=" + strings.Repeat("0f", 32), "shards=0", "\xff", "initrd=x node=q", "selftest=1 total_shards=131072 capacity=128"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseBootConfig(b)
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) && !errors.Is(err, ErrConfigTooLong) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			if ce != nil && (ce.Offset < 0 || ce.Offset > len(b)) {
				t.Fatalf("offset %d outside the input of %d bytes", ce.Offset, len(b))
			}
			return
		}
		again, err := ParseBootConfig([]byte(c.String()))
		if err != nil || again != c {
			t.Fatalf("String() %q does not round-trip: %+v, %v", c.String(), again, err)
		}
	})
}
