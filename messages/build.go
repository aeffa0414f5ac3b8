package messages

import (
	"slices"

	"github.com/streamwal/streamwal"
)

// Option sets a writer-supplied property on a message being built.
type Option func(*Header) error

// WithMsgID sets the deduplication identity (default: none; the WAL assigns
// one). Printable ASCII, at most 256 bytes.
func WithMsgID(id string) Option {
	return func(h *Header) error {
		if err := checkMsgID(id); err != nil {
			return err
		}
		h.MsgID = id
		return nil
	}
}

// WithProperty sets an application property. Keys are 1 to 64 ASCII
// letters, digits, '-' or '_'; values are printable, at most 4 KiB.
func WithProperty(key, value string) Option {
	return func(h *Header) error {
		if err := checkProp(key, value); err != nil {
			return wrapInvalid(ErrMalformed, "property %q: %v", key, err)
		}
		if h.Props == nil {
			h.Props = map[string]string{}
		}
		if _, ok := h.Props[key]; !ok && len(h.Props) >= MaxProps {
			return wrapInvalid(ErrMalformed, "more than %d properties", MaxProps)
		}
		h.Props[key] = value
		return nil
	}
}

// WithTrace sets the W3C trace context.
func WithTrace(parent, state string) Option {
	return func(h *Header) error {
		if len(parent) > 256 || len(state) > 512 || !printable(parent) || !printable(state) {
			return wrapInvalid(ErrMalformed, "trace context is not a printable W3C header")
		}
		h.TraceParent, h.TraceState = parent, state
		return nil
	}
}

// WithUnreplicable keeps the message out of replication.
func WithUnreplicable() Option {
	return func(h *Header) error { h.Unreplicable = true; return nil }
}

// WithDML describes a DML message's partition and rows.
func WithDML(partitionID int64, rows uint64) Option {
	return func(h *Header) error {
		h.DML = &DMLHeader{PartitionID: partitionID, Rows: rows}
		return nil
	}
}

// WithTxn makes the message part of a transaction.
func WithTxn(ctx TxnContext) Option {
	return func(h *Header) error {
		if ctx.ID == 0 || ctx.Keepalive < MinKeepalive {
			return wrapInvalid(ErrMalformed, "txn context needs an id and a keepalive of at least %v", MinKeepalive)
		}
		h.Txn = &ctx
		return nil
	}
}

// New builds a message of a VChannel-scoped type (dispatch VChannel, or one
// replica of a broadcast type) for v. A body-typed payload must be the
// type's JSON body (see [MarshalBody]).
func (c *Codec) New(t *Type, v streamwal.VChannel, payload []byte, opts ...Option) (*MutableMessage, error) {
	if err := c.checkType(t); err != nil {
		return nil, err
	}
	if t.Dispatch.PChannelLevel() || v.IsZero() {
		return nil, wrapInvalid(ErrBadTarget, "type %s (%s) needs a vchannel", t.Name, t.Dispatch)
	}
	return c.build(t, Header{PChannel: v.PChannel(), VChannel: v}, payload, opts)
}

// NewPChannel builds a PChannel-level message (time tick, barrier, one
// replica of a cluster barrier) for p.
func (c *Codec) NewPChannel(t *Type, p streamwal.PChannel, payload []byte, opts ...Option) (*MutableMessage, error) {
	if err := c.checkType(t); err != nil {
		return nil, err
	}
	if !t.Dispatch.PChannelLevel() || p.IsZero() {
		return nil, wrapInvalid(ErrBadTarget, "type %s (%s) is not PChannel-level", t.Name, t.Dispatch)
	}
	return c.build(t, Header{PChannel: p}, payload, opts)
}

// NewBody marshals body and builds a VChannel-scoped message with it.
func (c *Codec) NewBody(t *Type, v streamwal.VChannel, body any, opts ...Option) (*MutableMessage, error) {
	if err := c.checkType(t); err != nil {
		return nil, err
	}
	payload, err := MarshalBody(t, body)
	if err != nil {
		return nil, err
	}
	return c.New(t, v, payload, opts...)
}

// NewPChannelBody marshals body and builds a PChannel-level message with it.
func (c *Codec) NewPChannelBody(t *Type, p streamwal.PChannel, body any, opts ...Option) (*MutableMessage, error) {
	if err := c.checkType(t); err != nil {
		return nil, err
	}
	payload, err := MarshalBody(t, body)
	if err != nil {
		return nil, err
	}
	return c.NewPChannel(t, p, payload, opts...)
}

// checkType refuses nil, foreign and synthetic types.
func (c *Codec) checkType(t *Type) error {
	switch {
	case t == nil:
		return wrapInvalid(ErrUnknownType, "nil type")
	case !c.reg.Has(t):
		return wrapInvalid(ErrUnknownType, "%s is not in this codec's registry", t.Name)
	case t.Is(FlagSynthetic):
		return wrapInvalid(ErrBadType, "%s is read-side only", t.Name)
	}
	return nil
}

