package dpxe_test

import (
	"context"
	"errors"
	"log"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/sdk/dpxe"
)

// A bot service that reads MESSAGE_CREATE from every shard. Run it as many
// times as you like: the processes share the durable consumer "pingbot".
// (Compiled by go vet and go test; docs/events.md shows the same code.)
func ExampleService() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	nc, err := nats.Connect("nats://127.0.0.1:4222") // dpxe serve's --nats-listen
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	svc, err := dpxe.NewService(ctx, nc, dpxe.Config{App: "bot", Service: "pingbot", Events: []string{"MESSAGE_CREATE"}})
	if err != nil {
		log.Fatal(err)
	}
	err = svc.Run(ctx, func(ctx context.Context, ev *dpxe.Event) error {
		var msg struct {
			Content   string `json:"content"`
			ChannelID string `json:"channel_id"`
		}
		if err := ev.Decode(&msg); err != nil {
			return nil // not a message we understand: acknowledge and move on
		}
		log.Printf("shard %d seq %d in %s: %q", ev.Shard, ev.Seq, msg.ChannelID, msg.Content)
		return nil // nil acknowledges; an error has the event delivered again
	}, func(err error) { log.Print(err) })
	if err != nil {
		log.Fatal(err)
	}
}

// A worker asks the shard that holds a guild for ten of its members, and
// sets the bot idle on shard 0. (docs/events.md shows the same code.)
func ExampleCommander() {
	ctx := context.Background()
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	guildID := uint64(81384788765712384)
	cmd, err := dpxe.NewCommander(nc, dpxe.CommandConfig{App: "bot", Shards: 16})
	if err != nil {
		log.Fatal(err)
	}
	err = cmd.SendCommand(ctx, guildID, dpxe.OpRequestGuildMembers,
		map[string]any{"guild_id": strconv.FormatUint(guildID, 10), "query": "", "limit": 10})
	var ce *dpxe.CommandError
	if errors.As(err, &ce) && ce.Code == "rate_limited" {
		time.Sleep(ce.RetryAfter) // then send it again
	}
	// A presence update is per connection: SendToShard for each shard that should change.
	err = cmd.SendToShard(ctx, 0, dpxe.OpPresenceUpdate, map[string]any{"since": nil, "activities": []any{}, "status": "idle", "afk": false})
	if err != nil {
		log.Print(err)
	}
}
