package events

import (
	"fmt"
	"strconv"
)

// Permissions is what one NATS user may publish and subscribe to (the
// embedded server turns it into the server's own permissions).
type Permissions struct {
	PublishAllow   []string
	PublishDeny    []string
	SubscribeAllow []string
	// Responses lets the user answer requests (one reply each) on the
	// reply subjects of messages it received: a node's command replies.
	Responses bool
}

// inboxes is where the NATS clients receive their replies (PubAcks,
// command replies, JetStream API answers).
const inboxes = "_INBOX.>"

// NodePermissions are a node's: publish dispatches of its own shards
// only, subscribe to its own shards' command subjects only (and its
// inbox, for PubAcks), answer the commands it receives.
func NodePermissions(app string, shards []uint32) (Permissions, error) {
	if err := ValidateApp(app); err != nil {
		return Permissions{}, err
	}
	p := Permissions{SubscribeAllow: []string{inboxes}, Responses: true}
	for _, s := range shards {
		tok := strconv.FormatUint(uint64(s), 10)
		p.PublishAllow = append(p.PublishAllow, subjectRoot+"."+app+"."+eventsToken+"."+tok+".*")
		p.SubscribeAllow = append(p.SubscribeAllow, subjectRoot+"."+app+"."+commandsToken+"."+tok)
	}
	if len(p.PublishAllow) == 0 {
		// No shards: an empty allow list would mean "everything" to NATS.
		p.PublishAllow = []string{subjectRoot + "." + app + "." + eventsToken + ".none"}
		p.PublishDeny = []string{">"}
	}
	return p, nil
}

// WorkerPermissions are a bot worker's: send commands to any shard, read
// the app's event stream through JetStream (consumers on that stream
// only, acknowledgements, stream info and message reads), never publish
// an event.
func WorkerPermissions(app string) (Permissions, error) {
	stream, err := StreamName(app)
	if err != nil {
		return Permissions{}, err
	}
	return Permissions{
		PublishAllow: []string{
			subjectRoot + "." + app + "." + commandsToken + ".*",
			"$JS.API.INFO",
			"$JS.API.STREAM.INFO." + stream,
			"$JS.API.STREAM.MSG.GET." + stream,
			"$JS.API.DIRECT.GET." + stream,
			"$JS.API.DIRECT.GET." + stream + ".>",
			"$JS.API.CONSUMER.*." + stream,
			"$JS.API.CONSUMER.*." + stream + ".>",
			"$JS.API.CONSUMER.*.*." + stream + ".>", // DURABLE.CREATE, MSG.NEXT
			"$JS.ACK." + stream + ".>",
			"$JS.FC." + stream + ".>",
		},
		PublishDeny:    []string{subjectRoot + "." + app + "." + eventsToken + ".>"},
		SubscribeAllow: []string{inboxes},
	}, nil
}

// String is a short description for logs.
func (p Permissions) String() string {
	return fmt.Sprintf("publish %v (not %v), subscribe %v, responses %v", p.PublishAllow, p.PublishDeny, p.SubscribeAllow, p.Responses)
}
