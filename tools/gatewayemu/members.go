package gatewayemu

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Request Guild Members (op 8) and its answer, GUILD_MEMBERS_CHUNK (Discord
// docs, gateway-events "Request Guild Members" and "Guild Members Chunk";
// research gateway-protocol-and-sharding.md §1.11).

// Limits of Request Guild Members.
const (
	// MembersPerChunk is the most members one GUILD_MEMBERS_CHUNK carries.
	MembersPerChunk = 1000
	// MaxMemberUserIDs is the most user_ids one request may name: the cap
	// libraries enforce (twilight-model's RequestGuildMembers builder);
	// Discord's docs do not state one.
	MaxMemberUserIDs = 100
	// MaxMemberNonceBytes is the longest nonce Discord echoes; a longer
	// one is ignored (the chunks carry none).
	MaxMemberNonceBytes = 32
)

// requestMembersData is op 8's `d`. guild_id and user_ids stay raw: a
// snowflake may be a string or an integer, user_ids one or an array.
type requestMembersData struct {
	GuildID   json.RawMessage `json:"guild_id"`
	Query     *string         `json:"query"`
	Limit     *int            `json:"limit"`
	Presences *bool           `json:"presences"`
	UserIDs   json.RawMessage `json:"user_ids"`
	Nonce     *string         `json:"nonce"`
}

// memberRequest is a validated op 8.
type memberRequest struct {
	Guild uint64
	// Query is the username prefix; nil when UserIDs is used.
	Query *string
	// Limit is the most members to answer a Query with; 0 is no limit.
	Limit     int
	Presences bool
	UserIDs   []uint64
	// Nonce is echoed in every chunk when HasNonce.
	Nonce    string
	HasNonce bool
}

// all reports whether the request asks for every member (query "" and
// limit 0), the kind Discord limits to one per guild per 30 s.
func (r memberRequest) all() bool { return r.Query != nil && *r.Query == "" && r.Limit == 0 }

// parseSnowflake reads a snowflake given as a decimal string or an integer.
func parseSnowflake(raw json.RawMessage) (uint64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, err
		}
		raw = []byte(s)
	}
	id, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("%.40q is not a snowflake", raw)
	}
	return id, nil
}

// parseMemberRequest validates op 8's `d`: guild_id a snowflake (or an
// array of one); exactly
// one of query (with limit) and user_ids (one snowflake or up to 100);
// limit >= 0; presences a boolean; nonce a string (over 32 bytes it is
// ignored, as Discord does). Unknown fields are refused unless lenient.
// Every error wraps ErrInvalidPayload and names the field.
func parseMemberRequest(raw json.RawMessage, lenient bool) (memberRequest, error) {
	var r memberRequest
	var d requestMembersData
	if err := decodeStrict(raw, &d, lenient); err != nil {
		return r, fmt.Errorf("Request Guild Members: %w", err)
	}
	bad := func(field, why string, args ...any) (memberRequest, error) {
		return memberRequest{}, fmt.Errorf("%w: Request Guild Members %s: %s", ErrInvalidPayload, field, fmt.Sprintf(why, args...))
	}
	if len(d.GuildID) == 0 || string(d.GuildID) == "null" {
		return bad("guild_id", "missing")
	}
	gid := bytes.TrimSpace(d.GuildID)
	if gid[0] == '[' {
		// An array of one guild, as older API versions allowed and
		// libraries still send (discordgo v0.29.0); several are refused.
		var list []json.RawMessage
		if err := json.Unmarshal(gid, &list); err != nil || len(list) != 1 {
			return bad("guild_id", "an array must hold exactly one snowflake, got %.60s", gid)
		}
		gid = list[0]
	}
	g, err := parseSnowflake(gid)
	if err != nil {
		return bad("guild_id", "%v", err)
	}
	r.Guild = g
	hasIDs := len(d.UserIDs) > 0 && string(d.UserIDs) != "null"
	switch {
	case d.Query == nil && !hasIDs:
		return bad("query", "one of query and user_ids is required")
	case d.Query != nil && hasIDs:
		return bad("user_ids", "query and user_ids exclude each other")
	case d.Query != nil && d.Limit == nil:
		return bad("limit", "required with query")
	case d.Limit != nil && *d.Limit < 0:
		return bad("limit", "%d < 0", *d.Limit)
	}
	r.Query = d.Query
	if d.Limit != nil {
		r.Limit = *d.Limit
	}
	if hasIDs {
		ids := bytes.TrimSpace(d.UserIDs)
		var list []json.RawMessage
		if ids[0] == '[' {
			if err := json.Unmarshal(ids, &list); err != nil {
				return bad("user_ids", "%v", err)
			}
		} else {
			list = []json.RawMessage{ids}
		}
		if len(list) == 0 || len(list) > MaxMemberUserIDs {
			return bad("user_ids", "%d IDs, want 1..%d", len(list), MaxMemberUserIDs)
		}
		for i, v := range list {
			id, err := parseSnowflake(v)
			if err != nil {
				return bad(fmt.Sprintf("user_ids[%d]", i), "%v", err)
			}
			r.UserIDs = append(r.UserIDs, id)
		}
	}
	if d.Presences != nil {
		r.Presences = *d.Presences
	}
	if d.Nonce != nil && len(*d.Nonce) <= MaxMemberNonceBytes {
		r.Nonce, r.HasNonce = *d.Nonce, true
	}
	return r, nil
}

