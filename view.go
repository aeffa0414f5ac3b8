package streamwal

import "time"

// AssignmentState is where a PChannel is in its assignment (DESIGN.md §3):
// the coordinator persists it, and clients and operators read it in a
// [View].
type AssignmentState string

// Assignment states.
const (
	// Uninitialized: the PChannel was never assigned.
	Uninitialized AssignmentState = "UNINITIALIZED"
	// Assigning: a new term was persisted; the owner has not confirmed.
	Assigning AssignmentState = "ASSIGNING"
	// Assigned: the owner confirmed the assignment.
	Assigned AssignmentState = "ASSIGNED"
	// Unavailable: the owner was lost; the PChannel waits for another.
	Unavailable AssignmentState = "UNAVAILABLE"
)

// Assignment is one PChannel's owner and term, as the coordinator
// persisted it.
type Assignment struct {
	PChannel string          `json:"pchannel"`
	Node     string          `json:"node,omitempty"`
	Term     uint64          `json:"term"`
	State    AssignmentState `json:"state"`
	// VChannels counts the VChannels placed on it.
	VChannels int `json:"vchannels"`
	// Epoch is the coordinator epoch that wrote it.
	Epoch uint64 `json:"epoch"`
	// Session and Version are those of the owner's open reply: the
	// incarnation of the node that confirmed the PChannel, and the first
	// version of its served set that lists it.
	Session string `json:"session,omitempty"`
	Version uint64 `json:"version,omitempty"`
	// Serving says whether the owner confirmed it serves the PChannel
	// under Term in Session (its open reply, then every heartbeat), so
	// that appends to it can succeed; Since is when Serving last changed.
	// A new active coordinator starts every PChannel as not serving until
	// its owner confirms it.
	Serving bool      `json:"serving"`
	Since   time.Time `json:"since"`
	// Error is why the last open of the PChannel failed (the node's
	// refusal, such as HISTORY_LOST, or the request's failure), kept
	// while it is not served and cleared once an owner confirms it.
	Error string `json:"error,omitempty"`
}

// View is the versioned assignment view the coordinator publishes and
// clients and operators watch.
type View struct {
	Version  uint64       `json:"version"`
	Epoch    uint64       `json:"epoch"`
	Leader   string       `json:"leader"`
	CChannel string       `json:"cchannel"`
	Channels []Assignment `json:"channels"`
	Nodes    []string     `json:"nodes"`
}
