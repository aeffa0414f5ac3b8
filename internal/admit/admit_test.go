package admit_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/internal/admit"
)

// TestMain checks that no test leaves a waiter's goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// long is a wait no test reaches: a waiter returns because room freed.
const long = time.Minute

// TestLimits checks that claims are admitted while they fit under the
// total and the per-key limit, refused at once past them (wait 0) with
// the typed error, and admitted again once released.
func TestLimits(t *testing.T) {
	ctx := context.Background()
	g := admit.New[string](100, 60)
	require.NoError(t, g.Acquire(ctx, 0, admit.Claim[string]{Key: "a", Weight: 50}))
	require.NoError(t, g.Acquire(ctx, 0, admit.Claim[string]{Key: "b", Weight: 40}))
	err := g.Acquire(ctx, 0, admit.Claim[string]{Key: "a", Weight: 20})
	require.ErrorIs(t, err, streamwal.ErrResourceExhausted, "a is at 50 of 60")
	require.True(t, streamwal.IsRetriable(err))
	require.ErrorIs(t, g.Acquire(ctx, 0, admit.Claim[string]{Key: "c", Weight: 20}), streamwal.ErrResourceExhausted,
		"90 of 100 in flight")
	require.NoError(t, g.Acquire(ctx, 0, admit.Claim[string]{Key: "c", Weight: 10}))
	total, under := g.InFlight("a")
	require.Equal(t, int64(100), total)
	require.Equal(t, int64(50), under)

	g.Release("a", 50)
	require.NoError(t, g.Acquire(ctx, 0, admit.Claim[string]{Key: "a", Weight: 45}))
	total, under = g.InFlight("a")
	require.Equal(t, int64(95), total)
	require.Equal(t, int64(45), under)
}

// TestWholeOrNothing checks that a claim over several keys is admitted
// only if every key has room, and leaves nothing in flight when refused.
func TestWholeOrNothing(t *testing.T) {
	ctx := context.Background()
	g := admit.New[string](0, 10)
	require.NoError(t, g.Acquire(ctx, 0, admit.Claim[string]{Key: "a", Weight: 8}))
	err := g.Acquire(ctx, 0, admit.Claim[string]{Key: "b", Weight: 5}, admit.Claim[string]{Key: "a", Weight: 5})
	require.ErrorIs(t, err, streamwal.ErrResourceExhausted)
	total, under := g.InFlight("b")
	require.Equal(t, int64(8), total)
	require.Zero(t, under)
}

// TestIdleAdmitsAnything checks that a claim larger than the limits is
// admitted alone when nothing is in flight (under its key, and at all),
// and not beside anything.
func TestIdleAdmitsAnything(t *testing.T) {
	ctx := context.Background()
	g := admit.New[string](100, 10)
	require.NoError(t, g.Acquire(ctx, 0, admit.Claim[string]{Key: "a", Weight: 500}))
	require.ErrorIs(t, g.Acquire(ctx, 0, admit.Claim[string]{Key: "b", Weight: 1}), streamwal.ErrResourceExhausted)
	g.Release("a", 500)
	require.NoError(t, g.Acquire(ctx, 0, admit.Claim[string]{Key: "b", Weight: 1}))
	require.NoError(t, g.Acquire(ctx, 0, admit.Claim[string]{Key: "a", Weight: 50}), "a is idle, 1 of 100 in flight")
}

// TestWaiterWokenByRelease checks that a claim that does not fit waits
// and is admitted when a release makes room.
func TestWaiterWokenByRelease(t *testing.T) {
	g := admit.New[string](10, 0)
	require.NoError(t, g.Acquire(context.Background(), 0, admit.Claim[string]{Key: "a", Weight: 10}))
	done := make(chan error)
	go func() { done <- g.Acquire(context.Background(), long, admit.Claim[string]{Key: "b", Weight: 5}) }()
	require.Eventually(t, func() bool { return g.Waiters() == 1 }, 10*time.Second, time.Millisecond)
	g.Release("a", 4)
	require.Equal(t, 1, g.Waiters(), "6 + 5 is over 10: still waiting")
	g.Release("a", 1)
	require.NoError(t, <-done)
	require.Zero(t, g.Waiters())
	total, under := g.InFlight("b")
	require.Equal(t, int64(10), total)
	require.Equal(t, int64(5), under)
}

// TestWaitRunsOut checks that a waiter is refused with the typed error
// once its wait ran out, or as soon as its context ends (the error wraps
// the context's), and leaves nothing in flight.
func TestWaitRunsOut(t *testing.T) {
	g := admit.New[string](10, 0)
	require.NoError(t, g.Acquire(context.Background(), 0, admit.Claim[string]{Key: "a", Weight: 10}))
	err := g.Acquire(context.Background(), 5*time.Millisecond, admit.Claim[string]{Key: "b", Weight: 1})
	require.ErrorIs(t, err, streamwal.ErrResourceExhausted)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- g.Acquire(ctx, long, admit.Claim[string]{Key: "b", Weight: 1}) }()
	require.Eventually(t, func() bool { return g.Waiters() == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	err = <-done
	require.ErrorIs(t, err, streamwal.ErrResourceExhausted)
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, g.Waiters())
	total, _ := g.InFlight("b")
	require.Equal(t, int64(10), total)
}

// TestConcurrentBounds has many goroutines acquire and release random
// claims under two keys (each claim within the limits, so the idle rule
// never applies) and checks that what they hold never exceeds the limits,
// that every claim is eventually admitted (waits are long) and that
// everything is released at the end. Run with -race.
func TestConcurrentBounds(t *testing.T) {
	const total, perKey = 100, 60
	g := admit.New[int](total, perKey)
	var held atomic.Int64
	var byKey [2]atomic.Int64
	var violations atomic.Int64
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 200 {
				k, weight := r.IntN(2), int64(1+r.IntN(30))
				if err := g.Acquire(context.Background(), long, admit.Claim[int]{Key: k, Weight: weight}); err != nil {
					t.Error(err)
					return
				}
				all, under := held.Add(weight), byKey[k].Add(weight)
				if all > total || under > perKey {
					violations.Add(1)
				}
				byKey[k].Add(-weight)
				held.Add(-weight)
				g.Release(k, weight)
			}
		})
	}
	wg.Wait()
	require.Zero(t, violations.Load(), "held more than the limits")
	all, under := g.InFlight(0)
	require.Zero(t, all)
	require.Zero(t, under)
	require.Zero(t, g.Waiters())
}
