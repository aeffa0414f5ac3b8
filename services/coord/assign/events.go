package assign

import (
	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// Event is an input of the machine.
type Event interface{ event() }

// Takeover loads the persisted state when the coordinator becomes active:
// the view, each PChannel's record and the VChannel allocation, as read.
// The machine fences them (rewrites them under its epoch, an ASSIGNING
// record as UNAVAILABLE since its owner may never have heard of it, every
// PChannel unserved until its owner confirms it) and counts the owners of
// ASSIGNED records alive, in the sessions that confirmed them, until the
// node TTL says otherwise.
type Takeover struct {
	View        wire.View
	Channels    []Loaded
	Collections wire.Collections
}

// Loaded is one PChannel's record as read (Uninitialized when it had
// none).
type Loaded struct {
	PChannel streamwal.PChannel
	Record   Record
}

// NodeSeen is a node's registration or heartbeat: its session and the
// PChannels it serves with their terms, as of Version of that set. A
// replayed one is one of the values found when the watch of the nodes
// started: perhaps the last word of a node long gone, so it tells
// sessions and what a node no longer serves, but never confirms that a
// PChannel is served.
type NodeSeen struct {
	Node     streamwal.NodeID
	Session  string
	Version  uint64
	Serving  map[streamwal.PChannel]uint64
	Replayed bool
}

// NodeGone is a node's registration deleted (it left).
type NodeGone struct{ Node streamwal.NodeID }

// HealthCheck looks at the time: nodes unheard for the node TTL are lost,
// ASSIGNED PChannels unconfirmed for the open timeout are reassigned,
// unserved PChannels are warned of.
type HealthCheck struct{}

// Balance makes the next schedule move PChannels for balance.
type Balance struct{}

// OpenConfirmed is a node's reply to an open: it serves PChannel under
// Term in Session, first listed in Version of its served set, behind its
// RecoveryBarrier.
type OpenConfirmed struct {
	PChannel streamwal.PChannel
	Node     streamwal.NodeID
	Term     uint64
	Session  string
	Version  uint64
	Barrier  messages.MessageID
}

// OpenFailed is an open that failed: refused, unanswered or cancelled.
type OpenFailed struct {
	PChannel streamwal.PChannel
	Node     streamwal.NodeID
	Term     uint64
	Err      error
}

// Allocate places a collection's VChannels (or looks them up); its
// [Reply] names Call.
type Allocate struct {
	Call    uint64
	Request wire.AllocateRequest
}

// Release forgets a dropped collection's VChannels; its [Reply] names
// Call.
type Release struct {
	Call         uint64
	CollectionID int64
}

// Persisted answers a persist: it was written.
type Persisted struct{ Rev Rev }

// PersistFailed answers a persist: it was not written (or its outcome is
// unknown), because of Err; Deposed says that another coordinator wrote
// the key, so that this one no longer starts anything.
type PersistFailed struct {
	Rev     Rev
	Err     error
	Deposed bool
}

// Deposed says that another coordinator is active: the machine starts
// nothing any more.
type Deposed struct{}

func (Takeover) event()      {}
func (NodeSeen) event()      {}
func (NodeGone) event()      {}
func (HealthCheck) event()   {}
func (Balance) event()       {}
func (OpenConfirmed) event() {}
func (OpenFailed) event()    {}
func (Allocate) event()      {}
func (Release) event()       {}
func (Persisted) event()     {}
func (PersistFailed) event() {}
func (Deposed) event()       {}
