package client_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
)

// TestPendingBounds checks the client's backpressure with the nodes
// stopped and the append subjects taken by watchers that answer nothing,
// so that every admitted append stays held: of 100 callers appending
// 1 KiB at once, at most what the bound holds (each message counts its
// payload and about 1 KiB more) are admitted, and every other one fails
// with streamwal.ErrResourceExhausted after the pending wait, nothing of
// it sent; the per-PChannel bound leaves room for another PChannel, and
// the per-client bound does not. Close fails what was held.
func TestPendingBounds(t *testing.T) {
	const (
		callers = 100
		bound   = 16 << 10
		payload = 1 << 10
		// admitted bounds how many messages of payload fit in bound.
		admitted = bound / (payload + 1<<10)
	)
	s := newSystem(t)
	ctx := testCtx(t)
	perPChannel := newClient(t, s, client.WithoutLocalBypass(), client.WithTimeout(200*time.Millisecond),
		client.WithMaxPendingPerPChannel(bound), client.WithPendingWait(20*time.Millisecond))
	perClient := newClient(t, s, client.WithoutLocalBypass(), client.WithTimeout(200*time.Millisecond),
		client.WithMaxPending(bound), client.WithPendingWait(20*time.Millisecond))
	_, v1 := createCollection(t, ctx, perPChannel)
	_, v2 := createCollection(t, ctx, perPChannel)
	for v2.PChannel() == v1.PChannel() {
		_, v2 = createCollection(t, ctx, perPChannel)
	}
	for _, n := range s.Nodes() {
		s.StopNode(n.ID(), false)
	}
	mo1, mo2 := watchAppends(t, s, perPChannel, v1.PChannel()), watchAppends(t, s, perPChannel, v2.PChannel())

	// One PChannel full: the bound refuses the rest; the other PChannel
	// still takes an append.
	held := flood(t, ctx, perPChannel, callers, payload, func(int) streamwal.VChannel { return v1 }, admitted)
	require.Eventually(t, func() bool { return len(mo1.requests(t)) > 0 }, 10*time.Second, time.Millisecond)
	other := make(chan error, 1)
	go func() {
		defer close(other)
		_, err := perPChannel.AppendBytes(ctx, v2, make([]byte, payload))
		other <- err
	}()
	require.Eventually(t, func() bool { return len(mo2.requests(t)) > 0 }, 10*time.Second, time.Millisecond,
		"the per-PChannel bound of v1 held back an append to v2")

	// The per-client bound holds over both PChannels.
	held2 := flood(t, ctx, perClient, callers, payload, func(i int) streamwal.VChannel { return []streamwal.VChannel{v1, v2}[i%2] }, admitted)

	require.NoError(t, perPChannel.Close())
	require.NoError(t, perClient.Close())
	for _, rest := range []<-chan error{held, held2, other} {
		for err := range rest {
			require.Error(t, err, "nobody answers: nothing lands")
		}
	}
}

// flood starts callers goroutines, each appending payload bytes to
// vchannel(i) through c, and checks that all but admitted of them fail
// with streamwal.ErrResourceExhausted (nothing answers the others: they
// stay held). It returns the errors still to come, closed once every
// caller returned.
func flood(t *testing.T, ctx context.Context, c *client.Client, callers, payload int, vchannel func(i int) streamwal.VChannel,
	admitted int) <-chan error {
	t.Helper()
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			_, err := c.AppendBytes(ctx, vchannel(i), make([]byte, payload))
			errs <- err
		})
	}
	for range callers - admitted {
		select {
		case err := <-errs:
			require.ErrorIs(t, err, streamwal.ErrResourceExhausted)
			require.True(t, streamwal.IsRetriable(err))
		case <-ctx.Done():
			t.Fatalf("fewer than %d of %d callers refused", callers-admitted, callers)
		}
	}
	go func() { wg.Wait(); close(errs) }()
	return errs
}
