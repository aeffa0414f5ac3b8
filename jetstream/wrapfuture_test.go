package jetstream_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// TestFailedFuture: a failed future is done at once with its error, and
// a nil error is not a success.
func TestFailedFuture(t *testing.T) {
	cause := streamwal.Errorf(streamwal.CodeUnavailable, "down")
	f := jetstream.FailedFuture(cause)
	select {
	case <-f.Done():
	default:
		t.Fatal("a failed future is not done")
	}
	ids, err := f.Wait(context.Background())
	require.Nil(t, ids)
	require.Same(t, cause, err)

	_, err = jetstream.FailedFuture(nil).Result()
	require.ErrorIs(t, err, streamwal.ErrInternal)
}

// TestNewFuture: a pending future carries its message IDs, reports an
// unknown outcome to a waiter that gives up, and resolves once, with the
// first result given.
func TestNewFuture(t *testing.T) {
	f, resolve := jetstream.NewFuture([]string{"a", "b"})
	require.Equal(t, []string{"a", "b"}, f.MsgIDs())
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := f.Wait(gone)
	require.ErrorIs(t, err, streamwal.ErrUnknownOutcome, "a wrapper cannot take an append back")
	require.ErrorIs(t, err, context.Canceled)
	select {
	case <-f.Done():
		t.Fatal("resolved before resolve was called")
	default:
	}

	given := []messages.MessageID{7, 8}
	resolve(given, nil)
	given[0] = 0 // the future keeps its own copy
	resolve(nil, errors.New("too late"))
	ids, err := f.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, []messages.MessageID{7, 8}, ids)

	g, fail := jetstream.NewFuture(nil)
	cause := streamwal.Errorf(streamwal.CodeFenced, "newer owner")
	fail([]messages.MessageID{1}, cause)
	ids, err = g.Wait(context.Background())
	require.Nil(t, ids)
	require.Same(t, cause, err)
}
