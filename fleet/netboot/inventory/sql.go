package inventory

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// Migrations is the schema of SQL, as ordered statements. The store applies
// them after its own; each is applied once, in order, and never edited
// after release (add a new statement instead).
var Migrations = []string{
	`CREATE TABLE netboot_nodes (
		mac        TEXT PRIMARY KEY,            -- MACKey form, 52-54-00-12-34-56
		state      TEXT NOT NULL CHECK (state IN ('discovered','approved','retired')),
		node_id    TEXT UNIQUE,                 -- set on approval
		credential TEXT,                        -- set on approval
		firmware   TEXT NOT NULL DEFAULT 'unknown',
		ip         TEXT NOT NULL DEFAULT '',
		first_seen INTEGER NOT NULL,            -- unix milliseconds
		last_seen  INTEGER NOT NULL
	)`,
	`CREATE TABLE netboot_events (
		id     INTEGER PRIMARY KEY AUTOINCREMENT,
		mac    TEXT NOT NULL,
		stage  TEXT NOT NULL,
		detail TEXT NOT NULL DEFAULT '',
		at     INTEGER NOT NULL                 -- unix milliseconds
	)`,
	`CREATE INDEX netboot_events_mac ON netboot_events (mac, id)`,
	`CREATE TABLE netboot_leases (
		ip       TEXT PRIMARY KEY,
		mac      TEXT NOT NULL DEFAULT '',      -- '' for a declined address
		expiry   INTEGER NOT NULL,              -- unix milliseconds
		declined INTEGER NOT NULL DEFAULT 0
	)`,
}

// MaxEventsPerMAC bounds the stored timeline of one MAC; older events are
// pruned so a node stuck in a boot loop cannot fill the disk.
const MaxEventsPerMAC = 500

// DefaultMaxDiscovered bounds the discovered (not approved, not retired)
// machines SQL keeps when SQL.MaxDiscovered is zero.
const DefaultMaxDiscovered = 512

// SQL is the SQLite implementation of Inventory and LeaseStore. It is safe
// for concurrent use as far as the *sql.DB is.
type SQL struct {
	DB *sql.DB
	// MaxDiscovered bounds the discovered machines kept (default
	// DefaultMaxDiscovered): beyond it Seen records no new MAC.
	MaxDiscovered int
}

// Migrate applies Migrations to db in one transaction. The store does this
// itself with its migration list; Migrate is for tests and tools that open
// a database of their own.
func Migrate(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for i, stmt := range Migrations {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("inventory migration %d: %w", i, err)
		}
	}
	return tx.Commit()
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// Lookup implements Inventory.
func (s *SQL) Lookup(ctx context.Context, mac net.HardwareAddr) (Node, error) {
	var n Node
	var id, cred sql.NullString
	err := s.DB.QueryRowContext(ctx,
		`SELECT state, node_id, credential FROM netboot_nodes WHERE mac = ?`, MACKey(mac)).
		Scan(&n.State, &id, &cred)
	if errors.Is(err, sql.ErrNoRows) {
		return Node{}, ErrUnknownMAC
	}
	if err != nil {
		return Node{}, fmt.Errorf("inventory lookup %s: %w", mac, err)
	}
	n.MAC, n.ID, n.Credential = mac, id.String, cred.String
	return n, nil
}

// Enroll implements Inventory for tools and tests that run the netboot
// services without a controller: it returns the credential stored with
// the approval (Approve), and refuses a node approved without one.
// `dpxe serve` stores none and enrolls through the controller instead.
func (s *SQL) Enroll(ctx context.Context, n Node, to netip.Addr) (string, error) {
	if n.Credential == "" {
		return "", fmt.Errorf("inventory: node %s has no stored credential (only dpxe serve enrolls nodes)", n.ID)
	}
	return n.Credential, nil
}

