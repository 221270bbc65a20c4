package controller

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store"
)

// Node authentication and network enrollment (docs/security.md).
//
// A node proves itself with its credential; only the credential's SHA-256
// is stored. A netbooted machine gets its credential from its boot script,
// and a script fetch must never take a running node's place, so a script
// carries an *enrollment* credential instead of a rotated one:
//
//   - Enroll refuses a node that is live (its lease runs) and records
//     EventEnrollmentRefused; the node's credential is not touched.
//   - Otherwise it stores a pending enrollment: the new credential's hash,
//     the address the script goes to, and an expiry. The node's current
//     credential keeps working.
//   - The node's first check-in with the enrollment credential, from that
//     same address, before the expiry, while the node is still not live,
//     redeems it: it becomes the node's credential (the kernel keeps using
//     it, as the session credential) and the previous one stops working.
//     Anything else is refused and recorded. Identify requests never
//     redeem one.
//
// USB nodes never enroll: their credential is on the stick.

// Event kinds of network enrollment.
const (
	// EventNodeEnrolled: a netbooted node's first check-in redeemed the
	// enrollment credential its boot script carried.
	EventNodeEnrolled = "node_enrolled"
	// EventEnrollmentRefused: a security event. A script fetch asked to
	// enroll a node that is live, or an enrollment credential was used from
	// another address, after its expiry, or while the node was live.
	EventEnrollmentRefused = "enrollment_refused"
)

// Errors of enrollment. Each wraps ErrBadCredential when a check-in is
// refused, so callers that only know ErrBadCredential answer 401.
var (
	// ErrEnrollmentAddress: an enrollment credential used from an address
	// other than the one its boot script went to.
	ErrEnrollmentAddress = fmt.Errorf("%w: enrollment credential used from another address", ErrBadCredential)
	// ErrEnrollmentExpired: an enrollment credential used after its expiry.
	ErrEnrollmentExpired = fmt.Errorf("%w: enrollment credential expired", ErrBadCredential)
	// ErrEnrollmentLive: an enrollment credential used while the node is
	// live with its previous credential.
	ErrEnrollmentLive = fmt.Errorf("%w: node is live with another credential", ErrBadCredential)
	// ErrEnrollmentOnly: an enrollment credential used for anything but
	// the first check-in (an Identify request).
	ErrEnrollmentOnly = fmt.Errorf("%w: an enrollment credential is only good for the first check-in", ErrBadCredential)
)

// LiveError is returned by Enroll for a node that is live: its lease runs
// until Until, last renewed from Address.
type LiveError struct {
	NodeID  string
	Address string
	Until   time.Time
}

func (e *LiveError) Error() string {
	return fmt.Sprintf("node %s is live (checking in from %s, lease until %s); enrollment refused",
		e.NodeID, e.Address, e.Until.UTC().Format(time.RFC3339))
}

// canonAddr is the text form enrollment compares: an IP without zone,
// IPv4-mapped IPv6 as IPv4; anything unparsable as it is.
func canonAddr(s string) string {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return s
	}
	return a.Unmap().WithZone("").String()
}

// liveLocked reports whether n's lease runs at t. Caller holds mu.
func liveLocked(n *node, t time.Time) bool { return n.live && t.Before(n.deadline) }

