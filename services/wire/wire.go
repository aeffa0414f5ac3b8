// Package wire is the request-reply protocol between the client, the
// coordinator and the nodes (DESIGN.md §2, §3): the request and reply
// types of every `walapi` subject, the KV records the coordinator and the
// nodes share, and the two halves of a call, [Call] and [Respond], which
// carry typed errors across the hop with their codes intact, and
// [Handle], which gives every request handler the same prologue (the
// request decoded into its type, the names in it validated) and
// epilogue (a typed reply, or the error alone). The coordinator and the
// node never import each other; they meet here.
//
// Everything travels as JSON, replies in an envelope holding a body or an
// error, except the append request and its reply ([AppendRequest],
// [AppendReply]), which have a compact binary form (see [BinaryVersion]):
// they are the hot path, up to a thousand messages of a kilobyte each per
// request, and encoding/json (with the payloads in base64) was where much
// of the client's and the node's CPU went. [Call], [Respond] and [Decode]
// pick the binary form for any type that implements
// encoding.BinaryMarshaler and encoding.BinaryUnmarshaler; a binary reply
// travels without an envelope, and errors always travel as the JSON
// envelope, whose first byte '{' is never a binary form's first byte.
package wire

import (
	"context"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
)

// Error is the wire form of a streamwal error.
type Error struct {
	Code    streamwal.Code `json:"code"`
	Message string         `json:"message,omitempty"`
	// Reason refines Code with the stable identity of one refusal
	// (streamwal.Reason), so that errors.Is matches it after the hop.
	Reason streamwal.Reason `json:"reason,omitempty"`
}

// ErrorOf converts err for the wire (nil for nil).
func ErrorOf(err error) *Error {
	if err == nil {
		return nil
	}
	var e *streamwal.Error
	if errors.As(err, &e) {
		return &Error{Code: e.Code, Message: e.Message, Reason: e.Reason}
	}
	return &Error{Code: streamwal.CodeOf(err), Message: err.Error()}
}

// Err converts e back into a streamwal error (nil for nil).
func (e *Error) Err() error {
	if e == nil {
		return nil
	}
	return &streamwal.Error{Code: e.Code, Message: e.Message, Reason: e.Reason}
}

// envelope is every reply: a body or an error.
type envelope struct {
	Error *Error          `json:"error,omitempty"`
	Body  json.RawMessage `json:"body,omitempty"`
}

// Requester sends requests; *nats.Conn is one.
type Requester interface {
	RequestWithContext(ctx context.Context, subject string, data []byte) (*nats.Msg, error)
}

// Call sends req to subject and decodes the reply into reply (which may be
// nil). Nobody answering, or no answer before ctx ends, is
// streamwal.ErrUnavailable (retriable: the responder may be moving); an
// error reply comes back as the streamwal error it was. A req that
// implements encoding.BinaryMarshaler goes in its binary form, any other
// as JSON; a binary reply (see [Respond]) needs a reply that implements
// encoding.BinaryUnmarshaler, and is streamwal.ErrInternal otherwise.
func Call(ctx context.Context, nc Requester, subject string, req, reply any) error {
	data, err := encodeRequest(req)
	if err != nil {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "encode request to %s: %v", subject, err)
	}
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
			return streamwal.Errorf(streamwal.CodeUnavailable, "%s: %w", subject, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return streamwal.Errorf(streamwal.CodeUnavailable, "%s: %w", subject, err)
	}
	if len(msg.Data) == 0 || msg.Data[0] != '{' {
		// Not an envelope: a binary body.
		u, ok := reply.(encoding.BinaryUnmarshaler)
		if !ok {
			return streamwal.Errorf(streamwal.CodeInternal, "reply from %s: neither a JSON envelope nor a binary reply", subject)
		}
		if err := u.UnmarshalBinary(msg.Data); err != nil {
			return streamwal.Errorf(streamwal.CodeInternal, "reply from %s: %v", subject, err)
		}
		return nil
	}
	var env envelope
	if err := json.Unmarshal(msg.Data, &env); err != nil {
		return streamwal.Errorf(streamwal.CodeInternal, "reply from %s: %v", subject, err)
	}
	if env.Error != nil {
		return env.Error.Err()
	}
	if reply == nil || len(env.Body) == 0 {
		return nil
	}
	if err := json.Unmarshal(env.Body, reply); err != nil {
		return streamwal.Errorf(streamwal.CodeInternal, "reply from %s: %v", subject, err)
	}
	return nil
}

// encodeRequest is req's binary form if it has one, its JSON otherwise.
func encodeRequest(req any) ([]byte, error) {
	if m, ok := req.(encoding.BinaryMarshaler); ok {
		return m.MarshalBinary()
	}
	return json.Marshal(req)
}

// Handler answers one request: it decodes data into its request type
// (see Decode) and returns a reply body or an error. [Handle] makes one
// of a typed function.
type Handler func(ctx context.Context, data []byte) (any, error)

// Respond encodes a handler's result as the reply to m: a body that
// implements encoding.BinaryMarshaler as its binary form alone, anything
// else (errors always) as the JSON envelope. A binary form that could pass
// for an envelope (empty, or starting with '{') goes in the envelope as
// JSON instead.
func Respond(m *nats.Msg, body any, err error) error {
	env := envelope{Error: ErrorOf(err)}
	if err == nil && body != nil {
		if bm, ok := body.(encoding.BinaryMarshaler); ok {
			raw, merr := bm.MarshalBinary()
			if merr != nil {
				return respondEnvelope(m, envelope{Error: ErrorOf(streamwal.Errorf(streamwal.CodeInternal, "encode reply: %v", merr))})
			}
			if len(raw) > 0 && raw[0] != '{' {
				return m.Respond(raw)
			}
		}
		raw, merr := json.Marshal(body)
		if merr != nil {
			env.Error = ErrorOf(streamwal.Errorf(streamwal.CodeInternal, "encode reply: %v", merr))
		} else {
			env.Body = raw
		}
	}
	return respondEnvelope(m, env)
}

func respondEnvelope(m *nats.Msg, env envelope) error {
	data, err := json.Marshal(env)
	if err != nil {
		return fmt.Errorf("encode reply envelope: %w", err)
	}
	return m.Respond(data)
}

// Decode parses a request: one that implements
// encoding.BinaryUnmarshaler from its binary form, any other from JSON.
// Malformed input is streamwal.ErrInvalidArgument.
//
// Decode may keep data: the messages of an AppendRequest refer to it for
// their Data instead of copying them, so data must not change while the
// request is in use. A nats.Msg's Data qualifies: nats.go (v1.55.0,
// Conn.processMsg) gives every message it delivers, to an asynchronous
// handler as to a synchronous subscription, a Data of its own that it
// never touches again, and a handler that hands its request on to a
// goroutine, as the node's append handler does, keeps it valid there.
func Decode(data []byte, req any) error {
	var err error
	switch u := req.(type) {
	case ownedUnmarshaler:
		err = u.unmarshalOwned(data)
	case encoding.BinaryUnmarshaler:
		err = u.UnmarshalBinary(data)
	default:
		if err := json.Unmarshal(data, req); err != nil {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "malformed request: %v", err)
		}
		return nil
	}
	if err != nil {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "%w", err)
	}
	return nil
}

// MaxTSOCount is the most TimeTicks one TSORequest may ask for: the
// coordinator refuses more, and a node's allocator never draws more.
const MaxTSOCount = 1 << 16
