package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
)

// The netboot services' tables (schemaV2): discovered and approved MACs,
// their boot timelines and the authoritative DHCP server's leases.

// unixMS is t in Unix milliseconds. Unlike ms it does not map the zero
// time to 0: the netboot tables have always stored t.UnixMilli().
func unixMS(t time.Time) int64 { return t.UnixMilli() }

// NetbootInventory implements inventory.Inventory and inventory.LeaseStore
// over the store. It is safe for concurrent use.
type NetbootInventory struct {
	s *Store
	// MaxDiscovered bounds the discovered machines kept (default
	// inventory.DefaultMaxDiscovered): beyond it Seen records no new MAC.
	MaxDiscovered int
}

// Netboot returns a new view of the netboot services' tables.
func (s *Store) Netboot() *NetbootInventory { return &NetbootInventory{s: s} }

var (
	_ inventory.Inventory  = (*NetbootInventory)(nil)
	_ inventory.LeaseStore = (*NetbootInventory)(nil)
)

// Lookup implements inventory.Inventory.
func (n *NetbootInventory) Lookup(ctx context.Context, mac net.HardwareAddr) (inventory.Node, error) {
	var nd inventory.Node
	var id, cred sql.NullString
	err := n.s.queryRow(ctx, `SELECT state, node_id, credential FROM netboot_nodes WHERE mac = ?`, inventory.MACKey(mac)).
		Scan(&nd.State, &id, &cred)
	if errors.Is(err, sql.ErrNoRows) {
		return inventory.Node{}, inventory.ErrUnknownMAC
	}
	if err != nil {
		return inventory.Node{}, fmt.Errorf("inventory lookup %s: %w", mac, err)
	}
	nd.MAC, nd.ID, nd.Credential = mac, id.String, cred.String
	return nd, nil
}

// Enroll implements inventory.Inventory for tools and tests that run the
// netboot services without a controller: it returns the credential stored
// with the approval (Approve), and refuses a node approved without one.
// `dpxe serve` stores none and enrolls through the controller instead.
func (n *NetbootInventory) Enroll(ctx context.Context, nd inventory.Node, to netip.Addr) (string, error) {
	if nd.Credential == "" {
		return "", fmt.Errorf("inventory: node %s has no stored credential (only dpxe serve enrolls nodes)", nd.ID)
	}
	return nd.Credential, nil
}

// Seen implements inventory.Inventory.
func (n *NetbootInventory) Seen(ctx context.Context, v inventory.Sighting) error {
	fw := v.Firmware
	if fw == "" {
		fw = inventory.FirmwareUnknown
	}
	ip := ""
	if v.IP.IsValid() {
		ip = v.IP.String()
	}
	limit := n.MaxDiscovered
	if limit <= 0 {
		limit = inventory.DefaultMaxDiscovered
	}
	key := inventory.MACKey(v.MAC)
	// A known MAC is updated; a new one is inserted only while the
	// discovered machines are fewer than limit (insertDiscovered).
	r, err := n.s.exec(ctx, `
		UPDATE netboot_nodes SET
			last_seen = ?,
			firmware  = CASE WHEN CAST(? AS TEXT) = 'unknown' THEN firmware ELSE CAST(? AS TEXT) END,
			ip        = CASE WHEN CAST(? AS TEXT) = '' THEN ip ELSE CAST(? AS TEXT) END
		WHERE mac = ?`, unixMS(v.At), string(fw), string(fw), ip, ip, key)
	if err != nil {
		return fmt.Errorf("inventory seen %s: %w", v.MAC, err)
	}
	if c, _ := r.RowsAffected(); c > 0 {
		return nil
	}
	inserted, err := n.insertDiscovered(ctx, key, string(fw), ip, unixMS(v.At), limit)
	if err != nil {
		return fmt.Errorf("inventory seen %s: %w", v.MAC, err)
	}
	if !inserted {
		if _, err := n.Lookup(ctx, v.MAC); err == nil {
			return nil // a concurrent sighting inserted it
		}
		return fmt.Errorf("inventory seen %s: %w", v.MAC, inventory.ErrDiscoveredFull)
	}
	return nil
}

// pgDiscoveredLock is the advisory-lock key that serializes the insertion
// of discovered MACs on PostgreSQL ("dpxn" in ASCII).
const pgDiscoveredLock = 0x6470786e