// Enroll issues an enrollment credential for node id, whose boot script is
// about to go to addr; it is good for the node's first check-in from addr
// within ttl. The node's current credential stays valid until then. A
// live node is refused with a *LiveError (and EventEnrollmentRefused); an
// unknown one with ErrUnknownNode. The enrollment is stored before the
// credential is returned, so it survives a restart of the controller.
func (c *Controller) Enroll(ctx context.Context, id, addr string, ttl time.Duration) (string, error) {
	if ttl <= 0 {
		return "", fmt.Errorf("%w: enrollment ttl %s", ErrConfig, ttl)
	}
	addr = canonAddr(addr)
	t := c.now()
	c.mu.Lock()
	if n := c.nodes[id]; n != nil && liveLocked(n, t) {
		e := &LiveError{NodeID: id, Address: n.address, Until: n.deadline}
		c.eventLocked(t, EventEnrollmentRefused, id, nil, fmt.Sprintf(
			"boot script fetched from %s while the node is live (last check-in from %s, %s ago); its credential is unchanged. "+
				"A machine that rebooted enrolls once the lease lapses, at %s",
			addr, n.address, t.Sub(n.lastSeen).Round(time.Second), n.deadline.UTC().Format(time.RFC3339)))
		c.mu.Unlock()
		c.log.Warn("enrollment refused: node is live", "node", id, "from", addr, "live_at", e.Address)
		return "", e
	}
	c.mu.Unlock()
	cred, err := NewCredential()
	if err != nil {
		return "", err
	}
	h := HashCredential(cred)
	err = c.st.PutEnrollment(ctx, id, store.Enrollment{CredHash: h[:], Address: addr, IssuedAt: t, Expires: t.Add(ttl)})
	if errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("node %s: %w", id, ErrUnknownNode)
	}
	if err != nil {
		return "", err
	}
	c.log.Info("enrollment issued", "node", id, "to", addr, "expires", t.Add(ttl).UTC().Format(time.RFC3339))
	return cred, nil
}

// Authenticate checks a node's credential in constant time, for requests
// that are not a check-in (Identify): an enrollment credential is refused
// with ErrEnrollmentOnly. A node added to the store by another process is
// picked up here.
func (c *Controller) Authenticate(ctx context.Context, id, cred string) error {
	return c.authenticate(ctx, id, cred, "", false)
}

// AuthenticateCheckin is Authenticate for a check-in from addr, which may
// redeem the node's pending enrollment (see Enroll).
func (c *Controller) AuthenticateCheckin(ctx context.Context, id, cred, addr string) error {
	return c.authenticate(ctx, id, cred, addr, true)
}

// nodeAuth reads a node's stored credential and enrollment; a variable so
// that a test can watch the refused path read it.
var nodeAuth = (*store.Store).NodeAuth

// zeroHash stands in for a hash an unknown node does not have, so that
// the comparisons of a refused request cost the same either way.
var zeroHash [sha256.Size]byte

// authenticate is Authenticate and AuthenticateCheckin.
//
// A node whose credential matches the controller's memory is let in at
// once. Everything else takes one path, whether id names a node or not, so
// a refused request does not tell which node IDs exist (issue 24 measured
// ~370 µs for a known ID and ~490 µs for an unknown one): one read of the
// node's stored credential and pending enrollment (store.NodeAuth, which
// also picks up a node another process added), then both comparisons in
// constant time, then the decision.
func (c *Controller) authenticate(ctx context.Context, id, cred, addr string, checkin bool) error {
	got := HashCredential(cred)
	c.mu.Lock()
	n := c.nodes[id]
	var seen [sha256.Size]byte // the hash compared, to notice a change meanwhile
	if n != nil {
		seen = n.credHash
	}
	ok := n != nil && subtle.ConstantTimeCompare(got[:], seen[:]) == 1
	c.mu.Unlock()
	if ok {
		return nil
	}
	rec, err := nodeAuth(c.st, ctx, id)
	known := err == nil
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	stored, enrollHash := zeroHash[:], zeroHash[:]
	if len(rec.CredHash) == sha256.Size {
		stored = rec.CredHash
	}
	if rec.Enrollment != nil && len(rec.Enrollment.CredHash) == sha256.Size {
		enrollHash = rec.Enrollment.CredHash
	}
	isStored := subtle.ConstantTimeCompare(got[:], stored) == 1
	isEnroll := subtle.ConstantTimeCompare(got[:], enrollHash) == 1
	switch {
	case !known:
		return ErrUnknownNode
	case isStored:
		// The store knows a credential the memory did not (another
		// process added the node, or a rotation is between its store
		// write and its memory write): take it, unless the memory changed
		// since it was compared (an enrollment was redeemed meanwhile:
		// then the memory's value decides).
		c.mu.Lock()
		cur := c.nodes[id]
		switch {
		case cur == nil:
			// DeleteNode may have removed it since the read above: it
			// writes the store under this lock, so a read here decides.
			if _, err := c.st.Node(ctx, id); err != nil {
				c.mu.Unlock()
				if errors.Is(err, store.ErrNotFound) {
					return ErrUnknownNode
				}
				return err
			}
			cur = &node{id: id, createdAt: rec.CreatedAt}
			copy(cur.credHash[:], stored)
			c.nodes[id] = cur
		case n != nil && cur.credHash == seen:
			copy(cur.credHash[:], stored)
		}
		match := subtle.ConstantTimeCompare(got[:], cur.credHash[:]) == 1
		c.mu.Unlock()
		if !match {
			return ErrBadCredential
		}
		return nil
	case isEnroll && rec.Enrollment != nil:
		if !checkin {
			return ErrEnrollmentOnly
		}
		if answersAsFollower(ctx) {
			// Redeeming writes the credential: a leader's work.
			return fmt.Errorf("%w: node %s redeems its enrollment", ErrNotLeader, id)
		}
		return c.redeem(ctx, id, rec.Enrollment, canonAddr(addr))
	}
	return ErrBadCredential
}

