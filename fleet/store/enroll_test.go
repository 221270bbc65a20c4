package store

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

func TestEnrollmentLifecycle(t *testing.T) { pgtest.Each(t, enrollmentLifecycle) }

func enrollmentLifecycle(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn)
	defer s.Close()
	old, enr := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	at := time.UnixMilli(1_700_000_000_000).UTC()
	if err := s.PutEnrollment(ctx, "ghost", Enrollment{CredHash: enr, Address: "10.0.0.5", IssuedAt: at, Expires: at}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("enrollment of an unknown node: %v", err)
	}
	if _, err := s.NodeAuth(ctx, "ghost"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("NodeAuth of an unknown node: %v", err)
	}
	if err := s.CreateNode(ctx, "n1", old, at); err != nil {
		t.Fatal(err)
	}
	a, err := s.NodeAuth(ctx, "n1")
	if err != nil || !bytes.Equal(a.CredHash, old) || a.Enrollment != nil {
		t.Fatalf("before enrollment: %+v %v", a, err)
	}
	for _, addr := range []string{"10.0.0.4", "10.0.0.5"} { // the newer one replaces the older
		if err := s.PutEnrollment(ctx, "n1", Enrollment{CredHash: enr, Address: addr, IssuedAt: at, Expires: at.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	a, _ = s.NodeAuth(ctx, "n1")
	if a.Enrollment == nil || !bytes.Equal(a.Enrollment.CredHash, enr) || a.Enrollment.Address != "10.0.0.5" ||
		!a.Enrollment.Expires.Equal(at.Add(time.Minute)) || !bytes.Equal(a.CredHash, old) {
		t.Fatalf("pending: %+v %+v", a, a.Enrollment)
	}
	if err := s.CompleteEnrollment(ctx, "n1", old); !errors.Is(err, ErrNotFound) {
		t.Fatalf("completing with another hash: %v", err)
	}
	if err := s.CompleteEnrollment(ctx, "n1", enr); err != nil {
		t.Fatal(err)
	}
	a, _ = s.NodeAuth(ctx, "n1")
	if !bytes.Equal(a.CredHash, enr) || a.Enrollment != nil {
		t.Fatalf("after: %+v", a)
	}
	if err := s.CompleteEnrollment(ctx, "n1", enr); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an enrollment is redeemed once: %v", err)
	}
}
