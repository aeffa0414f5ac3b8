package pipeline

// Request is one append in the pipeline: the message IDs of its messages
// and the shell's payload (its future). The zero Request is not usable:
// Init it, or embed it in the payload and Init it there, which costs the
// append no allocation of its own.
//
// A request refused as a whole because one of its message IDs was already
// stored is re-sent as parts of one message each; a part is a Request of
// its own whose results the pipeline gathers into its parent's.
type Request[T any] struct {
	payload T
	ids     []string
	// solo: goes out alone (after a duplicate refusal); sent: went out at
	// least once, so it may land even if it is later given up; resend: the
	// current unit sends it again (or sends a part of it).
	solo, sent, resend bool
	wasSent            bool // sent before the current unit, for Refused
	// parent and index locate a part in its request.
	parent *Request[T]
	index  int
	// A request split into parts: parts counts the unresolved ones, seqs
	// holds their sequences, landed marks that one landed, settled that
	// the request's result is final.
	parts   int
	seqs    []uint64
	landed  bool
	settled bool
}

// Init sets the request's payload and message IDs (one per message).
func (r *Request[T]) Init(payload T, ids []string) {
	*r = Request[T]{payload: payload, ids: ids}
}

// Payload is what Init was given (a part's is its parent's).
func (r *Request[T]) Payload() T { return r.payload }

// Len is how many messages the request sends.
func (r *Request[T]) Len() int { return len(r.ids) }

// Span is which of the payload's messages the request sends: all of them,
// or a part's one.
func (r *Request[T]) Span() (from, to int) {
	if r.parent != nil {
		return r.index, r.index + 1
	}
	return 0, len(r.ids)
}

// Resend reports whether the unit it is in sends its messages again (or
// a part of an earlier request): the shell clears what the earlier send
// set on them.
func (r *Request[T]) Resend() bool { return r.resend }

// fresh reports whether the request goes out for the first time, whole.
func (r *Request[T]) fresh() bool { return !r.sent && !r.solo && r.parent == nil }

// split makes the parts of one message each.
func (r *Request[T]) split() []*Request[T] {
	parts := make([]*Request[T], len(r.ids))
	for i := range r.ids {
		parts[i] = &Request[T]{payload: r.payload, ids: r.ids[i : i+1], parent: r, index: i, solo: true}
	}
	r.parts = len(parts)
	r.seqs = make([]uint64, len(r.ids))
	return parts
}
