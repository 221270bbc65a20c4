package netns

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
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
	sleeper := n.Command(ctx, "sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	sleeper.Wait()
	list, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(list), n.Name) {
		t.Fatalf("namespace %s still listed after Close", n.Name)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
