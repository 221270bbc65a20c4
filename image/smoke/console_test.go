package smoke

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestConsole(t *testing.T) {
	c := newConsole(time.Now().Add(-time.Second))
	c.Write([]byte("Discord-PXE shard kernel 0.1.0\r\nboot: bi"))
	if _, ok := c.At("boot: bios"); ok {
		t.Error("a line was found before its end arrived")
	}
	c.Write([]byte("os\r\nselftest: pass\r\n"))
	at, ok := c.At("selftest: pass")
	if !ok || at < time.Second || at > time.Minute {
		t.Errorf("At = %v %v, want about 1 s after start", at, ok)
	}
	if l, ok := c.Line("boot: "); !ok || l != "boot: bios" {
		t.Errorf("Line = %q %v", l, ok)
	}
	if c.String() != "Discord-PXE shard kernel 0.1.0\r\nboot: bios\r\nselftest: pass\r\n" {
		t.Errorf("String = %q", c.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Wait(ctx, "never"); err == nil {
		t.Error("Wait for a line that never comes returned no error")
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		c.Write([]byte("shard 0: READY session abc\n"))
	}()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if l, err := c.Wait(ctx2, "READY"); err != nil || l != "shard 0: READY session abc" {
		t.Errorf("Wait = %q, %v", l, err)
	}
}

func TestTail(t *testing.T) {
	serial := "\x1b[2J\x1b[01;01Hfirst\r\n\r\n  \x1b[1m\x1b[37mbold\x1b[0m text\x07\r\nlast\n"
	got := Tail(serial, 2)
	if strings.Join(got, "|") != "bold text|last" {
		t.Errorf("Tail = %q", got)
	}
	if got := Tail(serial, 10); strings.Join(got, "|") != "first|bold text|last" {
		t.Errorf("Tail(10) = %q", got)
	}
	if Tail("", 3) != nil {
		t.Error("Tail of nothing is not empty")
	}
}
