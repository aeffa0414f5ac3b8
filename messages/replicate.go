package messages

import (
	"github.com/streamwal/streamwal"
)

// NewReplicate turns an immutable message of another cluster into a mutable
// message for this cluster's WAL: same type, payload and writer-supplied
// properties, retargeted to the channel with the same index here, with the
// source identity kept in a ReplicateHeader. The WAL assigns it a new
// TimeTick. Unreplicable messages, synthetic ones and messages of this very
// cluster are refused. A replica outside a transaction carries a message
// ID derived from its source, so that the stream drops a re-append of it
// within its duplicate window.
func (c *Codec) NewReplicate(src *ImmutableMessage, source streamwal.Cluster, target streamwal.PChannel) (*MutableMessage, error) {
	if src != nil && src.h.Replicate != nil {
		return nil, wrapInvalid(ErrBadTarget, "message %d is already a replica", src.id)
	}
	return c.newReplica(src, source, target)
}

// NewRelay is NewReplicate for a message of source that is itself a
// replica, of a third cluster: the replica carries source's header in
// place of the one src carries, so that a secondary copies a replica
// its source holds as a message of its source's log (a secondary that
// was behind the member promoted in a failover copies from it what it
// missed of the old primary).
func (c *Codec) NewRelay(src *ImmutableMessage, source streamwal.Cluster, target streamwal.PChannel) (*MutableMessage, error) {
	if src != nil && src.h.Replicate != nil && src.h.Replicate.Cluster == c.cluster {
		return nil, wrapInvalid(ErrBadTarget, "message %d is a replica of cluster %s, which is this one", src.id, c.cluster)
	}
	return c.newReplica(src, source, target)
}

// newReplica is the replica of src, of cluster source, for target.
func (c *Codec) newReplica(src *ImmutableMessage, source streamwal.Cluster, target streamwal.PChannel) (*MutableMessage, error) {
	if _, err := streamwal.ParseCluster(string(source)); err != nil {
		return nil, err
	}
	switch {
	case src == nil || src.typ == nil:
		return nil, wrapInvalid(ErrMalformed, "nil source message")
	case src.id == 0:
		return nil, wrapInvalid(ErrMalformed, "source message has no message id")
	case target.IsZero() || target.Index() != src.h.PChannel.Index():
		return nil, wrapInvalid(ErrBadTarget, "replica of %s must go to the pchannel of the same index, not %q", src.h.PChannel, target)
	case source == c.cluster:
		return nil, wrapInvalid(ErrBadTarget, "cannot replicate cluster %s into itself", source)
	case src.h.Unreplicable || src.typ.Is(FlagUnreplicable) || src.typ.Is(FlagSynthetic):
		return nil, wrapInvalid(ErrBadTarget, "message %d of type %s is not replicable", src.id, src.typ.Name)
	case !c.reg.Has(src.typ):
		return nil, wrapInvalid(ErrUnknownType, "%s is not in this codec's registry", src.typ.Name)
	}
	h := src.h.clone()
	h.PChannel = target
	if !src.h.VChannel.IsZero() {
		v, err := retarget(src.h.VChannel, target)
		if err != nil {
			return nil, err
		}
		h.VChannel = v
	}
	h.Replicate = &ReplicateHeader{Cluster: source, MessageID: src.id, TimeTick: src.h.TimeTick, LastConfirmed: src.h.LastConfirmed}
	h.TimeTick, h.LastConfirmed, h.Term = 0, 0, 0
	h.MsgID = ""
	if src.h.Txn == nil && !src.typ.Is(FlagTxnControl) {
		// A transaction's messages carry none (the WAL refuses one on
		// them): the transaction replicates whole or not at all.
		h.MsgID = "rep-" + string(source) + "-" + src.h.PChannel.String() + "-" + src.id.String()
	}
	return &MutableMessage{typ: src.typ, h: h, payload: src.payload}, nil
}

// retarget moves a VChannel onto another PChannel, keeping its suffix.
func retarget(v streamwal.VChannel, p streamwal.PChannel) (streamwal.VChannel, error) {
	if v.IsControl() {
		return p.CChannel(), nil
	}
	return p.VChannel(v.CollectionID(), v.Shard())
}

// Replicate returns the replicate header, or nil.
func (m *ImmutableMessage) Replicate() *ReplicateHeader {
	if m.h.Replicate == nil {
		return nil
	}
	r := *m.h.Replicate
	return &r
}

// Broadcast returns the broadcast header, or nil.
func (m *ImmutableMessage) Broadcast() *BroadcastHeader {
	if m.h.Broadcast == nil {
		return nil
	}
	b := m.h.Broadcast.clone()
	return &b
}

// Replicate returns the replicate header of a replica, or nil, without
// copying the rest of the header.
func (m *MutableMessage) Replicate() *ReplicateHeader {
	if m.h.Replicate == nil {
		return nil
	}
	r := *m.h.Replicate
	return &r
}

// Unreplicable reports whether m stays in its cluster: its type is
// unreplicable, or it was built WithUnreplicable.
func (m *MutableMessage) Unreplicable() bool {
	return m.h.Unreplicable || m.typ.Is(FlagUnreplicable)
}

// Unreplicable reports whether m stays in its cluster: its type is
// unreplicable, or it was built WithUnreplicable.
func (m *ImmutableMessage) Unreplicable() bool {
	return m.h.Unreplicable || m.typ.Is(FlagUnreplicable)
}
