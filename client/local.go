package client

import (
	"context"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// Local is a node of this process that a client may call directly instead
// of through NATS: the local bypass. embedded/system provides one
// (System.Local); pass it with WithLocal. A client has none by default.
type Local interface {
	// AppendLocal appends msgs to p of cluster c if a node of this
	// process serves it, with the semantics and errors of an append
	// request (each message lands or fails on its own); served is false,
	// and nothing is appended, when none does.
	AppendLocal(ctx context.Context, c streamwal.Cluster, p streamwal.PChannel, msgs []*messages.MutableMessage) (out []*messages.ImmutableMessage, errs []error, served bool)
}

// WithLocal sets the local bypass: appends to a PChannel that l serves
// call it directly, with the same semantics and errors as through NATS.
func WithLocal(l Local) Option { return func(o *options) { o.local = l } }

// WithoutLocalBypass always goes through NATS, even to a node in this
// process (it undoes WithLocal).
func WithoutLocalBypass() Option { return func(o *options) { o.local = nil } }