// build applies options and validates payload and body.
func (c *Codec) build(t *Type, h Header, payload []byte, opts []Option) (*MutableMessage, error) {
	if len(payload) > c.maxPayload {
		return nil, wrapInvalid(ErrPayloadTooLarge, "%d bytes exceeds %d", len(payload), c.maxPayload)
	}
	for _, o := range opts {
		if err := o(&h); err != nil {
			return nil, err
		}
	}
	if t.Is(FlagUnreplicable) {
		h.Unreplicable = true
	}
	if t.Is(FlagNotTraced) {
		h.TraceParent, h.TraceState = "", ""
	}
	if h.PChannel.IsZero() { // a broadcast before Split has no channel yet
		if h.Txn != nil {
			return nil, wrapInvalid(ErrBadTarget, "a broadcast cannot be part of a transaction")
		}
	} else if err := checkShape(t, &h); err != nil {
		return nil, err
	}
	if err := checkBody(t, payload); err != nil {
		return nil, err
	}
	return &MutableMessage{typ: t, h: h, payload: payload}, nil
}

// checkShape enforces the rules every message obeys, whether built here or
// decoded: a real type, a target that fits its dispatch, a transaction
// context only on transaction types, a broadcast header only on broadcast
// types (and naming the message's own channel), no trace on untraced types.
func checkShape(t *Type, h *Header) error {
	if t.Is(FlagSynthetic) {
		return wrapInvalid(ErrBadType, "%s is read-side only", t.Name)
	}
	if err := checkTarget(t, h.PChannel, h.VChannel); err != nil {
		return err
	}
	if h.Txn != nil {
		if err := checkTxn(t, *h.Txn); err != nil {
			return err
		}
	}
	if t.Is(FlagNotTraced) && (h.TraceParent != "" || h.TraceState != "") {
		return wrapInvalid(ErrMalformed, "type %s carries no trace context", t.Name)
	}
	return checkBroadcast(t, h)
}

// checkTarget verifies that a channel fits a type's dispatch.
func checkTarget(t *Type, p streamwal.PChannel, v streamwal.VChannel) error {
	switch {
	case p.IsZero():
		return wrapInvalid(ErrBadTarget, "message of type %s has no pchannel", t.Name)
	case t.Dispatch.PChannelLevel() != v.IsZero():
		return wrapInvalid(ErrBadTarget, "type %s (%s) cannot target %q", t.Name, t.Dispatch, v)
	case v.IsZero():
		return nil
	case v.PChannel() != p:
		return wrapInvalid(ErrBadTarget, "vchannel %s is not on %s", v, p)
	case t.Dispatch == DispatchVChannelsAndCChannel:
		return nil
	case v.IsControl() != (t.Dispatch == DispatchCChannel):
		return wrapInvalid(ErrBadTarget, "type %s (%s) cannot target %s", t.Name, t.Dispatch, v)
	}
	return nil
}

// checkBroadcast verifies a message's broadcast header against its type.
func checkBroadcast(t *Type, h *Header) error {
	b := h.Broadcast
	if b == nil {
		return nil
	}
	if !t.Dispatch.IsBroadcast() {
		return wrapInvalid(ErrBadTarget, "type %s is not a broadcast type", t.Name)
	}
	if h.Replicate != nil {
		return nil // targets name the source cluster's channels
	}
	if h.VChannel.IsZero() && !slices.Contains(b.PChannels, h.PChannel) ||
		!h.VChannel.IsZero() && !slices.Contains(b.VChannels, h.VChannel) {
		return wrapInvalid(ErrBadTarget, "broadcast %d does not target this message's channel", b.ID)
	}
	return nil
}

// checkMsgID validates a deduplication identity.
func checkMsgID(id string) error {
	if id == "" || len(id) > MaxMsgIDLen || !printable(id) {
		return wrapInvalid(ErrMalformed, "message id %q: want 1 to %d printable bytes", id, MaxMsgIDLen)
	}
	return nil
}

// checkProp validates an application property.
func checkProp(key, value string) error {
	if key == "" || len(key) > MaxPropKeyLen {
		return wrapInvalid(ErrMalformed, "property key %q: want 1 to %d bytes", key, MaxPropKeyLen)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return wrapInvalid(ErrMalformed, "property key %q: only letters, digits, '-' and '_'", key)
		}
	}
	if len(value) > MaxPropValueLen || !printable(value) {
		return wrapInvalid(ErrMalformed, "property %q: value must be printable, at most %d bytes", key, MaxPropValueLen)
	}
	return nil
}
