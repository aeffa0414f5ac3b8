package read_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream/faulty"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
)

// faultyOptions are the options of a scanner of e's PChannel reading
// through fb.
func (e *wal) faultyOptions(fb *faulty.Backend, o read.Options) read.Options {
	o.Backend, o.Codec, o.PChannel = fb, e.codec, e.p
	return o
}

// requireInjected checks that err is the unavailability a test injected.
func requireInjected(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, faulty.ErrInjected)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
}

// TestFaultyOpenFails: an Open whose backend fails, in opening the
// scanner or in locating a TimeTick start (its read of the stream's end
// or one of its direct reads), returns the backend's error, opens no
// scanner and leaves no subscription to live ticks behind; once the
// backend answers again, the same Open succeeds.
func TestFaultyOpenFails(t *testing.T) {
	e := newWAL(t)
	var all []written
	for range 8 {
		all = append(all, e.one(e.insert(e.v1)))
	}
	for _, c := range []struct {
		name  string
		op    faulty.Op
		start read.Start
	}{
		{"read", faulty.OpRead, read.Earliest()},
		{"locate's read of the end", faulty.OpRead, read.AtTimeTick(all[3].TimeTick)},
		{"locate's direct read", faulty.OpGet, read.AtTimeTick(all[3].TimeTick)},
	} {
		t.Run(c.name, func(t *testing.T) {
			fb := faulty.New(e.be, nil)
			sw := faulty.NewSwitch(faulty.Fault{Err: faulty.Unavailable()}, c.op)
			fb.SetInjector(sw)
			// Live ticks on a connection of their own, where the backend
			// subscribes to nothing.
			ticks, err := nats.Connect(e.nc.ConnectedUrl())
			require.NoError(t, err)
			defer ticks.Close()
			o := e.faultyOptions(fb, read.Options{Start: c.start, Ticks: ticks})
			sw.On()
			s, err := read.Open(context.Background(), o)
			requireInjected(t, err)
			require.Nil(t, s)
			require.Positive(t, sw.Injected())
			require.Zero(t, ticks.NumSubscriptions(), "no subscription to live ticks left behind")

			sw.Off()
			s, err = read.Open(context.Background(), o)
			require.NoError(t, err)
			defer func() { require.NoError(t, s.Close()) }()
			first := 0
			if c.start.TimeTick != 0 {
				first = 3
			}
			require.Equal(t, wids(all[first:]...), ids(readUntil(t, s, all[len(all)-1].ID)))
		})
	}
}

// TestFaultyLocateTakesNoFailureForTruncation: Locate takes a direct
// read that finds nothing stored for truncation (it moves on above it),
// but returns any other failure of a direct read, whichever of the search's
// reads fails: it never starts a reader at a wrong position.
func TestFaultyLocateTakesNoFailureForTruncation(t *testing.T) {
	e := newWAL(t)
	var all []written
	for range 40 {
		all = append(all, e.one(e.insert(e.v1)))
	}
	require.NoError(t, e.be.Truncate(context.Background(), e.p, all[10].ID))
	at := all[25].TimeTick
	var gets atomic.Int64
	counted := faulty.New(e.be, faulty.When(func(c faulty.Call) bool {
		if c.Op == faulty.OpGet {
			gets.Add(1)
		}
		return false
	}, faulty.Fault{}))
	_, err := read.Locate(context.Background(), counted, e.p, at)
	require.NoError(t, err)
	require.Greater(t, gets.Load(), int64(2), "the search reads the stream more than twice")

	for n := range int(gets.Load()) {
		fb := faulty.New(e.be, faulty.Nth(faulty.OpGet, n+1, faulty.Fault{Err: faulty.Unavailable()}))
		_, err := read.Locate(context.Background(), fb, e.p, at)
		requireInjected(t, err)
	}
}

