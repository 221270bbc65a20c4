package view

// State is the dashboard's state of a shard or a shard-map cell. Every
// state has a letter and a CSS pattern as well as a colour, so colour is
// never the only signal.
type State uint8

// Shard states as the dashboard shows them. The order is the attention
// order: an aggregated map cell shows the highest state it contains
// (Unowned aside, which only whole unassigned blocks show).
const (
	Ready    State = iota // READY or RESUMED
	Held                  // held by its node, no per-shard status (or ASSIGNED)
	Starting              // connecting, identifying or resuming
	Pending               // assigned, waiting for the previous owner to release it
	Backoff               // waiting out the transport backoff
	Fatal                 // non-retryable close code
	Unowned               // in no live node's range
	NumStates
)

type stateInfo struct {
	letter, name, class, help string
}

var states = [NumStates]stateInfo{
	Ready:    {"R", "READY", "s-r", "connected and receiving events"},
	Held:     {"A", "ASSIGNED", "s-a", "held by its node; no per-shard status reported yet"},
	Starting: {"S", "STARTING", "s-s", "connecting, identifying or resuming"},
	Pending:  {"P", "PENDING", "s-p", "assigned; waiting for the previous owner to release it"},
	Backoff:  {"B", "BACKOFF", "s-b", "transport failed; retrying after the fixed backoff"},
	Fatal:    {"F", "FATAL", "s-f", "closed with a non-retryable code; never retried"},
	Unowned:  {"U", "UNOWNED", "s-u", "in no live node's range"},
}

// Letter is the one-letter code printed in cells.
func (s State) Letter() string { return states[s%NumStates].letter }

// Name is the state's name.
func (s State) Name() string { return states[s%NumStates].name }

// Class is the CSS class that gives the state its colour and pattern.
func (s State) Class() string { return states[s%NumStates].class }

// Help says what the state means, for the legend.
func (s State) Help() string { return states[s%NumStates].help }

// LegendOrder is the order of the legend and of per-state counts.
var LegendOrder = []State{Ready, Starting, Held, Pending, Backoff, Fatal, Unowned}
