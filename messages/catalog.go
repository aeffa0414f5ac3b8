package messages

import (
	"reflect"
	"strings"

	"github.com/streamwal/streamwal"
)

// Dispatch says where messages of a type go.
type Dispatch uint8

// The dispatch kinds of DESIGN.md §5.
const (
	// DispatchPChannel: a PChannel-level message written by the WAL itself
	// (TimeTick, RecoveryBarrier).
	DispatchPChannel Dispatch = iota + 1
	// DispatchVChannel: one VChannel.
	DispatchVChannel
	// DispatchVChannelsAndCChannel: a broadcast to VChannels plus the CChannel.
	DispatchVChannelsAndCChannel
	// DispatchCChannel: a broadcast to the CChannel only.
	DispatchCChannel
	// DispatchVChannels: a broadcast to VChannels only.
	DispatchVChannels
	// DispatchAllPChannels: a broadcast to every PChannel, as PChannel-level
	// messages (cluster barriers).
	DispatchAllPChannels
)

var dispatchNames = map[Dispatch]string{
	DispatchPChannel:             "pchannel",
	DispatchVChannel:             "vchannel",
	DispatchVChannelsAndCChannel: "vchannels+cchannel",
	DispatchCChannel:             "cchannel",
	DispatchVChannels:            "vchannels",
	DispatchAllPChannels:         "all-pchannels",
}

// String names the dispatch.
func (d Dispatch) String() string {
	if s, ok := dispatchNames[d]; ok {
		return s
	}
	return "invalid"
}

// Valid reports whether d is one of the declared kinds.
func (d Dispatch) Valid() bool { _, ok := dispatchNames[d]; return ok }

// IsBroadcast reports whether messages of this dispatch go through the
// broadcaster (several targets, or the CChannel).
func (d Dispatch) IsBroadcast() bool {
	return d != DispatchPChannel && d != DispatchVChannel
}

// PChannelLevel reports whether messages of this dispatch use PChannel-level
// subjects (no VChannel).
func (d Dispatch) PChannelLevel() bool {
	return d == DispatchPChannel || d == DispatchAllPChannels
}

// LockMode is how an append holds its lock.
type LockMode uint8

// Lock modes.
const (
	LockNone LockMode = iota
	LockShared
	LockExclusive
)

// LockScope is what an append locks.
type LockScope uint8

// Lock scopes.
const (
	ScopeVChannel LockScope = iota + 1
	ScopePChannel
)

// Lock is the lock an append of a type takes at the node.
type Lock struct {
	Mode  LockMode
	Scope LockScope
}

// Convenience lock declarations.
var (
	NoLock                = Lock{}
	SharedVChannelLock    = Lock{Mode: LockShared, Scope: ScopeVChannel}
	ExclusiveVChannelLock = Lock{Mode: LockExclusive, Scope: ScopeVChannel}
	ExclusivePChannelLock = Lock{Mode: LockExclusive, Scope: ScopePChannel}
	validLocks            = map[Lock]bool{NoLock: true, SharedVChannelLock: true, ExclusiveVChannelLock: true, ExclusivePChannelLock: true, {Mode: LockShared, Scope: ScopePChannel}: true}
)

// Flags are boolean properties of a type.
type Flags uint16

// Type flags.
const (
	// FlagSelfControlled: written by the WAL itself; refused from clients.
	FlagSelfControlled Flags = 1 << iota
	// FlagAckSyncUp: a broadcast of this type is acknowledged per VChannel
	// only when the consuming side confirms.
	FlagAckSyncUp
	// FlagUnreplicable: never replicated to secondary clusters.
	FlagUnreplicable
	// FlagNotTraced: carries no trace context and opens no span.
	FlagNotTraced
	// FlagTxnBody: may be a body message of a transaction.
	FlagTxnBody
	// FlagTxnControl: BeginTxn, CommitTxn or RollbackTxn.
	FlagTxnControl
	// FlagSynthetic: built by the read side only, never appended (Txn).
	FlagSynthetic
)

// Has reports whether every flag of f2 is set in f.
func (f Flags) Has(f2 Flags) bool { return f&f2 == f2 }

// Type is one message type of the catalog, declared as data. Types are
// immutable once registered; compare them by pointer or Name.
type Type struct {
	// Name is the type's name in headers ("Insert"): an upper-case ASCII
	// letter followed by letters and digits.
	Name string
	// Token is the type's subject token, the lower-cased Name ("insert").
	Token streamwal.Token
	// Dispatch says which channels a message of the type targets.
	Dispatch Dispatch
	// Lock is taken by an append of the type at the node.
	Lock Lock
	// Keys are the resource keys a broadcast of the type takes (SharedCluster
	// is always added).
	Keys []KeyRule
	// Flags are the type's boolean properties.
	Flags Flags
	// Body is the Go type of the JSON body for built-in types the WAL
	// interprets; nil means the payload is the caller's opaque bytes.
	Body reflect.Type
}

// String returns the name ("<nil>" for a nil type).
func (t *Type) String() string {
	if t == nil {
		return "<nil>"
	}
	return t.Name
}

// Is reports whether the type has all the flags.
func (t *Type) Is(f Flags) bool { return t.Flags.Has(f) }

// validate checks a declaration for internal consistency.
func (t *Type) validate() error {
	if err := checkTypeName(t.Name); err != nil {
		return err
	}
	if tok, err := streamwal.ParseToken(strings.ToLower(t.Name)); err != nil || tok != t.Token {
		return wrapInvalid(ErrBadType, "type %s: token %q must be the lower-cased name", t.Name, t.Token)
	}
	if !t.Dispatch.Valid() {
		return wrapInvalid(ErrBadType, "type %s: invalid dispatch %d", t.Name, t.Dispatch)
	}
	if !validLocks[t.Lock] {
		return wrapInvalid(ErrBadType, "type %s: invalid lock %+v", t.Name, t.Lock)
	}
	if !t.Dispatch.IsBroadcast() && len(t.Keys) > 0 {
		return wrapInvalid(ErrBadType, "type %s: resource keys are for broadcast types only", t.Name)
	}
	for _, k := range t.Keys {
		if !k.Domain.Valid() {
			return wrapInvalid(ErrBadType, "type %s: invalid resource key domain %d", t.Name, k.Domain)
		}
	}
	return nil
}

// checkTypeName validates a type name.
func checkTypeName(name string) error {
	if name == "" || len(name) > streamwal.MaxTokenLen || name[0] < 'A' || name[0] > 'Z' {
		return wrapInvalid(ErrBadType, "type name %q: want an upper-case letter then letters and digits, at most %d bytes", name, streamwal.MaxTokenLen)
	}
	for i := 1; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return wrapInvalid(ErrBadType, "type name %q: only ASCII letters and digits are allowed", name)
		}
	}
	return nil
}
