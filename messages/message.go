package messages

import (
	"bytes"
	"encoding/json"
	"reflect"

	"github.com/streamwal/streamwal"
)

// MutableMessage is a message before append. The WAL's interceptors set its
// TimeTick, LastConfirmed, transaction context and term; a MutableMessage is
// owned by one goroutine at a time.
type MutableMessage struct {
	typ     *Type
	h       Header
	payload []byte
}

// Type returns the message type.
func (m *MutableMessage) Type() *Type { return m.typ }

// Header returns a copy of the properties.
func (m *MutableMessage) Header() Header { return m.h.clone() }

// PChannel returns the physical channel.
func (m *MutableMessage) PChannel() streamwal.PChannel { return m.h.PChannel }

// VChannel returns the target VChannel (zero when PChannel-level).
func (m *MutableMessage) VChannel() streamwal.VChannel { return m.h.VChannel }

// Payload returns the payload; callers must not modify it.
func (m *MutableMessage) Payload() []byte { return m.payload }

// PayloadSize returns the size of the payload in bytes.
func (m *MutableMessage) PayloadSize() int { return len(m.payload) }

// DML returns the DML header if the message has one, without copying the
// rest of the header.
func (m *MutableMessage) DML() (DMLHeader, bool) {
	if m.h.DML == nil {
		return DMLHeader{}, false
	}
	return *m.h.DML, true
}

// TimeTick returns the assigned TimeTick (zero before assignment).
func (m *MutableMessage) TimeTick() TimeTick { return m.h.TimeTick }

// MsgID returns the deduplication identity.
func (m *MutableMessage) MsgID() string { return m.h.MsgID }

// Txn returns the transaction context, or nil.
func (m *MutableMessage) Txn() *TxnContext { return m.h.Txn }

// Size estimates the encoded size: payload plus header values.
func (m *MutableMessage) Size() int { return len(m.payload) + headerSize(&m.h) }

// SetTimeTick assigns the TimeTick.
func (m *MutableMessage) SetTimeTick(t TimeTick) { m.h.TimeTick = t }

// SetLastConfirmed assigns the LastConfirmedMessageID.
func (m *MutableMessage) SetLastConfirmed(id MessageID) { m.h.LastConfirmed = id }

// SetTxn attaches a transaction context (nil detaches it). The context needs
// an ID and a keepalive of at least MinKeepalive, and the type must be a
// transaction body or control type.
func (m *MutableMessage) SetTxn(t *TxnContext) error {
	if t == nil {
		m.h.Txn = nil
		return nil
	}
	if err := checkTxn(m.typ, *t); err != nil {
		return err
	}
	c := *t
	m.h.Txn = &c
	return nil
}

// checkTxn validates a transaction context for a type.
func checkTxn(t *Type, ctx TxnContext) error {
	if ctx.ID == 0 || ctx.Keepalive < MinKeepalive {
		return wrapInvalid(ErrMalformed, "txn context needs an id and a keepalive of at least %v", MinKeepalive)
	}
	if t == nil || !t.Is(FlagTxnBody) && !t.Is(FlagTxnControl) {
		return wrapInvalid(ErrBadTarget, "type %s cannot be part of a transaction", t)
	}
	return nil
}

// Trace is the message's W3C trace context ("" where it has none).
func (m *MutableMessage) Trace() (parent, state string) { return m.h.TraceParent, m.h.TraceState }

// SetTrace sets the W3C trace context, as WithTrace does when the
// message is built; a type that is never traced keeps none.
func (m *MutableMessage) SetTrace(parent, state string) error {
	h := m.h
	if err := WithTrace(parent, state)(&h); err != nil {
		return err
	}
	if !m.typ.Is(FlagNotTraced) {
		m.h.TraceParent, m.h.TraceState = h.TraceParent, h.TraceState
	}
	return nil
}

// SetTerm records the writer's term.
func (m *MutableMessage) SetTerm(term uint64) { m.h.Term = term }

// SetMsgID sets the deduplication identity.
func (m *MutableMessage) SetMsgID(id string) error {
	if err := checkMsgID(id); err != nil {
		return err
	}
	m.h.MsgID = id
	return nil
}

// SetSegment records the segment the WAL assigned an insert to.
func (m *MutableMessage) SetSegment(id int64) {
	if m.h.DML == nil {
		m.h.DML = &DMLHeader{}
	}
	m.h.DML.SegmentID = id
}

// Clone returns a deep copy sharing the (immutable) payload.
func (m *MutableMessage) Clone() *MutableMessage {
	return &MutableMessage{typ: m.typ, h: m.h.clone(), payload: m.payload}
}

