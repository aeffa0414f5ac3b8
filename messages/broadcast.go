package messages

import (
	"slices"
	"strconv"

	"github.com/streamwal/streamwal"
)

// Targets are the channels a broadcast reaches. Which fields a type needs
// follows its dispatch: VChannels plus CChannel, CChannel only, VChannels
// only, or PChannels for cluster barriers.
type Targets struct {
	VChannels []streamwal.VChannel
	CChannel  streamwal.VChannel
	PChannels []streamwal.PChannel
}

// BroadcastMessage is one message aimed at several channels, before it is
// split into one MutableMessage per target.
type BroadcastMessage struct {
	typ     *Type
	h       Header
	bh      BroadcastHeader
	payload []byte
}

// NewBroadcast builds a broadcast of a broadcast type. Targets must fit the
// type's dispatch (no duplicates, the CChannel only where the dispatch takes
// it); the resource keys come from the type's rules applied to scope, plus
// SharedCluster.
func (c *Codec) NewBroadcast(t *Type, targets Targets, scope KeyScope, payload []byte, opts ...Option) (*BroadcastMessage, error) {
	if err := c.checkType(t); err != nil {
		return nil, err
	}
	if !t.Dispatch.IsBroadcast() {
		return nil, wrapInvalid(ErrBadTarget, "type %s (%s) is not a broadcast type", t.Name, t.Dispatch)
	}
	bh, err := broadcastTargets(t, targets)
	if err != nil {
		return nil, err
	}
	if bh.Keys, err = ResourceKeys(t, scope); err != nil {
		return nil, err
	}
	m, err := c.build(t, Header{}, payload, opts)
	if err != nil {
		return nil, err
	}
	if m.h.Txn != nil {
		return nil, wrapInvalid(ErrBadTarget, "a broadcast cannot be part of a transaction")
	}
	return &BroadcastMessage{typ: t, h: m.h, bh: bh, payload: payload}, nil
}

// broadcastTargets checks targets against t's dispatch and lists them.
func broadcastTargets(t *Type, tg Targets) (BroadcastHeader, error) {
	var bh BroadcastHeader
	wantV := t.Dispatch == DispatchVChannelsAndCChannel || t.Dispatch == DispatchVChannels
	wantC := t.Dispatch == DispatchVChannelsAndCChannel || t.Dispatch == DispatchCChannel
	wantP := t.Dispatch == DispatchAllPChannels
	switch {
	case wantV != (len(tg.VChannels) > 0), wantC != !tg.CChannel.IsZero(), wantP != (len(tg.PChannels) > 0):
		return bh, wrapInvalid(ErrBadTarget, "type %s (%s) got %d vchannels, cchannel %q, %d pchannels",
			t.Name, t.Dispatch, len(tg.VChannels), tg.CChannel, len(tg.PChannels))
	case wantC && !tg.CChannel.IsControl():
		return bh, wrapInvalid(ErrBadTarget, "%s is not a control channel", tg.CChannel)
	}
	for _, v := range tg.VChannels {
		if v.IsZero() || v.IsControl() || slices.Contains(bh.VChannels, v) {
			return bh, wrapInvalid(ErrBadTarget, "vchannel target %q is empty, the cchannel or repeated", v)
		}
		bh.VChannels = append(bh.VChannels, v)
	}
	if wantC {
		bh.VChannels = append(bh.VChannels, tg.CChannel)
	}
	for _, p := range tg.PChannels {
		if p.IsZero() || slices.Contains(bh.PChannels, p) {
			return bh, wrapInvalid(ErrBadTarget, "pchannel target %q is empty or repeated", p)
		}
		bh.PChannels = append(bh.PChannels, p)
	}
	return bh, nil
}

// Type returns the message type.
func (b *BroadcastMessage) Type() *Type { return b.typ }

// Payload returns the payload; callers must not modify it.
func (b *BroadcastMessage) Payload() []byte { return b.payload }

// Broadcast returns a copy of the broadcast header (ID zero until set).
func (b *BroadcastMessage) Broadcast() BroadcastHeader { return b.bh.clone() }

// Keys returns the normalized resource keys.
func (b *BroadcastMessage) Keys() []ResourceKey { return slices.Clone(b.bh.Keys) }

// SetID assigns the broadcast task's identity.
func (b *BroadcastMessage) SetID(id uint64) { b.bh.ID = id }

// Split returns one mutable message per target, each carrying the broadcast
// header, in target order (VChannels, then CChannel, then PChannels).
func (b *BroadcastMessage) Split() []*MutableMessage {
	out := make([]*MutableMessage, 0, len(b.bh.VChannels)+len(b.bh.PChannels))
	for _, v := range b.bh.VChannels {
		out = append(out, b.replica(Header{PChannel: v.PChannel(), VChannel: v}))
	}
	for _, p := range b.bh.PChannels {
		out = append(out, b.replica(Header{PChannel: p}))
	}
	return out
}

// BroadcastMsgID is the deduplication identity of a broadcast's replica on
// one target, so that a resumed broadcast never lands twice.
func BroadcastMsgID(id uint64, target Header) string {
	name := target.VChannel.String()
	if target.VChannel.IsZero() {
		name = target.PChannel.String()
	}
	return "bc-" + strconv.FormatUint(id, 10) + "-" + name
}

// replica builds the message of one target.
func (b *BroadcastMessage) replica(target Header) *MutableMessage {
	h := b.h.clone()
	h.PChannel, h.VChannel = target.PChannel, target.VChannel
	bh := b.bh.clone()
	h.Broadcast = &bh
	if bh.ID != 0 {
		h.MsgID = BroadcastMsgID(bh.ID, target)
	}
	return &MutableMessage{typ: b.typ, h: h, payload: b.payload}
}
