package natscallout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Subjects of the system account's monitoring and kick services
// (nats-server events.go): a ping every server answers, and the kick of
// one client of one server, by connection ID.
const (
	connzPingSubject = "$SYS.REQ.SERVER.PING.CONNZ"
	connzSubject     = "$SYS.REQ.SERVER.%s.CONNZ"
	kickSubject      = "$SYS.REQ.SERVER.%s.KICK"
)

// Sweep bounds.
const (
	// PingTimeout bounds the wait for the servers' connection lists: a
	// server that does not answer in time (one being restarted) is swept
	// at the next Sweep.
	PingTimeout = time.Second
	// connzPage is how many connections one list request asks for.
	connzPage = 1024
	// maxPages bounds the pages read from one server.
	maxPages = 64
)

// apiError is a system service's error answer.
type apiError struct {
	Code        int    `json:"code"`
	Description string `json:"description"`
}

func (e *apiError) String() string { return fmt.Sprintf("%d %s", e.Code, e.Description) }

// serverInfo is the part of a system answer naming its server.
type serverInfo struct {
	Name string `json:"name"`
	ID   string `json:"id"`
}

// connz is one server's answer to a connection list request.
type connz struct {
	Server serverInfo `json:"server"`
	Data   struct {
		Conns []struct {
			CID  uint64 `json:"cid"`
			User string `json:"authorized_user"`
		} `json:"connections"`
		Total  int `json:"total"`
		Offset int `json:"offset"`
	} `json:"data"`
	Error *apiError `json:"error"`
}

func decodeJSON(b []byte, v any) error { return json.Unmarshal(b, v) }

// Conn is one client connection of the cluster, as Sweep sees it.
type Conn struct {
	Server    string // the server's name
	ServerID  string // its ID, where kicks go
	CID       uint64 // the connection's ID on that server
	Name      string // authorized user (ConnName for callout users)
	User, Tag string // SplitConnName of Name
	Tagged    bool   // Name carries a tag: a user this service let in
}

// Conns lists the open connections of account on every server that
// answers within PingTimeout, through sys, a connection of a user of the
// system account. expect is how many servers there are: the wait ends
// when that many have answered (0: at PingTimeout).
func Conns(ctx context.Context, sys *nats.Conn, account string, expect int) ([]Conn, error) {
	req := func(offset int) []byte {
		b, _ := json.Marshal(map[string]any{"acc": account, "auth": true, "limit": connzPage, "offset": offset})
		return b
	}
	inbox := sys.NewRespInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := sys.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := sys.PublishRequest(connzPingSubject, inbox, req(0)); err != nil {
		return nil, err
	}
	timer := time.NewTimer(PingTimeout)
	defer timer.Stop()
	var out []Conn
	answered := map[string]bool{}
	var firstErr error
	for expect <= 0 || len(answered) < expect {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
		case m = <-ch:
		}
		if m == nil {
			break
		}
		var z connz
		if err := decodeJSON(m.Data, &z); err != nil {
			firstErr = errors.Join(firstErr, fmt.Errorf("connz: %w", err))
			continue
		}
		if z.Error != nil {
			firstErr = errors.Join(firstErr, fmt.Errorf("connz of %s: %s", z.Server.Name, z.Error))
			continue
		}
		if answered[z.Server.ID] {
			continue
		}
		answered[z.Server.ID] = true
		out = appendConns(out, &z)
		// The rest of a long list, from that server alone.
		seen := len(z.Data.Conns)
		for page := 1; seen < z.Data.Total && len(z.Data.Conns) > 0 && page < maxPages; page++ {
			rctx, cancel := context.WithTimeout(ctx, PingTimeout)
			rm, err := sys.RequestWithContext(rctx, fmt.Sprintf(connzSubject, z.Server.ID), req(seen))
			cancel()
			if err != nil {
				firstErr = errors.Join(firstErr, fmt.Errorf("connz of %s from %d: %w", z.Server.Name, seen, err))
				break
			}
			z = connz{}
			if err := decodeJSON(rm.Data, &z); err != nil || z.Error != nil {
				firstErr = errors.Join(firstErr, fmt.Errorf("connz of %s from %d: %v %v", z.Server.Name, seen, err, z.Error))
				break
			}
			out = appendConns(out, &z)
			seen += len(z.Data.Conns)
		}
	}
	if len(answered) == 0 && firstErr == nil {
		firstErr = fmt.Errorf("no server answered %s within %v (is the user in the system account?)", connzPingSubject, PingTimeout)
	}
	if len(answered) == 0 {
		return nil, firstErr
	}
	return out, nil
}

func appendConns(out []Conn, z *connz) []Conn {
	for _, c := range z.Data.Conns {
		u, tag, ok := SplitConnName(c.User)
		out = append(out, Conn{Server: z.Server.Name, ServerID: z.Server.ID, CID: c.CID, Name: c.User, User: u, Tag: tag, Tagged: ok})
	}
	return out
}

// Kick closes connection cid of server serverID (the client may
// reconnect and is authenticated again).
func Kick(ctx context.Context, sys *nats.Conn, serverID string, cid uint64) error {
	b, _ := json.Marshal(map[string]uint64{"cid": cid})
	rctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	m, err := sys.RequestWithContext(rctx, fmt.Sprintf(kickSubject, serverID), b)
	if err != nil {
		return fmt.Errorf("kick %d on %s: %w", cid, serverID, err)
	}
	var r struct {
		Error *apiError `json:"error"`
	}
	if err := decodeJSON(m.Data, &r); err != nil {
		return fmt.Errorf("kick %d on %s: %w", cid, serverID, err)
	}
	if r.Error != nil {
		return fmt.Errorf("kick %d on %s: %s", cid, serverID, r.Error)
	}
	return nil
}

// Sweep disconnects every connection of the Service's account whose
// user would now get other permissions than its name's tag says, or may
// not connect at all: a node whose lease lapsed or whose shards changed,
// a removed worker. Connections named without a tag (users of the
// broker's configuration) are left alone. It returns the users it
// disconnected; expect is as for Conns.
func (s *Service) Sweep(ctx context.Context, sys *nats.Conn, expect int) ([]string, error) {
	conns, err := Conns(ctx, sys, s.cfg.Account, expect)
	if err != nil {
		return nil, err
	}
	var out []string
	var errs error
	for _, c := range conns {
		if !c.Tagged {
			continue
		}
		if tag, ok := s.cfg.Auth.Current(c.User); ok && (tag == c.Tag || tag == "") {
			continue // unchanged, or not a user of the Decider
		}
		if err := Kick(ctx, sys, c.ServerID, c.CID); err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		out = append(out, c.User)
	}
	return out, errs
}
