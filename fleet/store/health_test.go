package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
)

// TestCheckWritable: a writable store passes and keeps no probe row; a
// closed one fails, naming the store.
func TestCheckWritable(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "dpxe.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckWritable(ctx); err != nil {
		t.Fatalf("writable store: %v", err)
	}
	if _, err := s.Setting(ctx, healthProbeKey); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the probe row stayed: %v", err)
	}
	s.Close()
	if err := s.CheckWritable(ctx); err == nil {
		t.Fatal("closed store passed")
	}
}
