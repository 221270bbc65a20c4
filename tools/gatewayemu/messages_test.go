package gatewayemu

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestRESTCreateMessage: POST /api/v10/channels/{id}/messages needs the
// bot token (401 without), refuses an empty or malformed body (400),
// records each created message with its reply reference, and answers the
// sixth message in a channel within the window with 429, Discord's body
// (retry_after in seconds, global false) and headers, while another
// channel still has room; after the retry-after the channel accepts
// again.
func TestRESTCreateMessage(t *testing.T) {
	o := fastOptions()
	o.RESTMessageWindow = 600 * time.Millisecond
	emu := startEmu(t, o)
	post := func(channel, token, body string) (*http.Response, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("POST", emu.APIBase(10)+"channels/"+channel+"/messages", strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bot "+token)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		json.NewDecoder(bytes.NewReader(b)).Decode(&m)
		return resp, m
	}
	tok := emu.Token()
	if resp, _ := post("100", "", `{"content":"pong"}`); resp.StatusCode != 401 {
		t.Errorf("no token: %d", resp.StatusCode)
	}
	if resp, _ := post("100", "wrong", `{"content":"pong"}`); resp.StatusCode != 401 {
		t.Errorf("wrong token: %d", resp.StatusCode)
	}
	if resp, m := post("100", tok, `{"content":""}`); resp.StatusCode != 400 || m["code"] != float64(50006) {
		t.Errorf("empty content: %d %v", resp.StatusCode, m)
	}
	if resp, _ := post("100", tok, `{"content":`); resp.StatusCode != 400 {
		t.Errorf("bad JSON: %d", resp.StatusCode)
	}
	if resp, _ := post("abc", tok, `{"content":"x"}`); resp.StatusCode != 404 {
		t.Errorf("channel abc: %d", resp.StatusCode)
	}
	start := time.Now()
	for i := 0; i < DefaultRESTMessageLimit; i++ {
		resp, m := post("100", tok, `{"content":"pong","message_reference":{"message_id":"7"}}`)
		if resp.StatusCode != 200 || m["content"] != "pong" || m["channel_id"] != "100" || m["id"] == "" {
			t.Fatalf("message %d: %d %v", i, resp.StatusCode, m)
		}
	}
	resp, m := post("100", tok, `{"content":"pong"}`)
	elapsed := time.Since(start)
	if elapsed < o.RESTMessageWindow {
		retry, _ := m["retry_after"].(float64)
		if resp.StatusCode != 429 || m["global"] != false || retry <= 0 || retry > 0.6 ||
			resp.Header.Get("Retry-After") != "1" || resp.Header.Get("X-RateLimit-Remaining") != "0" {
			t.Errorf("sixth in the window: %d %v %v", resp.StatusCode, m, resp.Header)
		}
	}
	if resp, _ := post("200", tok, `{"content":"other channel"}`); resp.StatusCode != 200 {
		t.Errorf("another channel: %d", resp.StatusCode)
	}
	deadline := time.Now().Add(testTimeout)
	for {
		resp, _ := post("100", tok, `{"content":"again"}`)
		if resp.StatusCode == 200 {
			break
		}
		if resp.StatusCode != 429 || time.Now().After(deadline) {
			t.Fatalf("after the window: %d", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rec := emu.REST()
	if len(rec.Messages) != DefaultRESTMessageLimit+2 || rec.Messages[0].ReplyTo != "7" || rec.Messages[0].Content != "pong" {
		t.Errorf("record: %+v", rec.Messages)
	}
	if rec.Unauthorized != 2 || rec.Refused != 3 || (elapsed < o.RESTMessageWindow && rec.RateLimited == 0) {
		t.Errorf("counts: %d unauthorized, %d refused, %d rate limited", rec.Unauthorized, rec.Refused, rec.RateLimited)
	}
}

// FuzzCreateMessage: any channel and body get 200, 400, 404 or 429 (never
// a 5xx or a panic), and a 200 records exactly the content that was sent.
func FuzzCreateMessage(f *testing.F) {
	for _, s := range []string{`{"content":"pong"}`, `{"content":""}`, `{"content":"x","message_reference":{"message_id":"1"}}`, `{`, `[]`, `{"content":5}`} {
		f.Add("100", s)
	}
	f.Add("abc", `{"content":"x"}`)
	o := fastOptions()
	o.RESTMessageLimit = 1 << 20
	emu, err := New(o)
	if err != nil {
		f.Fatal(err)
	}
	h := emu.RESTHandler()
	f.Fuzz(func(t *testing.T, channel, body string) {
		if strings.ContainsAny(channel, "/?#% \t\r\n") || channel == "" {
			return
		}
		before := len(emu.REST().Messages)
		req, err := http.NewRequest("POST", "http://emu/api/v10/channels/"+channel+"/messages", strings.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bot "+emu.Token())
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		rec := emu.REST()
		switch w.Code {
		case 200:
			var in struct {
				Content string `json:"content"`
			}
			json.Unmarshal([]byte(body), &in)
			if len(rec.Messages) != before+1 || rec.Messages[before].Content != in.Content || in.Content == "" {
				t.Fatalf("200 for %q: record %d → %d", body, before, len(rec.Messages))
			}
		case 400, 404, 429:
			if len(rec.Messages) != before {
				t.Fatalf("%d for %q recorded a message", w.Code, body)
			}
		default:
			t.Fatalf("status %d for channel %q body %q", w.Code, channel, body)
		}
	})
}