// insertDiscovered inserts a discovered MAC if fewer than limit are
// discovered, and reports whether it did. The count and the insert are one
// statement: on SQLite, whose writers take turns, two sightings cannot both
// take the last place. On PostgreSQL under READ COMMITTED they could, each
// counting before the other's commit, so there the insert first takes a
// transaction-scoped advisory lock (every process on the database, every
// replica, queues on it); only sightings of new MACs pay for it.
func (n *NetbootInventory) insertDiscovered(ctx context.Context, key, fw, ip string, at int64, limit int) (bool, error) {
	t, err := n.s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer t.Rollback()
	if n.s.dialect == dialectPostgres {
		if _, err := t.exec(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(pgDiscoveredLock)); err != nil {
			return false, err
		}
	}
	r, err := t.exec(ctx, `
		INSERT INTO netboot_nodes (mac, state, firmware, ip, first_seen, last_seen)
		SELECT CAST(? AS TEXT), 'discovered', CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS BIGINT), CAST(? AS BIGINT)
		WHERE (SELECT count(*) FROM netboot_nodes WHERE state = 'discovered') < ?
		ON CONFLICT (mac) DO NOTHING`,
		key, fw, ip, at, at, limit)
	if err != nil {
		return false, err
	}
	c, _ := r.RowsAffected()
	return c > 0, t.Commit()
}

// Record implements inventory.Inventory. Events of a MAC the inventory
// does not hold are dropped, so made-up MACs cannot grow the timelines;
// each MAC keeps its inventory.MaxEventsPerMAC newest events.
func (n *NetbootInventory) Record(ctx context.Context, e inventory.Event) error {
	key := inventory.MACKey(e.MAC)
	r, err := n.s.exec(ctx,
		`INSERT INTO netboot_events (mac, stage, detail, at)
		 SELECT CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS BIGINT)
		 WHERE EXISTS (SELECT 1 FROM netboot_nodes WHERE mac = ?)`,
		key, string(e.Stage), e.Detail, unixMS(e.At), key)
	if err != nil {
		return fmt.Errorf("inventory record %s %s: %w", e.MAC, e.Stage, err)
	}
	if c, _ := r.RowsAffected(); c == 0 {
		return nil
	}
	_, err = n.s.exec(ctx, `
		DELETE FROM netboot_events WHERE mac = ? AND id <= (
			SELECT id FROM netboot_events WHERE mac = ? ORDER BY id DESC LIMIT 1 OFFSET ?)`,
		key, key, inventory.MaxEventsPerMAC)
	if err != nil {
		return fmt.Errorf("inventory prune %s: %w", e.MAC, err)
	}
	return nil
}

// Approve gives mac a node ID, and optionally a credential, so it boots the
// shard kernel (`dpxe nodes approve MAC --id NAME`). A MAC not seen yet is
// created. `dpxe serve` passes no credential: it mints one per boot through
// the controller, which keeps only its hash, so no secret is stored here.
func (n *NetbootInventory) Approve(ctx context.Context, mac net.HardwareAddr, id, credential string, at time.Time) error {
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
	_, err := n.s.exec(ctx, `
		INSERT INTO netboot_nodes (mac, state, node_id, credential, first_seen, last_seen)
		VALUES (?, 'approved', ?, ?, ?, ?)
		ON CONFLICT (mac) DO UPDATE SET state = 'approved', node_id = excluded.node_id,
			credential = excluded.credential`,
		inventory.MACKey(mac), id, cred, unixMS(at), unixMS(at))
	if err != nil {
		return fmt.Errorf("approve %s as %s: %w", mac, id, err)
	}
	return nil
}

// Retire stops mac from booting the kernel; it keeps its record.
func (n *NetbootInventory) Retire(ctx context.Context, mac net.HardwareAddr) error {
	r, err := n.s.exec(ctx, `UPDATE netboot_nodes SET state = 'retired' WHERE mac = ?`, inventory.MACKey(mac))
	if err != nil {
		return fmt.Errorf("retire %s: %w", mac, err)
	}
	if c, _ := r.RowsAffected(); c == 0 {
		return inventory.ErrUnknownMAC
	}
	return nil
}

// Nodes lists every MAC the inventory knows, ordered by MAC.
func (n *NetbootInventory) Nodes(ctx context.Context) ([]inventory.NodeRecord, error) {
	rows, err := n.s.query(ctx, `SELECT mac, state, node_id, credential, firmware, ip,
		first_seen, last_seen FROM netboot_nodes ORDER BY mac`)
	if err != nil {
		return nil, fmt.Errorf("inventory nodes: %w", err)
	}
	defer rows.Close()
	var out []inventory.NodeRecord
	for rows.Next() {
		var r inventory.NodeRecord
		var mac string
		var id, cred sql.NullString
		var first, last int64
		if err := rows.Scan(&mac, &r.State, &id, &cred, &r.Firmware, &r.IP, &first, &last); err != nil {
			return nil, err
		}
		if r.MAC, err = inventory.ParseMAC(mac); err != nil {
			return nil, fmt.Errorf("inventory nodes: stored MAC %q: %w", mac, err)
		}
		r.ID, r.Credential = id.String, cred.String
		r.FirstSeen, r.LastSeen = time.UnixMilli(first), time.UnixMilli(last)
		out = append(out, r)
	}
	return out, rows.Err()
}