// requestMembers handles op 8 on a ready connection.
func (c *conn) requestMembers(raw json.RawMessage) {
	e := c.e
	req, err := parseMemberRequest(raw, e.opts.AllowUnknownFields)
	if err != nil {
		c.fail(KindInvalidPayload, CloseUnknownOpcode, err.Error())
		return
	}
	e.mu.Lock()
	s := c.sess
	e.mu.Unlock()
	if s == nil {
		return // op 9 or a close raced with the request
	}
	if req.all() && s.intents&IntentGuildMembers == 0 {
		c.fail(KindInvalidPayload, CloseUnknownOpcode, "Request Guild Members for every member (query \"\", limit 0) needs the GUILD_MEMBERS intent")
		return
	}
	if s.intents&IntentGuildPresences == 0 {
		req.Presences = false // Discord: "otherwise, it will always be false"
	}
	s.mu.Lock()
	owned := slices.Contains(s.guilds, req.Guild) && !s.removed[req.Guild]
	s.mu.Unlock()
	if !owned {
		e.violate(Violation{Kind: KindMembersWrongGuild, Shard: shardPtr(s.shard[0], s.shard[1]), Session: s.id, Conn: c.id,
			Detail: fmt.Sprintf("Request Guild Members for guild %d, which shard [%d, %d] does not hold", req.Guild, s.shard[0], s.shard[1])})
		return
	}
	if req.all() {
		now := e.opts.Now()
		e.mu.Lock()
		last, seen := e.memberRequests[req.Guild]
		limited := seen && now.Sub(last) < e.opts.MemberRequestWindow
		if !limited {
			e.memberRequests[req.Guild] = now
		}
		e.mu.Unlock()
		if limited {
			retry := last.Add(e.opts.MemberRequestWindow).Sub(now)
			e.violate(Violation{Kind: KindMembersRateLimited, Shard: shardPtr(s.shard[0], s.shard[1]), Session: s.id, Conn: c.id,
				Detail: fmt.Sprintf("every member of guild %d requested again after %v (one per %v); retry after %v",
					req.Guild, now.Sub(last).Round(time.Millisecond), e.opts.MemberRequestWindow, retry.Round(time.Millisecond))})
			meta := map[string]any{"guild_id": snowflake(req.Guild)}
			if req.HasNonce {
				meta["nonce"] = req.Nonce
			}
			e.dispatch(s, "RATE_LIMITED", map[string]any{"opcode": OpRequestGuildMembers, "retry_after": retry.Seconds(), "meta": meta})
			return
		}
	}
	// A large answer is written off the read loop, so heartbeats are read
	// meanwhile. Answers go out in request order: each waits for the one
	// before it (lastMembers is only touched by the read loop).
	prev, done := c.lastMembers, make(chan struct{})
	c.lastMembers = done
	go func() {
		defer close(done)
		if prev != nil {
			<-prev
		}
		e.sendMemberChunks(s, req)
	}()
}

