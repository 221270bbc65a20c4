package view

// Delivery is the fleet page's event delivery panel: the stream that holds
// every dispatch the nodes published, and how far each bot service is
// behind. Numbers are preformatted.
type Delivery struct {
	// Connected: dpxe serve's own connection to the broker is up. Read:
	// the stream was read (else the broker did not answer in time).
	Connected, Read bool
	Messages        string // "12,345"
	Bytes           string // "3.2 MiB"
	Services        []EventService
}

// EventService is one bot service (a durable consumer of the stream).
type EventService struct {
	Name                  string
	Pending, Unacked, Lag string
	Behind                bool // it has a lag at all
}
