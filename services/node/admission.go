package node

import (
	"context"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/internal/admit"
	"github.com/streamwal/streamwal/messages"
)

// Defaults of AdmissionOptions.
const (
	DefaultAdmitPerPChannel = 32 << 20
	DefaultAdmitTotal       = 256 << 20
	DefaultAdmitWait        = 100 * time.Millisecond
)

// AdmissionOptions bound the bytes of appends a node serves at once, so
// that its memory stays bounded however much load its clients offer: an
// append request (its encoded size) or a local append (its messages'
// sizes) is admitted while it fits under both bounds, waits up to Wait
// for room otherwise, and is then refused whole with
// streamwal.ErrResourceExhausted, retriable, with nothing of it written.
// The client retries such a refusal after a backoff. What a node holds
// for appends is then about twice what the bounds admit (each request
// and what it decodes to), plus what waits in its connection's buffers
// while a request waits for room.
type AdmissionOptions struct {
	// PerPChannel bounds the bytes being appended to one PChannel
	// (default DefaultAdmitPerPChannel, 32 MiB).
	PerPChannel int64
	// Total bounds them over the whole node (default DefaultAdmitTotal,
	// 256 MiB).
	Total int64
	// Wait is how long an append waits for room (default
	// DefaultAdmitWait, 100 ms; negative: refused at once). While a
	// request waits, the later requests of its PChannel wait behind it.
	Wait time.Duration
}

// withDefaults fills in the defaults.
func (o AdmissionOptions) withDefaults() AdmissionOptions {
	if o.PerPChannel <= 0 {
		o.PerPChannel = DefaultAdmitPerPChannel
	}
	if o.Total <= 0 {
		o.Total = DefaultAdmitTotal
	}
	switch {
	case o.Wait == 0:
		o.Wait = DefaultAdmitWait
	case o.Wait < 0:
		o.Wait = 0
	}
	return o
}

// admitAppend waits, within the admission wait and ctx (a remote
// request passes the node's life, n.stopped), for room for weight bytes
// of appends to p; the caller releases them (n.admission.Release) once
// answered.
func (n *Node) admitAppend(ctx context.Context, p streamwal.PChannel, weight int64) error {
	err := n.admission.Acquire(ctx, n.cfg.Admission.Wait, admit.Claim[streamwal.PChannel]{Key: p, Weight: weight})
	if err == nil {
		return nil
	}
	if n.stopped.Err() != nil {
		return streamwal.Errorf(streamwal.CodeShuttingDown, "%s: %v", n.cfg.ID, errShuttingDown)
	}
	return streamwal.Errorf(streamwal.CodeResourceExhausted, "node %s: appends to %s: %w", n.cfg.ID, p, err)
}

// localWeight is what a local append of msgs weighs for admission.
func localWeight(msgs []*messages.MutableMessage) int64 {
	var w int64
	for _, m := range msgs {
		w += int64(m.Size())
	}
	return w
}
