package gatewayemu

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Discord's REST messages, as far as a bot answering a command needs them:
// POST /api/v10/channels/{channel.id}/messages with a bot token, each
// message recorded, and the per-channel rate limit answered as Discord
// does (429, a JSON body with retry_after in seconds, Retry-After and
// X-RateLimit-* headers). Synthetic MESSAGE_CREATEs can carry "!ping"
// (Options.PingEvery), and the record of pings sent and messages posted
// lets a test check that every ping got exactly one reply.

// Defaults of the REST message rate limit: Discord's usual bucket for
// creating messages in a channel is 5 per 5 s.
const (
	DefaultRESTMessageLimit  = 5
	DefaultRESTMessageWindow = 5 * time.Second
	// maxMessageBody bounds a POST body (Discord's JSON bodies without
	// files stay far below it).
	maxMessageBody = 64 << 10
	// maxContentRunes is Discord's limit on a message's content.
	maxContentRunes = 2000
	// maxMessageRecords bounds both records; later entries are counted.
	maxMessageRecords = 100000
	// PingContent is the content of the synthetic MESSAGE_CREATEs that
	// Options.PingEvery makes.
	PingContent = "!ping"
)

// MessageRecord is one message a bot created through REST.
type MessageRecord struct {
	ID        string    `json:"id"`
	ChannelID string    `json:"channel_id"`
	Content   string    `json:"content"`
	ReplyTo   string    `json:"reply_to,omitempty"` // message_reference.message_id
	Received  time.Time `json:"received"`
}

// PingRecord is one synthetic "!ping" MESSAGE_CREATE the emulator
// generated (a replay after Resume sends the same one again).
type PingRecord struct {
	MessageID string    `json:"message_id"`
	ChannelID string    `json:"channel_id"`
	Shard     int       `json:"shard"`
	Session   string    `json:"session"`
	Sent      time.Time `json:"sent"`
}

// RESTRecord is the REST side of the record in /debug/state.
type RESTRecord struct {
	Messages []MessageRecord `json:"messages"`
	Pings    []PingRecord    `json:"pings"`
	// RateLimited counts POSTs answered 429; Unauthorized those without
	// the bot token; Refused those with a bad body; Dropped the records
	// past the bound.
	RateLimited  uint64 `json:"rate_limited"`
	Unauthorized uint64 `json:"unauthorized"`
	Refused      uint64 `json:"refused"`
	Dropped      uint64 `json:"dropped"`
}

// restState is the emulator's REST record and rate-limit buckets, under
// e.mu.
type restState struct {
	RESTRecord
	buckets map[string][]time.Time // channel → recent accepted creates
	nextID  uint64
}

// REST returns the REST record.
func (e *Emulator) REST() RESTRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.restRecordLocked()
}

func (e *Emulator) restRecordLocked() RESTRecord {
	r := e.rest.RESTRecord
	r.Messages = append([]MessageRecord{}, r.Messages...)
	r.Pings = append([]PingRecord{}, r.Pings...)
	return r
}

// notePing records a synthetic "!ping".
func (e *Emulator) notePing(s *session, d map[string]any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.rest.Pings) >= maxMessageRecords {
		e.rest.Dropped++
		return
	}
	id, _ := d["id"].(string)
	ch, _ := d["channel_id"].(string)
	e.rest.Pings = append(e.rest.Pings, PingRecord{MessageID: id, ChannelID: ch, Shard: s.shard[0], Session: s.id, Sent: time.Now()})
	e.notifyLocked()
}