// TestFaultyNextFails: a Next whose backend read fails returns the
// backend's error and changes neither Last nor Watermark; the next Next
// goes on with the message the failed one did not read, so that nothing
// is lost or delivered twice.
func TestFaultyNextFails(t *testing.T) {
	e := newWAL(t)
	var all []written
	for range 6 {
		all = append(all, e.one(e.insert(e.v1)))
	}
	fb := faulty.New(e.be, nil)
	s, err := read.Open(context.Background(), e.faultyOptions(fb, read.Options{Start: read.Earliest()}))
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	ctx := context.Background()
	var got []*messages.ImmutableMessage
	for range 3 {
		m, err := s.Next(ctx)
		require.NoError(t, err)
		got = append(got, m)
	}
	last, watermark := s.Last(), s.Watermark()
	sw := faulty.NewSwitch(faulty.Fault{Err: faulty.Unavailable()}, faulty.OpNext)
	fb.SetInjector(sw)
	sw.On()
	for range 3 {
		m, err := s.Next(ctx)
		requireInjected(t, err)
		require.Nil(t, m)
	}
	require.Equal(t, last, s.Last())
	require.Equal(t, watermark, s.Watermark())
	sw.Off()
	got = append(got, readUntil(t, s, all[len(all)-1].ID)...)
	require.Equal(t, wids(all...), ids(got))
}

// TestFaultyNextWaitsForTheContext: a Next held up by its backend
// returns once its context ends, with the context's error.
func TestFaultyNextWaitsForTheContext(t *testing.T) {
	e := newWAL(t)
	e.one(e.insert(e.v1))
	hold := make(chan struct{})
	defer close(hold)
	fb := faulty.New(e.be, faulty.When(func(c faulty.Call) bool { return c.Op == faulty.OpNext }, faulty.Fault{Hold: hold}))
	s, err := read.Open(context.Background(), e.faultyOptions(fb, read.Options{Start: read.Earliest()}))
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	m, err := s.Next(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Nil(t, m)
}

// TestFaultyAllEndsWithTheError: All delivers what the backend reads
// and, when a read fails, the failure as its last pair.
func TestFaultyAllEndsWithTheError(t *testing.T) {
	e := newWAL(t)
	var all []written
	for range 5 {
		all = append(all, e.one(e.insert(e.v1)))
	}
	// The first read is the writer's RecoveryBarrier, which the scanner
	// reads but does not deliver; the fourth read fails.
	fb := faulty.New(e.be, faulty.Nth(faulty.OpNext, 4, faulty.Fault{Err: faulty.Unavailable()}))
	s, err := read.Open(context.Background(), e.faultyOptions(fb, read.Options{Start: read.Earliest()}))
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	var got []*messages.ImmutableMessage
	var last error
	for m, err := range s.All(context.Background()) {
		require.NoError(t, last, "a pair after the error")
		if err != nil {
			last = err
			continue
		}
		got = append(got, m)
	}
	requireInjected(t, last)
	require.Equal(t, wids(all[:2]...), ids(got))
}

// TestFaultyUntilReadsNothingMore: past Options.Until, Next returns
// io.EOF without reading the backend, so that a failing backend does not
// fail a reader that read all it asked for.
func TestFaultyUntilReadsNothingMore(t *testing.T) {
	e := newWAL(t)
	var all []written
	for range 4 {
		all = append(all, e.one(e.insert(e.v1)))
	}
	fb := faulty.New(e.be, nil)
	s, err := read.Open(context.Background(), e.faultyOptions(fb, read.Options{Start: read.Earliest(), Until: all[2].ID}))
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	require.Equal(t, wids(all[:3]...), ids(readUntil(t, s, all[2].ID)))
	sw := faulty.NewSwitch(faulty.Fault{Err: faulty.Unavailable()})
	fb.SetInjector(sw)
	sw.On()
	for range 2 {
		m, err := s.Next(context.Background())
		require.ErrorIs(t, err, io.EOF)
		require.Nil(t, m)
	}
	require.Zero(t, sw.Injected(), "nothing read past Until")
}
