// Package wire is the request-reply protocol between the client, the
// coordinator and the nodes (DESIGN.md §2, §3): the JSON request and reply
// types of every `walapi` subject, the KV records the coordinator and the
// nodes share, and the two halves of a call, [Call] and [Respond], which
// carry typed errors across the hop with their codes intact. The
// coordinator and the node never import each other; they meet here.
package wire

import (
	"context"
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
}

// ErrorOf converts err for the wire (nil for nil).
func ErrorOf(err error) *Error {
	if err == nil {
		return nil
	}
	var e *streamwal.Error
	if errors.As(err, &e) {
		return &Error{Code: e.Code, Message: e.Message}
	}
	return &Error{Code: streamwal.CodeOf(err), Message: err.Error()}
}

// Err converts e back into a streamwal error (nil for nil).
func (e *Error) Err() error {
	if e == nil {
		return nil
	}
	return &streamwal.Error{Code: e.Code, Message: e.Message}
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
// error reply comes back as the streamwal error it was.
func Call(ctx context.Context, nc Requester, subject string, req, reply any) error {
	data, err := json.Marshal(req)
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

// Handler answers one request: it decodes data into its request type
// (see Decode) and returns a reply body or an error.
type Handler func(ctx context.Context, data []byte) (any, error)

// Respond encodes a handler's result as the reply to m.
func Respond(m *nats.Msg, body any, err error) error {
	env := envelope{Error: ErrorOf(err)}
	if err == nil && body != nil {
		raw, merr := json.Marshal(body)
		if merr != nil {
			env.Error = ErrorOf(streamwal.Errorf(streamwal.CodeInternal, "encode reply: %v", merr))
		} else {
			env.Body = raw
		}
	}
	data, err := json.Marshal(env)
	if err != nil {
		return fmt.Errorf("encode reply envelope: %w", err)
	}
	return m.Respond(data)
}

// Decode parses a request; malformed input is streamwal.ErrInvalidArgument.
func Decode(data []byte, req any) error {
	if err := json.Unmarshal(data, req); err != nil {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "malformed request: %v", err)
	}
	return nil
}