// createMessage serves POST /channels/{id}/messages.
func (e *Emulator) createMessage(w http.ResponseWriter, r *http.Request, channel string) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bot ")
	e.mu.Lock()
	valid := ok && e.checkTokenLocked(tok)
	if !valid {
		e.rest.Unauthorized++
	}
	e.mu.Unlock()
	if !valid {
		writeJSON(w, http.StatusUnauthorized, apiError{Message: "401: Unauthorized", Code: 0})
		return
	}
	if _, err := strconv.ParseUint(channel, 10, 64); err != nil {
		e.refuseMessage(w, http.StatusNotFound, apiError{Message: "Unknown Channel", Code: 10003})
		return
	}
	var body struct {
		Content          string `json:"content"`
		MessageReference *struct {
			MessageID string `json:"message_id"`
		} `json:"message_reference"`
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxMessageBody+1))
	if err != nil || len(raw) > maxMessageBody || json.Unmarshal(raw, &body) != nil {
		e.refuseMessage(w, http.StatusBadRequest, apiError{Message: "400: Bad Request", Code: 50109}) // "The request body contains invalid JSON."
		return
	}
	if body.Content == "" {
		e.refuseMessage(w, http.StatusBadRequest, apiError{Message: "Cannot send an empty message", Code: 50006})
		return
	}
	if n := len([]rune(body.Content)); n > maxContentRunes {
		e.refuseMessage(w, http.StatusBadRequest, apiError{Message: fmt.Sprintf("Invalid Form Body: content: Must be %d or fewer in length.", maxContentRunes), Code: 50035})
		return
	}
	now := e.opts.Now()
	limit, window := e.opts.RESTMessageLimit, e.opts.RESTMessageWindow
	e.mu.Lock()
	recent := e.rest.buckets[channel]
	for len(recent) > 0 && now.Sub(recent[0]) >= window {
		recent = recent[1:]
	}
	if len(recent) >= limit {
		e.rest.buckets[channel] = recent
		e.rest.RateLimited++
		retry := window - now.Sub(recent[0])
		e.mu.Unlock()
		secs := math.Ceil(retry.Seconds()*1000) / 1000
		rateHeaders(w, channel, limit, 0, secs)
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(secs))))
		writeJSON(w, http.StatusTooManyRequests, map[string]any{
			"message": "You are being rate limited.", "retry_after": secs, "global": false})
		return
	}
	recent = append(recent, now)
	e.rest.buckets[channel] = recent
	e.rest.nextID++
	id := snowflake(uint64(now.UnixMilli()-discordEpochMillis)<<22 | 1<<17 | e.rest.nextID&0x1ffff)
	rec := MessageRecord{ID: id, ChannelID: channel, Content: body.Content, Received: time.Now()}
	if body.MessageReference != nil {
		rec.ReplyTo = body.MessageReference.MessageID
	}
	if len(e.rest.Messages) < maxMessageRecords {
		e.rest.Messages = append(e.rest.Messages, rec)
	} else {
		e.rest.Dropped++
	}
	remaining := limit - len(recent)
	reset := window - now.Sub(recent[0])
	e.notifyLocked()
	e.mu.Unlock()
	rateHeaders(w, channel, limit, remaining, reset.Seconds())
	msg := map[string]any{"id": id, "type": 0, "channel_id": channel, "content": body.Content,
		"author":    map[string]any{"id": snowflake(applicationID), "username": botUsername, "discriminator": "0", "bot": true},
		"timestamp": now.UTC().Format(time.RFC3339Nano), "edited_timestamp": nil, "tts": false,
		"mention_everyone": false, "mentions": []any{}, "mention_roles": []any{}, "attachments": []any{},
		"embeds": []any{}, "pinned": false, "flags": 0}
	if rec.ReplyTo != "" {
		msg["type"] = 19 // REPLY
		msg["message_reference"] = map[string]any{"message_id": rec.ReplyTo, "channel_id": channel}
	}
	writeJSON(w, http.StatusOK, msg)
}

func (e *Emulator) refuseMessage(w http.ResponseWriter, status int, body apiError) {
	e.mu.Lock()
	e.rest.Refused++
	e.mu.Unlock()
	writeJSON(w, status, body)
}

// rateHeaders sets Discord's X-RateLimit-* headers of the channel's
// message bucket.
func rateHeaders(w http.ResponseWriter, channel string, limit, remaining int, resetAfter float64) {
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.Itoa(limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	h.Set("X-RateLimit-Reset-After", strconv.FormatFloat(resetAfter, 'f', 3, 64))
	h.Set("X-RateLimit-Bucket", "messages:"+channel)
	if remaining == 0 {
		h.Set("X-RateLimit-Scope", "user")
	}
}