// Freeze returns the immutable message the append of m produced at id.
func (m *MutableMessage) Freeze(id MessageID) *ImmutableMessage {
	return &ImmutableMessage{typ: m.typ, id: id, h: m.h.clone(), payload: m.payload}
}

// ImmutableMessage is an appended message with its MessageID. It never
// changes; it is safe to share between goroutines.
type ImmutableMessage struct {
	typ     *Type
	id      MessageID
	h       Header
	payload []byte
	txn     *txnParts
	// headersOnly: read without its payload, which was size bytes.
	headersOnly bool
	size        int
}

// Type returns the message type.
func (m *ImmutableMessage) Type() *Type { return m.typ }

// ID returns the MessageID (the stream sequence).
func (m *ImmutableMessage) ID() MessageID { return m.id }

// Header returns a copy of the properties.
func (m *ImmutableMessage) Header() Header { return m.h.clone() }

// PChannel returns the physical channel.
func (m *ImmutableMessage) PChannel() streamwal.PChannel { return m.h.PChannel }

// VChannel returns the VChannel (zero when PChannel-level).
func (m *ImmutableMessage) VChannel() streamwal.VChannel { return m.h.VChannel }

// TimeTick returns the message's TimeTick.
func (m *ImmutableMessage) TimeTick() TimeTick { return m.h.TimeTick }

// LastConfirmed returns the LastConfirmedMessageID.
func (m *ImmutableMessage) LastConfirmed() MessageID { return m.h.LastConfirmed }

// Txn returns the transaction context, or nil.
func (m *ImmutableMessage) Txn() *TxnContext {
	if m.h.Txn == nil {
		return nil
	}
	c := *m.h.Txn
	return &c
}

// MsgID returns the deduplication identity.
func (m *ImmutableMessage) MsgID() string { return m.h.MsgID }

// Term returns the term of the writer that appended the message.
func (m *ImmutableMessage) Term() uint64 { return m.h.Term }

// Property returns an application property.
func (m *ImmutableMessage) Property(key string) (string, bool) {
	v, ok := m.h.Props[key]
	return v, ok
}

// Payload returns the payload; callers must not modify it. It is nil for a
// message read without its payload (HeadersOnly).
func (m *ImmutableMessage) Payload() []byte { return m.payload }

// PayloadSize returns the size of the payload in bytes, also when the
// message was read without it.
func (m *ImmutableMessage) PayloadSize() int {
	if m.headersOnly {
		return m.size
	}
	return len(m.payload)
}

// HeadersOnly reports whether the message was read without its payload
// (see Codec.DecodeHeadersOnly): its Payload is nil and its Body an error
// matching ErrNoPayload.
func (m *ImmutableMessage) HeadersOnly() bool { return m.headersOnly }

// DML returns the DML header if the message has one, without copying the
// rest of the header.
func (m *ImmutableMessage) DML() (DMLHeader, bool) {
	if m.h.DML == nil {
		return DMLHeader{}, false
	}
	return *m.h.DML, true
}

// Body decodes the JSON body of a built-in type into out, which must be a
// pointer to the type's declared body.
func (m *ImmutableMessage) Body(out any) error {
	if m.headersOnly {
		return wrapInvalid(ErrNoPayload, "%s %d has no body to decode", m.typ.Name, m.id)
	}
	return decodeBody(m.typ, m.payload, out)
}

// Body decodes the JSON body of a built-in type into out, which must be a
// pointer to the type's declared body.
func (m *MutableMessage) Body(out any) error { return decodeBody(m.typ, m.payload, out) }

// MarshalBody encodes body as the payload of type t. body's Go type must be
// t's declared Body.
func MarshalBody(t *Type, body any) ([]byte, error) {
	if t == nil || t.Body == nil || reflect.TypeOf(body) != t.Body {
		return nil, wrapInvalid(ErrBadBody, "type %s does not take a %T body", t, body)
	}
	return json.Marshal(body)
}

// decodeBody decodes payload into out after checking out's type.
func decodeBody(t *Type, payload []byte, out any) error {
	rv := reflect.ValueOf(out)
	if t == nil || t.Body == nil || rv.Kind() != reflect.Pointer || rv.Type().Elem() != t.Body {
		return wrapInvalid(ErrBadBody, "type %s has no %T body", t, out)
	}
	if err := json.Unmarshal(payload, out); err != nil {
		return wrapInvalid(ErrMalformed, "%s body: %v", t.Name, err)
	}
	return nil
}

// checkBody verifies that a payload of a body-typed type decodes as its body.
func checkBody(t *Type, payload []byte) error {
	if t.Body == nil {
		return nil
	}
	if len(bytes.TrimSpace(payload)) == 0 {
		return wrapInvalid(ErrMalformed, "%s body is empty", t.Name)
	}
	return decodeBody(t, payload, reflect.New(t.Body).Interface())
}
