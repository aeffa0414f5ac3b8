package jetstream

import (
	"context"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream/pipeline"
	"github.com/streamwal/streamwal/messages"
)

// Future states: a request is queued until the sequencer takes it into a
// batch, or until its waiter gives up first.
const (
	stateQueued int32 = iota
	stateTaken
	stateAbandoned
)

// AppendFuture is the pending result of an append.
type AppendFuture struct {
	// req is the append as the writer's pipeline orders it.
	req   pipeline.Request[*AppendFuture]
	msgs  []*nats.Msg
	ids   []string
	state atomic.Int32
	done  chan struct{}
	seqs  []messages.MessageID
	err   error
	// The storage of a one-message append, which is the common case: its
	// message, ID and sequence cost no allocations of their own.
	oneMsg [1]*nats.Msg
	oneID  [1]string
	oneSeq [1]messages.MessageID
}

// newFuture makes the future of an append of n messages, with room for
// them and their message IDs.
func newFuture(n int) *AppendFuture {
	f := &AppendFuture{done: make(chan struct{})}
	f.msgs, f.ids = f.oneMsg[:], f.oneID[:]
	if n > 1 {
		f.msgs, f.ids = make([]*nats.Msg, n), make([]string, n)
	}
	f.req.Init(f, f.ids)
	return f
}

// newSeqs returns room for n sequences.
func (f *AppendFuture) newSeqs(n int) []messages.MessageID {
	if n == 1 {
		return f.oneSeq[:]
	}
	return make([]messages.MessageID, n)
}

// failedFuture is a future that already failed.
func failedFuture(err error) *AppendFuture {
	f := &AppendFuture{done: make(chan struct{}), err: err}
	close(f.done)
	return f
}

// Done is closed when the result is known.
func (f *AppendFuture) Done() <-chan struct{} { return f.done }

// Result returns the MessageIDs or the error; valid once Done is closed.
func (f *AppendFuture) Result() ([]messages.MessageID, error) { return f.seqs, f.err }

// MsgIDs are the message IDs the messages are stored under: the caller's,
// or one the writer gave a message that had none (which a reader of the
// stream sees as its message ID).
func (f *AppendFuture) MsgIDs() []string { return f.ids }

// Wait blocks for the result. If ctx ends first and the sequencer has not
// started the append, the append is abandoned (never written) and Wait
// returns ctx's error; if it has started, Wait returns an error matching
// streamwal.ErrUnknownOutcome.
func (f *AppendFuture) Wait(ctx context.Context) ([]messages.MessageID, error) {
	select {
	case <-f.done:
		return f.seqs, f.err
	default:
	}
	select {
	case <-f.done:
		return f.seqs, f.err
	case <-ctx.Done():
		if f.state.CompareAndSwap(stateQueued, stateAbandoned) {
			return nil, ctx.Err()
		}
		select {
		case <-f.done:
			return f.seqs, f.err
		default:
		}
		return nil, streamwal.Errorf(streamwal.CodeUnknownOutcome, "append in flight when the wait ended: %w", ctx.Err())
	}
}

// take marks the future as started; false if its waiter abandoned it.
func (f *AppendFuture) take() bool {
	return f.state.CompareAndSwap(stateQueued, stateTaken) || f.state.Load() == stateTaken
}

// resolve completes the future with the stream sequence of its first message.
func (f *AppendFuture) resolve(first uint64) {
	f.seqs = f.newSeqs(len(f.msgs))
	for i := range f.seqs {
		f.seqs[i] = messages.MessageID(first + uint64(i))
	}
	close(f.done)
}

// resolveEach completes the future with one sequence per message.
func (f *AppendFuture) resolveEach(seqs []uint64) {
	f.seqs = f.newSeqs(len(seqs))
	for i, s := range seqs {
		f.seqs[i] = messages.MessageID(s)
	}
	close(f.done)
}

// fail completes the future with an error.
func (f *AppendFuture) fail(err error) {
	f.err = err
	close(f.done)
}

// settle completes the future with what its pipeline decided.
func (f *AppendFuture) settle(r pipeline.Result[*AppendFuture]) {
	switch {
	case r.Err != nil:
		f.fail(r.Err)
	case r.Seqs != nil:
		f.resolveEach(r.Seqs)
	default:
		f.resolve(r.First)
	}
}
