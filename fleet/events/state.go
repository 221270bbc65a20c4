package events

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StreamState is the event stream as dpxe serve sees it at one moment
// (its metrics and dashboard): its own NATS connection and, when the
// broker answered, the stream's size and each bot service's consumer.
type StreamState struct {
	Connected bool // serve's own connection to the broker is up
	// Read: Messages, Bytes and Consumers were read (false: the broker
	// did not answer in time, or the stream is gone).
	Read            bool
	Messages, Bytes uint64
	Consumers       []ConsumerState
}

// ConsumerState is one durable consumer (a bot service): Pending are
// stored and not yet delivered, Unacked delivered and not yet
// acknowledged; their sum is its lag in events.
type ConsumerState struct {
	Name             string
	Pending, Unacked uint64
}

// Lag is the consumer's lag in events.
func (c ConsumerState) Lag() uint64 { return c.Pending + c.Unacked }

// ReadStreamState reads st's state through nc, bounded by ctx.
func ReadStreamState(ctx context.Context, nc *nats.Conn, st jetstream.Stream) StreamState {
	out := StreamState{Connected: nc.IsConnected()}
	if !out.Connected {
		return out
	}
	info, err := st.Info(ctx)
	if err != nil {
		return out
	}
	var cs []ConsumerState
	lister := st.ListConsumers(ctx)
	for ci := range lister.Info() {
		cs = append(cs, ConsumerState{Name: ci.Name, Pending: ci.NumPending, Unacked: uint64(max(ci.NumAckPending, 0))})
	}
	if lister.Err() != nil {
		return out
	}
	out.Read, out.Messages, out.Bytes, out.Consumers = true, info.State.Msgs, info.State.Bytes, cs
	return out
}