// Timeline returns the boot events of mac, oldest first.
func (n *NetbootInventory) Timeline(ctx context.Context, mac net.HardwareAddr) ([]inventory.Event, error) {
	rows, err := n.s.query(ctx,
		`SELECT stage, detail, at FROM netboot_events WHERE mac = ? ORDER BY id`, inventory.MACKey(mac))
	if err != nil {
		return nil, fmt.Errorf("inventory timeline %s: %w", mac, err)
	}
	defer rows.Close()
	var out []inventory.Event
	for rows.Next() {
		e := inventory.Event{MAC: mac}
		var at int64
		if err := rows.Scan(&e.Stage, &e.Detail, &at); err != nil {
			return nil, err
		}
		e.At = time.UnixMilli(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// LastStages returns each MAC's newest timeline event (its MAC, stage and
// detail, without the time), by MACKey, in one query.
func (n *NetbootInventory) LastStages(ctx context.Context) (map[string]inventory.Event, error) {
	rows, err := n.s.query(ctx, `SELECT e.mac, e.stage, e.detail FROM netboot_events e
		JOIN (SELECT mac, MAX(id) AS id FROM netboot_events GROUP BY mac) m ON e.id = m.id`)
	if err != nil {
		return nil, fmt.Errorf("netboot last stages: %w", err)
	}
	defer rows.Close()
	out := map[string]inventory.Event{}
	for rows.Next() {
		var mac string
		var e inventory.Event
		if err := rows.Scan(&mac, &e.Stage, &e.Detail); err != nil {
			return nil, fmt.Errorf("netboot last stages: %w", err)
		}
		e.MAC, _ = inventory.ParseMAC(mac)
		out[mac] = e
	}
	return out, rows.Err()
}

// Leases implements inventory.LeaseStore: every binding and declined
// address, expired ones included; outstanding offers of shared
// allocation (Offer) are not leases.
func (n *NetbootInventory) Leases(ctx context.Context) ([]inventory.Lease, error) {
	rows, err := n.s.query(ctx, `SELECT ip, mac, expiry, declined FROM netboot_leases WHERE offered = 0 ORDER BY ip`)
	if err != nil {
		return nil, fmt.Errorf("inventory leases: %w", err)
	}
	defer rows.Close()
	var out []inventory.Lease
	for rows.Next() {
		var ip, mac string
		var exp, declined int64
		var l inventory.Lease
		if err := rows.Scan(&ip, &mac, &exp, &declined); err != nil {
			return nil, err
		}
		if l.IP, err = netip.ParseAddr(ip); err != nil {
			return nil, fmt.Errorf("inventory leases: stored address %q: %w", ip, err)
		}
		if mac != "" {
			if l.MAC, err = inventory.ParseMAC(mac); err != nil {
				return nil, fmt.Errorf("inventory leases: stored MAC %q: %w", mac, err)
			}
		}
		l.Expiry, l.Declined = time.UnixMilli(exp), declined != 0
		out = append(out, l)
	}
	return out, rows.Err()
}

// PutLease implements inventory.LeaseStore: it stores l, replacing the
// lease of the same address.
func (n *NetbootInventory) PutLease(ctx context.Context, l inventory.Lease) error {
	mac := ""
	if l.MAC != nil {
		mac = inventory.MACKey(l.MAC)
	}
	t, err := n.s.begin(ctx)
	if err != nil {
		return fmt.Errorf("inventory put lease %s: %w", l.IP, err)
	}
	defer t.Rollback()
	// A MAC holds one lease (the unique index of migration 6).
	if mac != "" {
		if _, err := t.exec(ctx, `DELETE FROM netboot_leases WHERE mac = ? AND ip <> ?`, mac, l.IP.String()); err != nil {
			return fmt.Errorf("inventory put lease %s: %w", l.IP, err)
		}
	}
	_, err = t.exec(ctx, `INSERT INTO netboot_leases (ip, mac, expiry, declined) VALUES (?, ?, ?, ?)
		ON CONFLICT (ip) DO UPDATE SET mac = excluded.mac, expiry = excluded.expiry, declined = excluded.declined, offered = 0`,
		l.IP.String(), mac, unixMS(l.Expiry), b2i(l.Declined))
	if err != nil {
		return fmt.Errorf("inventory put lease %s: %w", l.IP, err)
	}
	if err := t.Commit(); err != nil {
		return fmt.Errorf("inventory put lease %s: %w", l.IP, err)
	}
	return nil
}

// DeleteLease implements inventory.LeaseStore.
func (n *NetbootInventory) DeleteLease(ctx context.Context, ip netip.Addr) error {
	if _, err := n.s.exec(ctx, `DELETE FROM netboot_leases WHERE ip = ?`, ip.String()); err != nil {
		return fmt.Errorf("inventory delete lease %s: %w", ip, err)
	}
	return nil
}