// redeem turns node id's pending enrollment e into its credential, for a
// check-in from addr with e's credential (see Enroll).
func (c *Controller) redeem(ctx context.Context, id string, e *store.Enrollment, addr string) error {
	t := c.now()
	var h [sha256.Size]byte
	copy(h[:], e.CredHash)
	refuse := func(err error, detail string) error {
		c.mu.Lock()
		c.eventLocked(t, EventEnrollmentRefused, id, nil, detail)
		c.mu.Unlock()
		c.log.Warn("enrollment credential refused", "node", id, "from", addr, "reason", err)
		return err
	}
	switch {
	case addr != e.Address:
		return refuse(ErrEnrollmentAddress, fmt.Sprintf("enrollment credential used from %s; its boot script went to %s", addr, e.Address))
	case !t.Before(e.Expires):
		return refuse(ErrEnrollmentExpired, fmt.Sprintf("enrollment credential from %s used %s after it expired",
			addr, t.Sub(e.Expires).Round(time.Second)))
	}
	c.mu.Lock()
	n := c.nodes[id]
	created := n == nil
	if created {
		n = &node{id: id, createdAt: e.IssuedAt}
		c.nodes[id] = n
	}
	if n.credHash == h {
		c.mu.Unlock() // a concurrent check-in redeemed it
		return nil
	}
	if liveLocked(n, t) {
		c.eventLocked(t, EventEnrollmentRefused, id, nil, fmt.Sprintf(
			"enrollment credential used from %s while the node is live (checking in from %s); its credential is unchanged", addr, n.address))
		c.mu.Unlock()
		c.log.Warn("enrollment credential refused", "node", id, "from", addr, "reason", ErrEnrollmentLive)
		return ErrEnrollmentLive
	}
	// The store is written with the lock held (one small transaction, once
	// per boot; no store write waits for this lock, so it cannot
	// deadlock): no check-in with the old credential can pass the memory
	// check or make the node live between the decision and the swap.
	err := c.st.CompleteEnrollment(ctx, id, h[:])
	if err == nil {
		n.credHash = h
		c.eventLocked(t, EventNodeEnrolled, id, nil, fmt.Sprintf("first check-in from %s, %s after its boot script",
			addr, t.Sub(e.IssuedAt).Round(time.Millisecond)))
	} else if created && c.nodes[id] == n {
		delete(c.nodes, id) // deleted meanwhile (DeleteNode): leave no empty record
	}
	c.mu.Unlock()
	if errors.Is(err, store.ErrNotFound) {
		return ErrBadCredential // replaced by a newer enrollment meanwhile
	}
	if err != nil {
		return err
	}
	c.log.Info("node enrolled", "node", id, "from", addr)
	return nil
}
