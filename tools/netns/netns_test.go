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

// TestHosts: two hosts on one namespace's bridge reach the bridge's
// address and each other over the bridge, with their own MACs.
func TestHosts(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := New(ctx, netip.MustParsePrefix("10.251.0.1/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	a, err := n.AddHost(ctx, "02:00:00:fb:00:0a", netip.MustParsePrefix("10.251.0.10/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := n.AddHost(ctx, "02:00:00:fb:00:0b", netip.MustParsePrefix("10.251.0.11/24"))
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"10.251.0.1", "10.251.0.11"} {
		if out, err := a.Run(ctx, "busybox", "ping", "-c", "1", "-W", "2", target); err != nil {
			t.Fatalf("ping %s from a host: %v\n%s", target, err, out)
		}
	}
	if out, _ := b.Run(ctx, "ip", "-br", "link", "show", HostIface); !strings.Contains(out, "02:00:00:fb:00:0b") {
		t.Fatalf("host MAC: %s", out)
	}
	name := b.Name
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	list, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(list), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			t.Fatalf("host namespace %s left behind", name)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}
