package client

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// testRun builds a run of n retried entries (with message IDs m0, m1,
// ...) and no request behind it: settleRun is judged on the outcomes it
// is handed.
func testRun(t *testing.T, n int, retry bool) (*run, []*entry) {
	t.Helper()
	codec, err := messages.NewCodec(DefaultCluster, nil)
	require.NoError(t, err)
	p, err := streamwal.NewPChannel("pchan", 0)
	require.NoError(t, err)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	r := &run{}
	entries := make([]*entry, n)
	for i := range entries {
		m, err := codec.New(messages.TypeInsert, v, []byte(fmt.Sprint(i)))
		require.NoError(t, err)
		if retry {
			require.NoError(t, m.SetMsgID(fmt.Sprint("m", i)))
		}
		entries[i] = &entry{ctx: context.Background(), m: m, retry: retry, run: r, done: make(chan struct{})}
	}
	r.pending = entries
	return r, entries
}

// landedAt is the outcome of an entry stored at id.
func landedAt(id messages.MessageID) outcome { return outcome{res: AppendResult{ID: id}} }

// refused is the outcome of an entry refused with code.
func refused(code streamwal.Code) outcome {
	return outcome{err: streamwal.Errorf(code, "refused for the test")}
}

// resolved reports whether e is resolved.
func resolved(e *entry) bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// TestSettleRunRetriesInOrder: of a request's entries, those that landed
// resolve, and those refused retriably go back to the head of their run,
// in call order, ahead of what the run has not sent yet; the ones refused
// while a later one landed are bound to land below it.
func TestSettleRunRetriesInOrder(t *testing.T) {
	r, es := testRun(t, 6, true)
	sent, rest := es[:4], es[4:]
	r.pending = rest
	cause := settleRun(r, sent, []outcome{landedAt(10), refused(streamwal.CodeUnavailable), landedAt(12), refused(streamwal.CodeUnknownOutcome)})
	require.ErrorIs(t, cause, streamwal.ErrUnavailable)
	require.True(t, resolved(es[0]) && resolved(es[2]))
	require.NoError(t, es[0].err)
	require.Equal(t, messages.MessageID(12), es[2].res.ID)
	require.Equal(t, []*entry{es[1], es[3], es[4], es[5]}, r.pending, "retries first, in call order")
	require.Equal(t, messages.MessageID(12), es[1].before, "refused below a landing")
	require.Zero(t, es[3].before, "nothing of its run landed after it")
	require.Nil(t, r.failed)

	// The retry of es[1] returns where an earlier attempt landed (below
	// es[2]): in order. A fresh landing above es[2] breaks the order, and
	// the caller hears it.
	r2, more := testRun(t, 2, true)
	r2.pending = nil
	more[0].before, more[1].before = 12, 12
	require.NoError(t, settleRun(r2, more, []outcome{landedAt(11), landedAt(13)}))
	require.NoError(t, more[0].err)
	require.ErrorIs(t, more[1].err, streamwal.ErrInternal)
	require.Empty(t, r2.pending)
}

// TestSettleRunStopsAtFinalError: an entry refused for good fails, and
// what its run never sent is not sent: it fails with the same code; an
// entry of the same request refused retriably is still retried.
func TestSettleRunStopsAtFinalError(t *testing.T) {
	r, es := testRun(t, 5, true)
	r.pending = es[3:]
	settleRun(r, es[:3], []outcome{refused(streamwal.CodeUnavailable), refused(streamwal.CodeLifecycle), landedAt(7)})
	require.ErrorIs(t, es[1].err, streamwal.ErrLifecycle)
	require.ErrorIs(t, r.failed, streamwal.ErrLifecycle)
	require.NoError(t, es[2].err)
	for _, e := range es[3:] {
		require.True(t, resolved(e))
		require.ErrorIs(t, e.err, streamwal.ErrLifecycle, "not sent after a final error")
	}
	require.Equal(t, []*entry{es[0]}, r.pending, "the retriable one is retried")

	_, err := collect(es[1:])
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
}

// TestSettleRunTransactionMessagesNotRetried: messages without retries
// (a transaction's) fail with what the request said, a timeout as an
// unknown outcome, and their run stops.
func TestSettleRunTransactionMessagesNotRetried(t *testing.T) {
	r, es := testRun(t, 3, false)
	r.pending = es[1:]
	cause := settleRun(r, es[:1], []outcome{{err: streamwal.Errorf(streamwal.CodeUnavailable, "no answer: %w", context.DeadlineExceeded)}})
	require.NoError(t, cause, "nothing to retry")
	require.ErrorIs(t, es[0].err, streamwal.ErrUnknownOutcome)
	require.ErrorIs(t, es[1].err, streamwal.ErrUnknownOutcome)
	require.Empty(t, r.pending)
}