// Seen implements Inventory.
func (s *SQL) Seen(ctx context.Context, v Sighting) error {
	fw := v.Firmware
	if fw == "" {
		fw = FirmwareUnknown
	}
	ip := ""
	if v.IP.IsValid() {
		ip = v.IP.String()
	}
	max := s.MaxDiscovered
	if max <= 0 {
		max = DefaultMaxDiscovered
	}
	key := MACKey(v.MAC)
	// A known MAC is updated; a new one is inserted only while the
	// discovered machines are fewer than max (one statement, so two
	// sightings cannot both take the last place).
	r, err := s.DB.ExecContext(ctx, `
		UPDATE netboot_nodes SET
			last_seen = ?,
			firmware  = CASE WHEN ? = 'unknown' THEN firmware ELSE ? END,
			ip        = CASE WHEN ? = '' THEN ip ELSE ? END
		WHERE mac = ?`, ms(v.At), string(fw), string(fw), ip, ip, key)
	if err != nil {
		return fmt.Errorf("inventory seen %s: %w", v.MAC, err)
	}
	if n, _ := r.RowsAffected(); n > 0 {
		return nil
	}
	r, err = s.DB.ExecContext(ctx, `
		INSERT INTO netboot_nodes (mac, state, firmware, ip, first_seen, last_seen)
		SELECT ?, 'discovered', ?, ?, ?, ?
		WHERE (SELECT count(*) FROM netboot_nodes WHERE state = 'discovered') < ?
		ON CONFLICT (mac) DO NOTHING`,
		key, string(fw), ip, ms(v.At), ms(v.At), max)
	if err != nil {
		return fmt.Errorf("inventory seen %s: %w", v.MAC, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		if _, err := s.Lookup(ctx, v.MAC); err == nil {
			return nil // a concurrent sighting inserted it
		}
		return fmt.Errorf("inventory seen %s: %w", v.MAC, ErrDiscoveredFull)
	}
	return nil
}

// Record implements Inventory. Events of a MAC the inventory does not hold
// are dropped, so made-up MACs cannot grow the timelines.
func (s *SQL) Record(ctx context.Context, e Event) error {
	key := MACKey(e.MAC)
	r, err := s.DB.ExecContext(ctx,
		`INSERT INTO netboot_events (mac, stage, detail, at)
		 SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM netboot_nodes WHERE mac = ?)`,
		key, string(e.Stage), e.Detail, ms(e.At), key)
	if err != nil {
		return fmt.Errorf("inventory record %s %s: %w", e.MAC, e.Stage, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return nil
	}
	_, err = s.DB.ExecContext(ctx, `
		DELETE FROM netboot_events WHERE mac = ? AND id <= (
			SELECT id FROM netboot_events WHERE mac = ? ORDER BY id DESC LIMIT 1 OFFSET ?)`,
		key, key, MaxEventsPerMAC)
	if err != nil {
		return fmt.Errorf("inventory prune %s: %w", e.MAC, err)
	}
	return nil
}

// Approve gives mac a node ID, and optionally a credential, so it boots the
// shard kernel (`dpxe nodes approve MAC --id NAME`). A MAC not seen yet is
// created. `dpxe serve` passes no credential: it mints one per boot through
// the controller, which keeps only its hash, so no secret is stored here.
func (s *SQL) Approve(ctx context.Context, mac net.HardwareAddr, id, credential string, at time.Time) error {
	if err := appliance.ValidateNodeID(id); err != nil {
		return fmt.Errorf("approve %s: %w", mac, err)
	}
	var cred sql.NullString
	if credential != "" {
		if err := appliance.ValidateCredential(credential); err != nil {
			return fmt.Errorf("approve %s: %w", mac, err)
		}
		cred = sql.NullString{String: credential, Valid: true}
	}
	_, err := s.DB.ExecContext(ctx, `
		INSERT INTO netboot_nodes (mac, state, node_id, credential, first_seen, last_seen)
		VALUES (?, 'approved', ?, ?, ?, ?)
		ON CONFLICT (mac) DO UPDATE SET state = 'approved', node_id = excluded.node_id,
			credential = excluded.credential`,
		MACKey(mac), id, cred, ms(at), ms(at))
	if err != nil {
		return fmt.Errorf("approve %s as %s: %w", mac, id, err)
	}
	return nil
}

// Retire stops mac from booting the kernel; it keeps its record.
func (s *SQL) Retire(ctx context.Context, mac net.HardwareAddr) error {
	r, err := s.DB.ExecContext(ctx, `UPDATE netboot_nodes SET state = 'retired' WHERE mac = ?`, MACKey(mac))
	if err != nil {
		return fmt.Errorf("retire %s: %w", mac, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrUnknownMAC
	}
	return nil
}

// NodeRecord is one row of the inventory, for listings.
type NodeRecord struct {
	Node
	Firmware            Firmware
	IP                  string
	FirstSeen, LastSeen time.Time
}

// Nodes lists every MAC the inventory knows, ordered by MAC.
func (s *SQL) Nodes(ctx context.Context) ([]NodeRecord, error) {
	rows, err := s.DB.QueryContext(ctx, `SELECT mac, state, node_id, credential, firmware, ip,
		first_seen, last_seen FROM netboot_nodes ORDER BY mac`)
	if err != nil {
		return nil, fmt.Errorf("inventory nodes: %w", err)
	}
	defer rows.Close()
	var out []NodeRecord
	for rows.Next() {
		var r NodeRecord
		var mac string
		var id, cred sql.NullString
		var first, last int64
		if err := rows.Scan(&mac, &r.State, &id, &cred, &r.Firmware, &r.IP, &first, &last); err != nil {
			return nil, err
		}
		if r.MAC, err = ParseMAC(mac); err != nil {
			return nil, fmt.Errorf("inventory nodes: stored MAC %q: %w", mac, err)
		}
		r.ID, r.Credential = id.String, cred.String
		r.FirstSeen, r.LastSeen = time.UnixMilli(first), time.UnixMilli(last)
		out = append(out, r)
	}
	return out, rows.Err()
}

// Timeline returns the boot events of mac, oldest first.
func (s *SQL) Timeline(ctx context.Context, mac net.HardwareAddr) ([]Event, error) {
	rows, err := s.DB.QueryContext(ctx,
		`SELECT stage, detail, at FROM netboot_events WHERE mac = ? ORDER BY id`, MACKey(mac))
	if err != nil {
		return nil, fmt.Errorf("inventory timeline %s: %w", mac, err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		e := Event{MAC: mac}
		var at int64
		if err := rows.Scan(&e.Stage, &e.Detail, &at); err != nil {
			return nil, err
		}
		e.At = time.UnixMilli(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// Leases implements LeaseStore.
func (s *SQL) Leases(ctx context.Context) ([]Lease, error) {
	rows, err := s.DB.QueryContext(ctx, `SELECT ip, mac, expiry, declined FROM netboot_leases ORDER BY ip`)
	if err != nil {
		return nil, fmt.Errorf("inventory leases: %w", err)
	}
	defer rows.Close()
	var out []Lease
	for rows.Next() {
		var ip, mac string
		var exp int64
		var l Lease
		if err := rows.Scan(&ip, &mac, &exp, &l.Declined); err != nil {
			return nil, err
		}
		if l.IP, err = netip.ParseAddr(ip); err != nil {
			return nil, fmt.Errorf("inventory leases: stored address %q: %w", ip, err)
		}
		if mac != "" {
			if l.MAC, err = ParseMAC(mac); err != nil {
				return nil, fmt.Errorf("inventory leases: stored MAC %q: %w", mac, err)
			}
		}
		l.Expiry = time.UnixMilli(exp)
		out = append(out, l)
	}
	return out, rows.Err()
}

// PutLease implements LeaseStore.
func (s *SQL) PutLease(ctx context.Context, l Lease) error {
	mac := ""
	if l.MAC != nil {
		mac = MACKey(l.MAC)
	}
	_, err := s.DB.ExecContext(ctx, `INSERT OR REPLACE INTO netboot_leases (ip, mac, expiry, declined)
		VALUES (?, ?, ?, ?)`, l.IP.String(), mac, ms(l.Expiry), l.Declined)
	if err != nil {
		return fmt.Errorf("inventory put lease %s: %w", l.IP, err)
	}
	return nil
}

// DeleteLease implements LeaseStore.
func (s *SQL) DeleteLease(ctx context.Context, ip netip.Addr) error {
	if _, err := s.DB.ExecContext(ctx, `DELETE FROM netboot_leases WHERE ip = ?`, ip.String()); err != nil {
		return fmt.Errorf("inventory delete lease %s: %w", ip, err)
	}
	return nil
}

var (
	_ Inventory  = (*SQL)(nil)
	_ LeaseStore = (*SQL)(nil)
)
