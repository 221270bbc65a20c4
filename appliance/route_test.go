package appliance

import (
	"errors"
	"math/big"
	"strconv"
	"testing"
)

func TestParseGuildID(t *testing.T) {
	cases := []struct {
		in   string
		want uint64
		err  error
	}{
		{"0", 0, nil},
		{"1", 1, nil},
		{"41771983423143937", 41771983423143937, nil},
		{"18446744073709551615", 1<<64 - 1, nil},
		{"18446744073709551616", 0, ErrGuildIDRange},
		{"99999999999999999999", 0, ErrGuildIDRange},
		{"100000000000000000000", 0, ErrGuildIDRange},
		{"", 0, ErrGuildIDEmpty},
		{"-1", 0, ErrGuildIDSyntax},
		{"+1", 0, ErrGuildIDSyntax},
		{" 1", 0, ErrGuildIDSyntax},
		{"1 ", 0, ErrGuildIDSyntax},
		{"01", 0, ErrGuildIDSyntax},
		{"1e5", 0, ErrGuildIDSyntax},
		{"0x10", 0, ErrGuildIDSyntax},
		{"１", 0, ErrGuildIDSyntax}, // full-width digit
	}
	for _, c := range cases {
		got, err := ParseGuildID(c.in)
		if !errors.Is(err, c.err) || got != c.want {
			t.Errorf("ParseGuildID(%q) = %d, %v; want %d, %v", c.in, got, err, c.want, c.err)
		}
	}
}

func TestShardForGuild(t *testing.T) {
	cases := []struct {
		guild uint64
		total uint32
		want  uint32
	}{
		// Hand-computed: (197038439483310086 >> 22) = 46977624770, mod 1000 = 770.
		{197038439483310086, 1000, 770},
		{41771983423143937, 1, 0},
		{41771983423143937, 16, (41771983423143937 >> 22) % 16},
		{1<<64 - 1, 131072, uint32(((1<<64 - 1) >> 22) % 131072)},
		{1<<64 - 1, 3, uint32(((1<<64 - 1) >> 22) % 3)},
		{1<<22 - 1, 7, 0},
		{1 << 22, 7, 1},
		{12345, 0, 0}, // total 0 treated as 1
	}
	for _, c := range cases {
		if got := ShardForGuild(c.guild, c.total); got != c.want {
			t.Errorf("ShardForGuild(%d, %d) = %d, want %d", c.guild, c.total, got, c.want)
		}
	}
}

// FuzzParseGuildID checks ParseGuildID against strconv and math/big, and
// ShardForGuild against big-integer arithmetic.
func FuzzParseGuildID(f *testing.F) {
	for _, s := range []string{"0", "197038439483310086", "18446744073709551615", "18446744073709551616", "-5", "007", ""} {
		f.Add(s, uint32(16))
	}
	f.Fuzz(func(t *testing.T, s string, total uint32) {
		got, err := ParseGuildID(s)
		ref, refErr := strconv.ParseUint(s, 10, 64)
		canonical := refErr == nil && strconv.FormatUint(ref, 10) == s
		if canonical != (err == nil) {
			t.Fatalf("ParseGuildID(%q) err=%v, strconv canonical=%v", s, err, canonical)
		}
		if err != nil {
			return
		}
		if got != ref {
			t.Fatalf("ParseGuildID(%q) = %d, strconv %d", s, got, ref)
		}
		b, _ := new(big.Int).SetString(s, 10)
		b.Rsh(b, 22)
		b.Mod(b, big.NewInt(int64(max(total, 1))))
		if sh := ShardForGuild(got, total); uint64(sh) != b.Uint64() {
			t.Fatalf("ShardForGuild(%d, %d) = %d, big %d", got, total, sh, b.Uint64())
		}
	})
}
