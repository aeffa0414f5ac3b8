package assign

import (
	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/wire"
)

// Effect is an output of the machine, for its caller to carry out.
type Effect interface{ effect() }

// PersistAssignment writes PChannel's assignment (compare-and-set); the
// answer names Rev.
type PersistAssignment struct {
	Rev        Rev
	PChannel   streamwal.PChannel
	Assignment streamwal.Assignment
}

// PersistCollections writes the VChannel allocation; the answer names
// Rev.
type PersistCollections struct {
	Rev         Rev
	Collections wire.Collections
}

// PublishView writes the view clients and operators watch; the answer
// names Rev.
type PublishView struct {
	Rev  Rev
	View wire.View
}

// Fence raises PChannel's term at the oracle, which refuses TimeTicks to
// the owners of earlier terms (never lowering it).
type Fence struct {
	PChannel streamwal.PChannel
	Term     uint64
}

// Open asks Node to open PChannel under Term, after closing it on the
// previous owner when Close is set; its outcome comes back as
// [OpenConfirmed] or [OpenFailed].
type Open struct {
	PChannel streamwal.PChannel
	Node     streamwal.NodeID
	Term     uint64
	Close    *Close
}

// Close is the close on a PChannel's previous live owner that comes
// before its open elsewhere (best effort: the new owner's barrier fences
// the old one anyway).
type Close struct {
	Node streamwal.NodeID
	Term uint64
}

// CancelOpen gives up the open of PChannel under way (its node is lost);
// its outcome still comes back, as failed.
type CancelOpen struct{ PChannel streamwal.PChannel }

// Report is a persisted change of an assignment, for telemetry.
type Report struct {
	PChannel streamwal.PChannel
	Node     streamwal.NodeID
	Term     uint64
	State    streamwal.AssignmentState
	Serving  bool
}

// Reply answers an [Allocate] or [Release] call: Allocate is the
// allocation's reply, Err why it failed.
type Reply struct {
	Call     uint64
	Allocate wire.AllocateReply
	Err      error
}

// Level is a log line's level.
type Level int8

// Levels.
const (
	Info Level = iota
	Warn
)

// String is the level's name.
func (l Level) String() string {
	if l == Warn {
		return "warn"
	}
	return "info"
}

// Log is a line to log.
type Log struct {
	Level  Level
	Msg    string
	Fields []Field
}

// Field is a log line's field: a string, integer, duration, error or
// name.
type Field struct {
	Key   string
	Value any
}

func (PersistAssignment) effect()  {}
func (PersistCollections) effect() {}
func (PublishView) effect()        {}
func (Fence) effect()              {}
func (Open) effect()               {}
func (CancelOpen) effect()         {}
func (Report) effect()             {}
func (Reply) effect()              {}
func (Log) effect()                {}