// matchMembers returns the indices of guild g's members that answer req and
// the requested user IDs that are not members.
func (o *Options) matchMembers(g uint64, req memberRequest) (found []int, notFound []uint64) {
	if req.Query == nil {
		for _, id := range req.UserIDs {
			i := o.memberIndex(g, id)
			if i < 0 {
				notFound = append(notFound, id)
				continue
			}
			found = append(found, i)
		}
		return found, notFound
	}
	q := strings.ToLower(*req.Query)
	for i := 0; i < o.GuildMembers; i++ {
		if req.Limit > 0 && len(found) == req.Limit {
			break
		}
		if _, name := o.memberUser(g, i); strings.HasPrefix(name, q) {
			found = append(found, i)
		}
	}
	return found, notFound
}

// memberIndex returns the index of user id among guild g's members, or -1.
func (o *Options) memberIndex(g uint64, id uint64) int {
	switch id {
	case applicationID:
		return 0
	case authorID:
		return 1
	}
	i := int(id>>22) - memberIDBase
	if i < 2 || i >= o.GuildMembers {
		return -1
	}
	if got, _ := o.memberUser(g, i); got != id {
		return -1
	}
	return i
}

// sendMemberChunks dispatches the GUILD_MEMBERS_CHUNKs answering req: up to
// 1000 members each, chunk_index from 0 to chunk_count-1, at least one
// chunk (empty when nothing matched), not_found in the first.
func (e *Emulator) sendMemberChunks(s *session, req memberRequest) {
	found, notFound := e.opts.matchMembers(req.Guild, req)
	count := max(1, (len(found)+MembersPerChunk-1)/MembersPerChunk)
	joined := s.created.UTC().Format(time.RFC3339Nano)
	g := snowflake(req.Guild)
	for k := 0; k < count; k++ {
		part := found[min(k*MembersPerChunk, len(found)):min((k+1)*MembersPerChunk, len(found))]
		b := make([]byte, 0, 64+len(part)*260)
		b = append(b, `{"guild_id":"`+g+`","members":[`...)
		for j, i := range part {
			if j > 0 {
				b = append(b, ',')
			}
			b = e.opts.appendMember(b, req.Guild, i, joined)
		}
		b = append(b, `],"chunk_index":`...)
		b = strconv.AppendInt(b, int64(k), 10)
		b = append(b, `,"chunk_count":`...)
		b = strconv.AppendInt(b, int64(count), 10)
		if k == 0 && len(notFound) > 0 {
			b = append(b, `,"not_found":[`...)
			for j, id := range notFound {
				if j > 0 {
					b = append(b, ',')
				}
				b = append(b, '"')
				b = strconv.AppendUint(b, id, 10)
				b = append(b, '"')
			}
			b = append(b, ']')
		}
		if req.Presences {
			b = append(b, `,"presences":[`...)
			for j, i := range part {
				if j > 0 {
					b = append(b, ',')
				}
				id, _ := e.opts.memberUser(req.Guild, i)
				b = append(b, `{"user":{"id":"`...)
				b = strconv.AppendUint(b, id, 10)
				b = append(b, `"},"status":"online","activities":[],"client_status":{"desktop":"online"}}`...)
			}
			b = append(b, ']')
		}
		if req.HasNonce {
			nonce, _ := json.Marshal(req.Nonce)
			b = append(b, `,"nonce":`...)
			b = append(b, nonce...)
		}
		b = append(b, '}')
		e.dispatch(s, "GUILD_MEMBERS_CHUNK", json.RawMessage(b))
	}
}
