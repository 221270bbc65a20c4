package netns

import (
	"context"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestNamespaceLifecycle(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	n, err := New(ctx, netip.MustParsePrefix("10.250.0.1/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := n.AddTap(ctx, "tap0"); err != nil {
		t.Fatal(err)
	}
	out, err := n.Run(ctx, "ip", "-br", "link")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "br0") || !strings.Contains(out, "tap0") {
		t.Fatalf("links in namespace:\n%s", out)
	}
	if out, _ := n.Run(ctx, "ip", "-br", "addr", "show", "br0"); !strings.Contains(out, "10.250.0.1/24") {
		t.Fatalf("bridge address: %s", out)
	}
	// A process left running inside is killed by Close.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sleeper := n.Command(sctx, "sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(sleeper.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out, _ := exec.Command("ip", "netns", "pids", n.Name).Output()
		if strings.Contains(" "+strings.Join(strings.Fields(string(out)), " ")+" ", " "+pid+" ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process never entered the namespace")
		}
	}
	start := time.Now()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	sleeper.Wait()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close left the process running for %s", took)
	}
	list, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(list), n.Name) {
		t.Fatalf("namespace %s still listed after Close", n.Name)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
