package jetstream

import (
	"sync"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// FailedFuture returns an AppendFuture that has already failed with err:
// what a wrapper of a Writer returns from AppendAsync for an append it
// refuses before handing it on, as a Writer refuses one when it is
// stopped or its input is bad. A nil err is reported as an internal
// error.
func FailedFuture(err error) *AppendFuture {
	if err == nil {
		err = streamwal.Errorf(streamwal.CodeInternal, "a failed append future needs an error")
	}
	return failedFuture(err)
}

// NewFuture returns a pending AppendFuture whose MsgIDs are msgIDs, and
// the function that resolves it: with ids when err is nil, else with err.
// Only the first call resolves it; later calls do nothing. It is for
// wrappers of a Writer that deliver an append's result later than the
// Writer does, or not at all. The append counts as started: a Wait whose
// ctx ends before the future resolves returns an error matching
// streamwal.ErrUnknownOutcome, since a wrapper cannot take back what it
// handed on.
func NewFuture(msgIDs []string) (*AppendFuture, func(ids []messages.MessageID, err error)) {
	f := &AppendFuture{done: make(chan struct{}), ids: msgIDs}
	f.state.Store(stateTaken)
	var once sync.Once
	return f, func(ids []messages.MessageID, err error) {
		once.Do(func() {
			if err != nil {
				f.err = err
			} else {
				f.seqs = append([]messages.MessageID(nil), ids...)
			}
			close(f.done)
		})
	}
}
