package gatewayemu

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/coder/websocket"
)

// TestMessageBytes: with Options.MessageBytes the op-0 frames of the
// synthetic MESSAGE_CREATEs, as a client reads them off the connection,
// are that long within the sequence number's digits, and still carry a
// guild message whose content begins as an unpadded one's; without it
// they stay under MinMessageBytes.
func TestMessageBytes(t *testing.T) {
	t.Parallel()
	for _, size := range []int{0, MinMessageBytes, 1024, 4096} {
		o := fastOptions()
		o.MessagesPerSecond = 500
		o.Guilds = 2
		o.MessageBytes = size
		emu := startEmu(t, o)
		c := connect(t, emu)
		c.identify(emu, 0, 1)
		for got := 0; got < 20; {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			typ, b, err := c.ws.Read(ctx)
			cancel()
			if err != nil {
				t.Fatalf("size %d: %v", size, err)
			}
			var f struct {
				T string `json:"t"`
				S int64  `json:"s"`
				D struct {
					GuildID string `json:"guild_id"`
					Content string `json:"content"`
				} `json:"d"`
			}
			if typ != websocket.MessageText || json.Unmarshal(b, &f) != nil {
				t.Fatalf("size %d: not a JSON text frame: %.80q", size, b)
			}
			if f.T != "MESSAGE_CREATE" {
				continue
			}
			got++
			if f.D.GuildID == "" || !strings.HasPrefix(f.D.Content, "synthetic message ") {
				t.Fatalf("size %d: MESSAGE_CREATE s=%d: %.200s", size, f.S, b)
			}
			switch {
			case size == 0 && len(b) >= MinMessageBytes:
				t.Fatalf("unpadded MESSAGE_CREATE s=%d is %d bytes, not under %d", f.S, len(b), MinMessageBytes)
			case size > 0 && (len(b) < size-3 || len(b) > size+3):
				t.Fatalf("MESSAGE_CREATE s=%d is %d bytes, want %d±3: %.120s", f.S, len(b), size, b)
			}
		}
	}
}

func TestMessageBytesBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		n  int
		ok bool
	}{{0, true}, {MinMessageBytes, true}, {MaxMessageBytes, true}, {-1, false}, {MinMessageBytes - 1, false}, {MaxMessageBytes + 1, false}} {
		o := fastOptions()
		o.MessageBytes = c.n
		_, err := New(o)
		if c.ok != (err == nil) {
			t.Errorf("MessageBytes %d: err %v", c.n, err)
		}
		if err != nil && (!errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), "message bytes")) {
			t.Errorf("MessageBytes %d: error %q does not name the field", c.n, err)
		}
	}
}
