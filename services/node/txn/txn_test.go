package txn_test

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/txn"
)

// Fixtures: two VChannels of one PChannel, a base TimeTick with a non-zero
// logical part (so that the deadline arithmetic is checked on the whole
// hybrid value), and a keepalive of 5ms.
var base = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

const keepalive = 5 * time.Millisecond

// ms is n milliseconds of TimeTick time.
func ms(n int64) messages.TimeTick { return messages.TimeTick(n) << messages.LogicalBits }

// tick is the TimeTick n milliseconds after base, with a logical part.
func tick(t testing.TB, n int64, logical uint32) messages.TimeTick {
	t.Helper()
	tt, err := messages.NewTimeTick(base.Add(time.Duration(n)*time.Millisecond), logical)
	require.NoError(t, err)
	return tt
}

func pchannel(t require.TestingT) streamwal.PChannel {
	p, err := streamwal.NewPChannel(streamwal.DefaultPChannelPrefix, 3)
	require.NoError(t, err)
	return p
}

func vchannels(t require.TestingT) (streamwal.VChannel, streamwal.VChannel) {
	p := pchannel(t)
	v1, err := p.VChannel(42, 0)
	require.NoError(t, err)
	v2, err := p.VChannel(42, 1)
	require.NoError(t, err)
	return v1, v2
}

// The package causes, and the root code each comes wrapped in.
var (
	causes = []error{txn.ErrUnknown, txn.ErrExpired, txn.ErrCommitted, txn.ErrRolledBack, txn.ErrAborted, txn.ErrWrongVChannel, txn.ErrDuplicate}
	roots  = map[error]error{
		txn.ErrUnknown:       streamwal.ErrTxnNotFound,
		txn.ErrExpired:       streamwal.ErrTxnExpired,
		txn.ErrCommitted:     streamwal.ErrTxnInvalidState,
		txn.ErrRolledBack:    streamwal.ErrTxnInvalidState,
		txn.ErrAborted:       streamwal.ErrTxnInvalidState,
		txn.ErrWrongVChannel: streamwal.ErrInvalidArgument,
		txn.ErrDuplicate:     streamwal.ErrInvalidArgument,
		// Errors without a package cause: the root alone.
		streamwal.ErrInvalidArgument: streamwal.ErrInvalidArgument,
		streamwal.ErrInternal:        streamwal.ErrInternal,
	}
)

// requireErr asserts that err is exactly want: a package cause (matched
// with errors.Is, and no other cause matches) wrapped in its root code, or,
// for want a root sentinel, an error of that code with no package cause.
func requireErr(t require.TestingT, err, want error) {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	require.Error(t, err)
	root, ok := roots[want]
	require.True(t, ok, "unexpected wanted error %v", want)
	for _, c := range causes {
		if c == want {
			require.ErrorIs(t, err, c)
		} else {
			require.NotErrorIs(t, err, c)
		}
	}
	require.ErrorIs(t, err, root)
	var code *streamwal.Error
	require.True(t, errors.As(root, &code))
	require.Equal(t, code.Code, streamwal.CodeOf(err), "code of %v", err)
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func begin(t *testing.T, tab *txn.Table, id messages.TxnID, v streamwal.VChannel, tt messages.TimeTick, at messages.MessageID) *txn.Session {
	t.Helper()
	s, err := tab.Begin(id, v, keepalive, tt, at)
	require.NoError(t, err)
	return s
}

func body(t *testing.T, tab *txn.Table, id messages.TxnID, v streamwal.VChannel, tt messages.TimeTick) {
	t.Helper()
	_, err := tab.Body(id, v, tt)
	require.NoError(t, err)
}

func requireOldest(t *testing.T, tab *txn.Table, want messages.MessageID, ok bool) {
	t.Helper()
	got, gotOK := tab.Oldest()
	require.Equal(t, ok, gotOK)
	if ok {
		require.Equal(t, want, got)
	}
}

func TestBeginInvalidArguments(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	for _, c := range []struct {
		name string
		id   messages.TxnID
		v    streamwal.VChannel
		ka   time.Duration
	}{
		{"zero id", 0, v1, keepalive},
		{"zero vchannel", 1, streamwal.VChannel{}, keepalive},
		{"zero keepalive", 1, v1, 0},
		{"keepalive below minimum", 1, v1, messages.MinKeepalive - time.Nanosecond},
		{"negative keepalive", 1, v1, -time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			tab := txn.NewTable()
			s, err := tab.Begin(c.id, c.v, c.ka, t0, 10)
			requireErr(t, err, streamwal.ErrInvalidArgument)
			require.Nil(t, s)
			require.Zero(t, tab.Len())
			requireOldest(t, tab, 0, false)
			_, ok := tab.Get(c.id)
			require.False(t, ok)
		})
	}
	t.Run("minimum keepalive", func(t *testing.T) {
		tab := txn.NewTable()
		s, err := tab.Begin(1, v1, messages.MinKeepalive, t0, 10)
		require.NoError(t, err)
		require.Equal(t, messages.TxnContext{ID: 1, Keepalive: messages.MinKeepalive}, s.Context())
		require.Equal(t, t0+ms(1), s.Deadline())
	})
}

func TestBeginFields(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 9, v1, t0, 10)
	require.Equal(t, messages.TxnID(9), s.ID)
	require.Equal(t, v1, s.VChannel)
	require.Equal(t, keepalive, s.Keepalive)
	require.Equal(t, messages.MessageID(10), s.Begin)
	require.Equal(t, t0, s.LastActivity)
	require.Equal(t, txn.Open, s.State)
	require.Zero(t, s.Bodies)
	require.Zero(t, s.InFlight)
	require.Equal(t, messages.TxnContext{ID: 9, Keepalive: keepalive}, s.Context())
	got, ok := tab.Get(9)
	require.True(t, ok)
	require.Same(t, s, got)
	require.Equal(t, 1, tab.Len())
	requireOldest(t, tab, 10, true)
}

func TestBeginDuplicate(t *testing.T) {
	v1, v2 := vchannels(t)
	t0 := tick(t, 0, 7)

	t.Run("live id", func(t *testing.T) {
		tab := txn.NewTable()
		first := begin(t, tab, 1, v1, t0, 10)
		s, err := tab.Begin(1, v2, keepalive, t0+1, 11)
		requireErr(t, err, txn.ErrDuplicate)
		require.Nil(t, s)
		got, ok := tab.Get(1)
		require.True(t, ok)
		require.Same(t, first, got)
		require.Equal(t, v1, got.VChannel)
		require.Equal(t, messages.MessageID(10), got.Begin)
		require.Equal(t, 1, tab.Len())
	})

	t.Run("committing id", func(t *testing.T) {
		tab := txn.NewTable()
		begin(t, tab, 1, v1, t0, 10)
		_, err := tab.StartCommit(1, v1, t0+1)
		require.NoError(t, err)
		_, err = tab.Begin(1, v1, keepalive, t0+2, 11)
		requireErr(t, err, txn.ErrDuplicate)
	})

	t.Run("ended id is reusable", func(t *testing.T) {
		tab := txn.NewTable()
		begin(t, tab, 1, v1, t0, 10)
		require.NoError(t, tab.Rollback(1, v1, t0+1))
		s := begin(t, tab, 1, v2, t0+2, 11)
		require.Equal(t, v2, s.VChannel)
		body(t, tab, 1, v2, t0+3)
		requireOldest(t, tab, 11, true)
	})

	// An ended session whose bodies are still in flight keeps its ID: a
	// new session under it would receive the old bodies' BodyDone.
	t.Run("ended id with bodies in flight", func(t *testing.T) {
		tab := txn.NewTable()
		begin(t, tab, 1, v1, t0, 10)
		body(t, tab, 1, v1, t0+1)
		require.Equal(t, []messages.TxnID{1}, tab.Abort(v1))
		_, err := tab.Begin(1, v1, keepalive, t0+2, 11)
		requireErr(t, err, txn.ErrDuplicate)
		tab.BodyDone(1, true)
		s := begin(t, tab, 1, v1, t0+3, 12)
		require.Zero(t, s.InFlight)
		require.Zero(t, s.Bodies)
	})
}

func TestUnknown(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	begin(t, tab, 1, v1, t0, 10)

	_, err := tab.Body(2, v1, t0+1)
	requireErr(t, err, txn.ErrUnknown)
	ch, err := tab.StartCommit(2, v1, t0+2)
	requireErr(t, err, txn.ErrUnknown)
	require.Nil(t, ch)
	n, err := tab.Commit(2, v1, t0+3)
	requireErr(t, err, txn.ErrUnknown)
	require.Zero(t, n)
	requireErr(t, tab.Rollback(2, v1, t0+4), txn.ErrUnknown)

	// Calls about unknown IDs change nothing.
	tab.BodyDone(2, false)
	tab.BeginDone(2, false)
	tab.CancelCommit(2)
	_, ok := tab.Get(2)
	require.False(t, ok)
	require.Equal(t, 1, tab.Len())
	s, ok := tab.Get(1)
	require.True(t, ok)
	require.Equal(t, txn.Open, s.State)
}

func TestWrongVChannel(t *testing.T) {
	v1, v2 := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	begin(t, tab, 1, v1, t0, 10)

	_, err := tab.Body(1, v2, t0+1)
	requireErr(t, err, txn.ErrWrongVChannel)
	_, err = tab.StartCommit(1, v2, t0+2)
	requireErr(t, err, txn.ErrWrongVChannel)
	requireErr(t, tab.Rollback(1, v2, t0+3), txn.ErrWrongVChannel)

	// The refused calls neither counted nor ended anything.
	s, ok := tab.Get(1)
	require.True(t, ok)
	require.Equal(t, txn.Open, s.State)
	require.Zero(t, s.Bodies)
	require.Equal(t, t0, s.LastActivity)

	body(t, tab, 1, v1, t0+4)
	_, err = tab.StartCommit(1, v1, t0+5)
	require.NoError(t, err)
	tab.BodyDone(1, true)
	_, err = tab.Commit(1, v2, t0+6)
	requireErr(t, err, txn.ErrWrongVChannel)
	n, err := tab.Commit(1, v1, t0+7)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// TestDeadline: Deadline is the last TimeTick at which a session is alive,
// LastActivity + keepalive milliseconds shifted past the logical bits.
func TestDeadline(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 1, v1, t0, 10)
	require.Equal(t, tick(t, 5, 7), s.Deadline())
	require.Equal(t, t0+messages.TimeTick(keepalive.Milliseconds())<<messages.LogicalBits, s.Deadline())
}

func TestExpiryBoundary(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)

	t.Run("body at the deadline is alive and extends it", func(t *testing.T) {
		tab := txn.NewTable()
		s := begin(t, tab, 1, v1, t0, 10)
		d := s.Deadline()
		got, err := tab.Body(1, v1, d)
		require.NoError(t, err)
		require.Same(t, s, got)
		require.Equal(t, d, s.LastActivity)
		require.Equal(t, d+ms(5), s.Deadline())
		require.Equal(t, tick(t, 10, 7), s.Deadline())
	})

	t.Run("body one past the deadline is expired", func(t *testing.T) {
		tab := txn.NewTable()
		s := begin(t, tab, 1, v1, t0, 10)
		_, err := tab.Body(1, v1, s.Deadline()+1)
		requireErr(t, err, txn.ErrExpired)
		require.Equal(t, txn.Expired, s.State)
		require.Zero(t, s.Bodies)
		require.Zero(t, tab.Len())
		requireOldest(t, tab, 0, false)
		_, ok := tab.Get(1)
		require.False(t, ok)
	})

	t.Run("start commit", func(t *testing.T) {
		tab := txn.NewTable()
		s := begin(t, tab, 1, v1, t0, 10)
		_, err := tab.StartCommit(1, v1, s.Deadline())
		require.NoError(t, err)
		tab = txn.NewTable()
		s = begin(t, tab, 1, v1, t0, 10)
		_, err = tab.StartCommit(1, v1, s.Deadline()+1)
		requireErr(t, err, txn.ErrExpired)
	})

	t.Run("commit", func(t *testing.T) {
		tab := txn.NewTable()
		s := begin(t, tab, 1, v1, t0, 10)
		_, err := tab.StartCommit(1, v1, t0+1)
		require.NoError(t, err)
		n, err := tab.Commit(1, v1, s.Deadline())
		require.NoError(t, err)
		require.Zero(t, n)

		tab = txn.NewTable()
		s = begin(t, tab, 1, v1, t0, 10)
		_, err = tab.StartCommit(1, v1, t0+1)
		require.NoError(t, err)
		_, err = tab.Commit(1, v1, s.Deadline()+1)
		requireErr(t, err, txn.ErrExpired)
		require.Zero(t, tab.Len())
	})

	t.Run("rollback", func(t *testing.T) {
		tab := txn.NewTable()
		s := begin(t, tab, 1, v1, t0, 10)
		require.NoError(t, tab.Rollback(1, v1, s.Deadline()))
		tab = txn.NewTable()
		s = begin(t, tab, 1, v1, t0, 10)
		requireErr(t, tab.Rollback(1, v1, s.Deadline()+1), txn.ErrExpired)
	})

	t.Run("expire", func(t *testing.T) {
		tab := txn.NewTable()
		s := begin(t, tab, 1, v1, t0, 10)
		require.Empty(t, tab.Expire(s.Deadline()))
		require.Equal(t, 1, tab.Len())
		require.Equal(t, []messages.TxnID{1}, tab.Expire(s.Deadline()+1))
		require.Zero(t, tab.Len())
	})
}

// TestBodyRefreshesActivity: a body at tt moves the deadline to tt plus the
// keepalive, so a session touched in time outlives its first deadline.
func TestBodyRefreshesActivity(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 1, v1, t0, 10)
	first := s.Deadline()
	body(t, tab, 1, v1, t0+ms(3))
	require.Equal(t, t0+ms(3), s.LastActivity)
	require.Equal(t, t0+ms(8), s.Deadline())
	require.Equal(t, 1, s.Bodies)
	require.Equal(t, 1, s.InFlight)

	require.Empty(t, tab.Expire(first+1))
	body(t, tab, 1, v1, first+1)
	require.Equal(t, 2, s.Bodies)
	require.Equal(t, first+1+ms(5), s.Deadline())

	// The begin position does not move with activity.
	require.Equal(t, messages.MessageID(10), s.Begin)
	requireOldest(t, tab, 10, true)
}

// TestEndedSessionKeepsItsReason: once a session ended, every later body,
// commit or rollback reports why, even at TimeTicks past its deadline.
func TestEndedSessionKeepsItsReason(t *testing.T) {
	v1, v2 := vchannels(t)
	t0 := tick(t, 0, 7)
	for _, c := range []struct {
		name string
		end  func(t *testing.T, tab *txn.Table)
		want error
	}{
		{"committed", func(t *testing.T, tab *txn.Table) {
			ch, err := tab.StartCommit(1, v1, t0+2)
			require.NoError(t, err)
			require.Nil(t, ch)
			n, err := tab.Commit(1, v1, t0+3)
			require.NoError(t, err)
			require.Equal(t, 1, n)
		}, txn.ErrCommitted},
		{"rolled back", func(t *testing.T, tab *txn.Table) {
			require.NoError(t, tab.Rollback(1, v1, t0+3))
		}, txn.ErrRolledBack},
		{"aborted by an exclusive operation", func(t *testing.T, tab *txn.Table) {
			require.Equal(t, []messages.TxnID{1}, tab.Abort(v1))
		}, txn.ErrAborted},
		{"aborted by a pchannel exclusive operation", func(t *testing.T, tab *txn.Table) {
			require.Equal(t, []messages.TxnID{1}, tab.Abort(streamwal.VChannel{}))
		}, txn.ErrAborted},
		{"aborted by a lost begin", func(t *testing.T, tab *txn.Table) {
			tab.BeginDone(1, false)
		}, txn.ErrAborted},
		{"expired by Expire", func(t *testing.T, tab *txn.Table) {
			require.Equal(t, []messages.TxnID{1}, tab.Expire(t0+1+ms(5)+1))
		}, txn.ErrExpired},
		{"expired by a late body", func(t *testing.T, tab *txn.Table) {
			_, err := tab.Body(1, v1, t0+1+ms(5)+1)
			requireErr(t, err, txn.ErrExpired)
		}, txn.ErrExpired},
	} {
		t.Run(c.name, func(t *testing.T) {
			tab := txn.NewTable()
			begin(t, tab, 1, v1, t0, 10)
			body(t, tab, 1, v1, t0+1)
			tab.BodyDone(1, true)
			c.end(t, tab)

			require.Zero(t, tab.Len())
			_, ok := tab.Get(1)
			require.False(t, ok)
			requireOldest(t, tab, 0, false)
			for _, tt := range []messages.TimeTick{t0 + ms(10), t0 + ms(100)} {
				_, err := tab.Body(1, v1, tt)
				requireErr(t, err, c.want)
				_, err = tab.StartCommit(1, v1, tt+1)
				requireErr(t, err, c.want)
				_, err = tab.Commit(1, v1, tt+2)
				requireErr(t, err, c.want)
				requireErr(t, tab.Rollback(1, v1, tt+3), c.want)
				// The reason outranks the vchannel check.
				_, err = tab.Body(1, v2, tt+4)
				requireErr(t, err, c.want)
			}
			// Late notifications change nothing.
			tab.BeginDone(1, false)
			tab.CancelCommit(1)
			require.Empty(t, tab.Expire(t0+ms(1000)))
			require.Empty(t, tab.Abort(streamwal.VChannel{}))
			_, err := tab.Body(1, v1, t0+ms(1001))
			requireErr(t, err, c.want)
		})
	}
}

func TestBodyWhileCommitting(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 1, v1, t0, 10)
	_, err := tab.StartCommit(1, v1, t0+1)
	require.NoError(t, err)
	_, err = tab.Body(1, v1, t0+2)
	requireErr(t, err, txn.ErrCommitted)
	// Refused without ending or touching the session.
	require.Equal(t, txn.Committing, s.State)
	require.Zero(t, s.Bodies)
	require.Equal(t, t0, s.LastActivity)
	require.Equal(t, 1, tab.Len())
	n, err := tab.Commit(1, v1, t0+3)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestCommitWithoutBodiesInFlight(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 1, v1, t0, 10)
	body(t, tab, 1, v1, t0+1)
	body(t, tab, 1, v1, t0+2)
	tab.BodyDone(1, true)
	tab.BodyDone(1, true)

	ch, err := tab.StartCommit(1, v1, t0+3)
	require.NoError(t, err)
	require.Nil(t, ch)
	require.Equal(t, txn.Committing, s.State)
	got, ok := tab.Get(1)
	require.True(t, ok, "a committing session is live")
	require.Same(t, s, got)
	require.Equal(t, 1, tab.Len())
	requireOldest(t, tab, 10, true)

	n, err := tab.Commit(1, v1, t0+4)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, txn.Committed, s.State)
	require.Zero(t, tab.Len())
	requireOldest(t, tab, 0, false)
}

func TestCommitWaitsForBodies(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 1, v1, t0, 10)
	for i := range 3 {
		body(t, tab, 1, v1, t0+1+messages.TimeTick(i))
	}
	ch, err := tab.StartCommit(1, v1, t0+4)
	require.NoError(t, err)
	require.NotNil(t, ch)
	require.False(t, closed(ch))

	tab.BodyDone(1, true)
	tab.BodyDone(1, true)
	require.False(t, closed(ch), "a body is still in flight")
	require.Equal(t, 1, s.InFlight)

	// The WAL stamps a CommitTxn only once the channel closed.
	n, err := tab.Commit(1, v1, t0+5)
	requireErr(t, err, streamwal.ErrInternal)
	require.Zero(t, n)
	require.Equal(t, txn.Committing, s.State, "an early commit ends nothing")
	require.Equal(t, 1, tab.Len())

	tab.BodyDone(1, true)
	require.True(t, closed(ch))
	require.Zero(t, s.InFlight)
	n, err = tab.Commit(1, v1, t0+6)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Zero(t, tab.Len())
}

func TestCommitWithoutStartCommit(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 1, v1, t0, 10)
	_, err := tab.Commit(1, v1, t0+1)
	requireErr(t, err, streamwal.ErrInternal)
	require.Equal(t, txn.Open, s.State)
	body(t, tab, 1, v1, t0+2)
}

func TestLostBodyAbortsCommit(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)

	t.Run("while committing", func(t *testing.T) {
		tab := txn.NewTable()
		s := begin(t, tab, 1, v1, t0, 10)
		body(t, tab, 1, v1, t0+1)
		body(t, tab, 1, v1, t0+2)
		ch, err := tab.StartCommit(1, v1, t0+3)
		require.NoError(t, err)
		require.NotNil(t, ch)

		tab.BodyDone(1, false)
		require.Equal(t, txn.Aborted, s.State)
		require.False(t, closed(ch), "the other body is still in flight")
		require.Zero(t, tab.Len(), "an aborted session is not live")
		requireOldest(t, tab, 0, false)
		_, ok := tab.Get(1)
		require.False(t, ok)

		tab.BodyDone(1, true)
		require.True(t, closed(ch))
		_, err = tab.Commit(1, v1, t0+4)
		requireErr(t, err, txn.ErrAborted)
	})

	t.Run("last body lost while committing", func(t *testing.T) {
		tab := txn.NewTable()
		begin(t, tab, 1, v1, t0, 10)
		body(t, tab, 1, v1, t0+1)
		ch, err := tab.StartCommit(1, v1, t0+2)
		require.NoError(t, err)
		tab.BodyDone(1, false)
		require.True(t, closed(ch))
		_, err = tab.Commit(1, v1, t0+3)
		requireErr(t, err, txn.ErrAborted)
	})

	t.Run("before commit", func(t *testing.T) {
		tab := txn.NewTable()
		begin(t, tab, 1, v1, t0, 10)
		body(t, tab, 1, v1, t0+1)
		tab.BodyDone(1, false)
		_, err := tab.Body(1, v1, t0+2)
		requireErr(t, err, txn.ErrAborted)
		_, err = tab.StartCommit(1, v1, t0+3)
		requireErr(t, err, txn.ErrAborted)
	})
}

func TestCommitAfterDeadline(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 1, v1, t0, 10)
	body(t, tab, 1, v1, t0+ms(1))
	ch, err := tab.StartCommit(1, v1, t0+ms(2))
	require.NoError(t, err)
	d := s.Deadline()
	require.Equal(t, t0+ms(6), d)

	// Expire leaves committing sessions to Commit.
	require.Empty(t, tab.Expire(d+ms(10)))
	require.Equal(t, 1, tab.Len())
	requireOldest(t, tab, 10, true)

	tab.BodyDone(1, true)
	require.True(t, closed(ch))
	_, err = tab.Commit(1, v1, d+1)
	requireErr(t, err, txn.ErrExpired)
	require.Equal(t, txn.Expired, s.State)
	require.Zero(t, tab.Len())
	_, err = tab.Commit(1, v1, d+2)
	requireErr(t, err, txn.ErrExpired)
}

func TestDoubleCommit(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 1, v1, t0, 10)
	_, err := tab.StartCommit(1, v1, t0+1)
	require.NoError(t, err)
	ch, err := tab.StartCommit(1, v1, t0+2)
	requireErr(t, err, txn.ErrCommitted)
	require.Nil(t, ch)
	require.Equal(t, txn.Committing, s.State, "a second StartCommit leaves the first one's commit alone")

	_, err = tab.Commit(1, v1, t0+3)
	require.NoError(t, err)
	_, err = tab.Commit(1, v1, t0+4)
	requireErr(t, err, txn.ErrCommitted)
	_, err = tab.StartCommit(1, v1, t0+5)
	requireErr(t, err, txn.ErrCommitted)
}

func TestCancelCommit(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 1, v1, t0, 10)
	body(t, tab, 1, v1, t0+1)
	ch, err := tab.StartCommit(1, v1, t0+2)
	require.NoError(t, err)
	require.NotNil(t, ch)
	_, err = tab.Body(1, v1, t0+3)
	requireErr(t, err, txn.ErrCommitted)

	tab.CancelCommit(1)
	require.Equal(t, txn.Open, s.State)
	require.Equal(t, 1, tab.Len())
	body(t, tab, 1, v1, t0+4)
	require.Equal(t, 2, s.Bodies)
	require.Equal(t, 2, s.InFlight)

	// CancelCommit of an open session does nothing.
	tab.CancelCommit(1)
	require.Equal(t, txn.Open, s.State)

	ch2, err := tab.StartCommit(1, v1, t0+5)
	require.NoError(t, err)
	require.NotNil(t, ch2)
	tab.BodyDone(1, true)
	require.False(t, closed(ch2))
	tab.BodyDone(1, true)
	require.True(t, closed(ch2))
	n, err := tab.Commit(1, v1, t0+6)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	t.Run("reopened session expires again", func(t *testing.T) {
		tab := txn.NewTable()
		s := begin(t, tab, 1, v1, t0, 10)
		_, err := tab.StartCommit(1, v1, t0+1)
		require.NoError(t, err)
		require.Empty(t, tab.Expire(s.Deadline()+1))
		tab.CancelCommit(1)
		require.Equal(t, []messages.TxnID{1}, tab.Expire(s.Deadline()+2))
		_, err = tab.Body(1, v1, s.Deadline()+3)
		requireErr(t, err, txn.ErrExpired)
	})
}

func TestBeginDone(t *testing.T) {
	v1, v2 := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	a := begin(t, tab, 1, v1, t0, 10)
	b := begin(t, tab, 2, v2, t0+1, 11)

	tab.BeginDone(1, true)
	require.Equal(t, txn.Open, a.State)
	require.Equal(t, messages.MessageID(10), a.Begin, "Begin stays the bound it was given")

	tab.BeginDone(2, false)
	require.Equal(t, txn.Aborted, b.State)
	_, err := tab.Body(2, v2, t0+2)
	requireErr(t, err, txn.ErrAborted)
	require.Equal(t, 1, tab.Len())

	tab.BeginDone(1, false)
	require.Equal(t, txn.Aborted, a.State)
	_, err = tab.Body(1, v1, t0+3)
	requireErr(t, err, txn.ErrAborted)
	require.Zero(t, tab.Len())
	requireOldest(t, tab, 0, false)
}

func TestAbort(t *testing.T) {
	v1, v2 := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	begin(t, tab, 1, v1, t0, 10)
	begin(t, tab, 2, v2, t0+1, 11)
	begin(t, tab, 3, v1, t0+2, 12)
	begin(t, tab, 4, v1, t0+3, 13)
	_, err := tab.StartCommit(4, v1, t0+4) // committing: still aborted
	require.NoError(t, err)
	begin(t, tab, 5, v1, t0+5, 14)
	require.NoError(t, tab.Rollback(5, v1, t0+6)) // ended: not aborted again
	begin(t, tab, 6, v2, t0+7, 15)

	require.ElementsMatch(t, []messages.TxnID{1, 3, 4}, tab.Abort(v1))
	require.Equal(t, 2, tab.Len())
	for _, id := range []messages.TxnID{1, 3, 4} {
		_, err := tab.Body(id, v1, t0+8)
		requireErr(t, err, txn.ErrAborted)
	}
	_, err = tab.Commit(4, v1, t0+9)
	requireErr(t, err, txn.ErrAborted)
	requireErr(t, tab.Rollback(5, v1, t0+10), txn.ErrRolledBack)
	requireOldest(t, tab, 11, true)
	require.Empty(t, tab.Abort(v1))

	body(t, tab, 2, v2, t0+11)
	require.ElementsMatch(t, []messages.TxnID{2, 6}, tab.Abort(streamwal.VChannel{}))
	require.Zero(t, tab.Len())
	requireOldest(t, tab, 0, false)
	require.Empty(t, tab.Abort(streamwal.VChannel{}))
	_, err = tab.Body(6, v2, t0+12)
	requireErr(t, err, txn.ErrAborted)
}

// TestAbortWhileCommitting: a committer waiting for its bodies is woken
// only when they resolve, and then learns that its session was aborted.
func TestAbortWhileCommitting(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	begin(t, tab, 1, v1, t0, 10)
	body(t, tab, 1, v1, t0+1)
	ch, err := tab.StartCommit(1, v1, t0+2)
	require.NoError(t, err)
	require.Equal(t, []messages.TxnID{1}, tab.Abort(v1))
	require.False(t, closed(ch))
	require.Zero(t, tab.Len())
	tab.BodyDone(1, true)
	require.True(t, closed(ch))
	_, err = tab.Commit(1, v1, t0+3)
	requireErr(t, err, txn.ErrAborted)
}

func TestExpire(t *testing.T) {
	v1, v2 := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	begin(t, tab, 1, v1, t0, 10)       // deadline t0+5ms
	begin(t, tab, 2, v2, t0+ms(1), 11) // deadline t0+6ms
	begin(t, tab, 3, v1, t0+ms(2), 12) // committing, deadline t0+7ms
	_, err := tab.StartCommit(3, v1, t0+ms(2)+1)
	require.NoError(t, err)
	s4, err := tab.Begin(4, v1, 20*time.Millisecond, t0+ms(2)+2, 13) // deadline t0+22ms
	require.NoError(t, err)
	begin(t, tab, 5, v2, t0+ms(3), 14)
	body(t, tab, 5, v2, t0+ms(4)) // deadline t0+9ms

	now := t0 + ms(6) // session 2's deadline exactly: it survives
	require.Equal(t, []messages.TxnID{1}, tab.Expire(now))
	require.Equal(t, []messages.TxnID{2}, tab.Expire(now+1))
	require.Empty(t, tab.Expire(now+1))
	require.ElementsMatch(t, []messages.TxnID{5}, tab.Expire(t0+ms(10)))
	require.Equal(t, 2, tab.Len(), "the committing session and the long-lived one remain")
	requireOldest(t, tab, 12, true)
	_, ok := tab.Get(3)
	require.True(t, ok)
	_, ok = tab.Get(4)
	require.True(t, ok)
	require.Equal(t, txn.Open, s4.State)

	for _, c := range []struct {
		id messages.TxnID
		v  streamwal.VChannel
	}{{1, v1}, {2, v2}, {5, v2}} {
		_, err := tab.Body(c.id, c.v, t0+ms(11))
		requireErr(t, err, txn.ErrExpired)
	}
}

// TestExpireWithBodiesInFlight: an expired session whose bodies are still
// in flight is no longer live, and its last BodyDone forgets it.
func TestExpireWithBodiesInFlight(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 1, v1, t0, 10)
	body(t, tab, 1, v1, t0+1)
	require.Equal(t, []messages.TxnID{1}, tab.Expire(s.Deadline()+1))
	require.Zero(t, tab.Len())
	requireOldest(t, tab, 0, false)
	_, ok := tab.Get(1)
	require.False(t, ok)
	tab.BodyDone(1, true)
	require.Equal(t, txn.Expired, s.State)
	require.Zero(t, s.InFlight)
	_, err := tab.Body(1, v1, s.Deadline()+2)
	requireErr(t, err, txn.ErrExpired)
	// The ID is free again.
	begin(t, tab, 1, v1, s.Deadline()+3, 20)
}

func TestLenGetOldest(t *testing.T) {
	v1, v2 := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	require.Zero(t, tab.Len())
	requireOldest(t, tab, 0, false)

	begin(t, tab, 1, v1, t0, 10)
	begin(t, tab, 2, v2, t0+1, 20)
	begin(t, tab, 3, v1, t0+2, 20) // bounds may repeat
	begin(t, tab, 4, v2, t0+3, 30)
	require.Equal(t, 4, tab.Len())
	requireOldest(t, tab, 10, true)

	// Ending a younger session leaves the oldest.
	require.NoError(t, tab.Rollback(2, v2, t0+4))
	require.Equal(t, 3, tab.Len())
	requireOldest(t, tab, 10, true)
	_, ok := tab.Get(2)
	require.False(t, ok)

	// Ending the oldest moves to the next live one.
	require.NoError(t, tab.Rollback(1, v1, t0+5))
	requireOldest(t, tab, 20, true)
	_, err := tab.StartCommit(3, v1, t0+6)
	require.NoError(t, err)
	requireOldest(t, tab, 20, true) // committing still counts
	_, err = tab.Commit(3, v1, t0+7)
	require.NoError(t, err)
	requireOldest(t, tab, 30, true)
	require.Equal(t, 1, tab.Len())

	// A session ended with bodies in flight is not live.
	body(t, tab, 4, v2, t0+8)
	tab.Abort(v2)
	require.Zero(t, tab.Len())
	requireOldest(t, tab, 0, false)
	_, ok = tab.Get(4)
	require.False(t, ok)

	// A reused ID begins a new session at its new position.
	tab.BodyDone(4, true)
	begin(t, tab, 1, v1, t0+9, 40)
	requireOldest(t, tab, 40, true)
	require.Equal(t, 1, tab.Len())
}

// TestBodyRefused: a body refused before it was sent no longer counts, and
// the idle mark goes back to what it was before it, so the session expires
// when a reader, who never sees the body, expects it to.
func TestBodyRefused(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)

	t.Run("latest body", func(t *testing.T) {
		tab := txn.NewTable()
		s := begin(t, tab, 1, v1, t0, 10)
		body(t, tab, 1, v1, t0+ms(3))
		tab.BodyRefused(1, t0+ms(3))
		require.Zero(t, s.Bodies)
		require.Zero(t, s.InFlight)
		require.Equal(t, t0, s.LastActivity)
		require.Equal(t, t0+ms(5), s.Deadline())
		require.Equal(t, txn.Open, s.State)
		require.Equal(t, 1, tab.Len())
		_, err := tab.Body(1, v1, t0+ms(5)+1)
		requireErr(t, err, txn.ErrExpired)
	})

	t.Run("a later body keeps the idle mark", func(t *testing.T) {
		tab := txn.NewTable()
		s := begin(t, tab, 1, v1, t0, 10)
		body(t, tab, 1, v1, t0+ms(1))
		body(t, tab, 1, v1, t0+ms(2))
		tab.BodyRefused(1, t0+ms(1))
		require.Equal(t, 1, s.Bodies)
		require.Equal(t, 1, s.InFlight)
		require.Equal(t, t0+ms(2), s.LastActivity)
		tab.BodyDone(1, true)
		require.Equal(t, t0+ms(2), s.LastActivity)
	})

	t.Run("refused in reverse stamp order", func(t *testing.T) {
		tab := txn.NewTable()
		s := begin(t, tab, 1, v1, t0, 10)
		body(t, tab, 1, v1, t0+ms(1))
		body(t, tab, 1, v1, t0+ms(2))
		tab.BodyRefused(1, t0+ms(2))
		require.Equal(t, t0+ms(1), s.LastActivity)
		tab.BodyRefused(1, t0+ms(1))
		require.Equal(t, t0, s.LastActivity)
		require.Zero(t, s.Bodies)
		require.Zero(t, s.InFlight)
	})

	t.Run("wakes the committer", func(t *testing.T) {
		tab := txn.NewTable()
		begin(t, tab, 1, v1, t0, 10)
		body(t, tab, 1, v1, t0+1)
		body(t, tab, 1, v1, t0+2)
		tab.BodyDone(1, true)
		ch, err := tab.StartCommit(1, v1, t0+3)
		require.NoError(t, err)
		require.False(t, closed(ch))
		tab.BodyRefused(1, t0+2)
		require.True(t, closed(ch))
		n, err := tab.Commit(1, v1, t0+4)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the refused body is not part of the transaction")
	})

	t.Run("ended session is forgotten", func(t *testing.T) {
		tab := txn.NewTable()
		begin(t, tab, 1, v1, t0, 10)
		body(t, tab, 1, v1, t0+1)
		tab.Abort(v1)
		_, err := tab.Begin(1, v1, keepalive, t0+2, 11)
		requireErr(t, err, txn.ErrDuplicate)
		tab.BodyRefused(1, t0+1)
		_, err = tab.Body(1, v1, t0+3)
		requireErr(t, err, txn.ErrAborted)
		begin(t, tab, 1, v1, t0+4, 12)
	})

	t.Run("unknown", func(t *testing.T) {
		tab := txn.NewTable()
		tab.BodyRefused(1, t0)
		require.Zero(t, tab.Len())
		_, err := tab.Body(1, v1, t0+1)
		requireErr(t, err, txn.ErrUnknown)
	})
}

// TestBodyRefusedOutOfOrder: the WAL refuses a body under its mutex but
// reports it (BodyRefused) after releasing it, so a later body of the same
// session can be stamped in between, capturing the earlier body's TimeTick
// as its prev; if the earlier body's refusal is reported first and the
// later one is refused too, the idle mark must still end at the BeginTxn's
// TimeTick: neither body reached the stream.
func TestBodyRefusedOutOfOrder(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	s := begin(t, tab, 1, v1, t0, 10)
	body(t, tab, 1, v1, t0+ms(1)) // A: prev t0
	body(t, tab, 1, v1, t0+ms(2)) // B: prev t0+1ms
	tab.BodyRefused(1, t0+ms(1))
	tab.BodyRefused(1, t0+ms(2))
	require.Zero(t, s.Bodies)
	require.Equal(t, t0, s.LastActivity)
	// A reader saw only the BeginTxn: past t0+5ms the session is dead.
	_, err := tab.StartCommit(1, v1, t0+ms(5)+1)
	requireErr(t, err, txn.ErrExpired)
}

// TestCommitFailed: a CommitTxn that did not land turns the committed
// session into an aborted one, so a retry learns that the commit failed.
func TestCommitFailed(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	cause := streamwal.Errorf(streamwal.CodeUnknownOutcome, "timed out")

	tab := txn.NewTable()
	begin(t, tab, 1, v1, t0, 10)
	_, err := tab.StartCommit(1, v1, t0+1)
	require.NoError(t, err)
	_, err = tab.Commit(1, v1, t0+2)
	require.NoError(t, err)
	tab.CommitFailed(1, cause)
	_, err = tab.Commit(1, v1, t0+3)
	requireErr(t, err, txn.ErrAborted)
	_, err = tab.StartCommit(1, v1, t0+4)
	requireErr(t, err, txn.ErrAborted)
	_, err = tab.Body(1, v1, t0+5)
	requireErr(t, err, txn.ErrAborted)
	requireErr(t, tab.Rollback(1, v1, t0+6), txn.ErrAborted)
	require.Contains(t, tab.Rollback(1, v1, t0+7).Error(), "timed out")

	// Only ended sessions are touched.
	begin(t, tab, 2, v1, t0+8, 11)
	tab.CommitFailed(2, cause)
	body(t, tab, 2, v1, t0+9)
	require.Equal(t, 1, tab.Len())
	tab.CommitFailed(3, cause)
	_, err = tab.Body(3, v1, t0+10)
	requireErr(t, err, txn.ErrUnknown)
}

// TestEndedMemoryIsBounded: the table remembers why recent transactions
// ended, not every transaction ever; the most recent keep their reason.
func TestEndedMemoryIsBounded(t *testing.T) {
	v1, _ := vchannels(t)
	t0 := tick(t, 0, 7)
	tab := txn.NewTable()
	const n = 20000
	for i := range n {
		id := messages.TxnID(i + 1)
		tt := t0 + messages.TimeTick(2*i)
		begin(t, tab, id, v1, tt, messages.MessageID(i+1))
		require.NoError(t, tab.Rollback(id, v1, tt+1))
	}
	requireErr(t, tab.Rollback(n, v1, t0+2*n), txn.ErrRolledBack)
	requireErr(t, tab.Rollback(n-100, v1, t0+2*n+1), txn.ErrRolledBack)
	requireErr(t, tab.Rollback(1, v1, t0+2*n+2), txn.ErrUnknown)
	require.Zero(t, tab.Len())
}

// wal builds the messages a replay reads back, with increasing MessageIDs.
type wal struct {
	t     require.TestingT
	codec *messages.Codec
	p     streamwal.PChannel
	next  messages.MessageID
}

func newWAL(t require.TestingT, first messages.MessageID) *wal {
	c, err := messages.NewCodec("test", nil)
	require.NoError(t, err)
	return &wal{t: t, codec: c, p: pchannel(t), next: first}
}

// msg builds a message of type typ on v (PChannel-level when v is zero),
// stamped at tt, in transaction tc when not nil, and freezes it at the
// next MessageID.
func (w *wal) msg(typ *messages.Type, v streamwal.VChannel, tt messages.TimeTick, tc *messages.TxnContext) *messages.ImmutableMessage {
	if h, ok := w.t.(interface{ Helper() }); ok {
		h.Helper()
	}
	var opts []messages.Option
	if tc != nil {
		opts = append(opts, messages.WithTxn(*tc))
	}
	var (
		m   *messages.MutableMessage
		err error
	)
	switch {
	case typ.Body != nil && v.IsZero():
		m, err = w.codec.NewPChannelBody(typ, w.p, reflect.New(typ.Body).Elem().Interface(), opts...)
	case typ.Body != nil:
		m, err = w.codec.NewBody(typ, v, reflect.New(typ.Body).Elem().Interface(), opts...)
	case v.IsZero():
		m, err = w.codec.NewPChannel(typ, w.p, []byte("x"), opts...)
	default:
		m, err = w.codec.New(typ, v, []byte("x"), opts...)
	}
	require.NoError(w.t, err)
	m.SetTimeTick(tt)
	im := m.Freeze(w.next)
	w.next++
	return im
}

func ctx(id messages.TxnID, ka time.Duration) *messages.TxnContext {
	return &messages.TxnContext{ID: id, Keepalive: ka}
}

func requireSession(t *testing.T, tab *txn.Table, id messages.TxnID, v streamwal.VChannel, at messages.MessageID, bodies int, last messages.TimeTick) {
	t.Helper()
	s, ok := tab.Get(id)
	require.True(t, ok, "txn %d should be live", id)
	require.Equal(t, id, s.ID)
	require.Equal(t, v, s.VChannel)
	require.Equal(t, at, s.Begin)
	require.Equal(t, bodies, s.Bodies)
	require.Zero(t, s.InFlight)
	require.Equal(t, last, s.LastActivity)
	require.Equal(t, txn.Open, s.State)
}

func TestReplayCommitAndRollback(t *testing.T) {
	v1, v2 := vchannels(t)
	t0 := tick(t, 0, 7)
	ka := 100 * time.Millisecond
	w := newWAL(t, 10)
	log := []*messages.ImmutableMessage{
		w.msg(messages.TypeBeginTxn, v1, t0+ms(1), ctx(1, ka)),     // 10
		w.msg(messages.TypeInsert, v1, t0+ms(2), ctx(1, ka)),       // 11
		w.msg(messages.TypeBeginTxn, v2, t0+ms(3), ctx(2, ka)),     // 12
		w.msg(messages.TypeDelete, v1, t0+ms(4), ctx(1, ka)),       // 13
		w.msg(messages.TypeInsert, v2, t0+ms(5), ctx(2, ka)),       // 14
		w.msg(messages.TypeBeginTxn, v1, t0+ms(6), ctx(3, ka)),     // 15
		w.msg(messages.TypeCommitTxn, v2, t0+ms(7), ctx(2, ka)),    // 16
		w.msg(messages.TypeBeginTxn, v2, t0+ms(8), ctx(4, ka)),     // 17
		w.msg(messages.TypeUpsert, v2, t0+ms(9), ctx(4, ka)),       // 18
		w.msg(messages.TypeRollbackTxn, v2, t0+ms(10), ctx(4, ka)), // 19
		w.msg(messages.TypeInsert, v1, t0+ms(11), nil),             // 20: not transactional
		w.msg(messages.TypeTimeTick, streamwal.VChannel{}, t0+ms(12), nil),
		w.msg(messages.TypeUpsert, v1, t0+ms(13), ctx(3, ka)), // 22
		w.msg(messages.TypeInsert, v1, t0+ms(14), ctx(9, ka)), // 23: body of an unknown txn
		w.msg(messages.TypeInsert, v2, t0+ms(15), ctx(1, ka)), // 24: body on the wrong vchannel
	}
	tab := txn.NewTable()
	for _, m := range log {
		tab.Replay(m)
	}
	require.Equal(t, 2, tab.Len())
	requireSession(t, tab, 1, v1, 10, 2, t0+ms(4))
	requireSession(t, tab, 3, v1, 15, 1, t0+ms(13))
	requireOldest(t, tab, 10, true)
	s, _ := tab.Get(1)
	require.Equal(t, ka, s.Keepalive)

	// The recovered table continues: the live sessions take bodies and
	// commit, the closed ones keep their reason.
	body(t, tab, 1, v1, t0+ms(20))
	_, err := tab.Body(2, v2, t0+ms(21))
	requireErr(t, err, txn.ErrCommitted)
	_, err = tab.Body(4, v2, t0+ms(22))
	requireErr(t, err, txn.ErrRolledBack)
	_, err = tab.Body(9, v1, t0+ms(23))
	requireErr(t, err, txn.ErrUnknown)
	ch, err := tab.StartCommit(1, v1, t0+ms(24))
	require.NoError(t, err)
	tab.BodyDone(1, true)
	require.True(t, closed(ch))
	n, err := tab.Commit(1, v1, t0+ms(25))
	require.NoError(t, err)
	require.Equal(t, 3, n)
	requireOldest(t, tab, 15, true)
}

func TestReplayExclusive(t *testing.T) {
	v1, v2 := vchannels(t)
	t0 := tick(t, 0, 7)
	ka := 100 * time.Millisecond
	w := newWAL(t, 100)
	tab := txn.NewTable()
	replay := func(msgs ...*messages.ImmutableMessage) {
		for _, m := range msgs {
			tab.Replay(m)
		}
	}
	replay(
		w.msg(messages.TypeBeginTxn, v1, t0+ms(1), ctx(1, ka)), // 100
		w.msg(messages.TypeBeginTxn, v2, t0+ms(2), ctx(2, ka)), // 101
		w.msg(messages.TypeBeginTxn, v1, t0+ms(3), ctx(3, ka)), // 102
		w.msg(messages.TypeInsert, v2, t0+ms(4), ctx(2, ka)),   // 103
	)
	require.Equal(t, 3, tab.Len())

	// A collection DDL takes v1 exclusively: v1's sessions end.
	replay(w.msg(messages.TypeCreateCollection, v1, t0+ms(5), nil)) // 104
	require.Equal(t, 1, tab.Len())
	requireSession(t, tab, 2, v2, 101, 1, t0+ms(4))
	for _, id := range []messages.TxnID{1, 3} {
		_, err := tab.Body(id, v1, t0+ms(6))
		requireErr(t, err, txn.ErrAborted)
	}
	// A later body or commit of an aborted session does not revive it.
	replay(
		w.msg(messages.TypeInsert, v1, t0+ms(7), ctx(1, ka)),    // 105
		w.msg(messages.TypeCommitTxn, v1, t0+ms(8), ctx(3, ka)), // 106
	)
	require.Equal(t, 1, tab.Len())

	// ManualFlush is VChannel-exclusive too.
	replay(
		w.msg(messages.TypeBeginTxn, v1, t0+ms(9), ctx(4, ka)), // 107
		w.msg(messages.TypeManualFlush, v1, t0+ms(10), nil),    // 108
	)
	_, ok := tab.Get(4)
	require.False(t, ok)
	requireSession(t, tab, 2, v2, 101, 1, t0+ms(4))

	// A cluster barrier takes the whole PChannel: every session ends.
	replay(
		w.msg(messages.TypeBeginTxn, v1, t0+ms(11), ctx(5, ka)),            // 109
		w.msg(messages.TypeFlushAll, streamwal.VChannel{}, t0+ms(12), nil), // 110
	)
	require.Zero(t, tab.Len())
	requireOldest(t, tab, 0, false)
	for _, c := range []struct {
		id messages.TxnID
		v  streamwal.VChannel
	}{{2, v2}, {5, v1}} {
		_, err := tab.Body(c.id, c.v, t0+ms(13))
		requireErr(t, err, txn.ErrAborted)
	}

	// Sessions begun after the barrier live; shared DML does not abort.
	replay(
		w.msg(messages.TypeBeginTxn, v2, t0+ms(14), ctx(6, ka)), // 111
		w.msg(messages.TypeInsert, v2, t0+ms(15), nil),          // 112
		w.msg(messages.TypeCreateCollection, v1, t0+ms(16), nil),
		w.msg(messages.TypeAlterWAL, streamwal.VChannel{}, t0+ms(17), nil),
	)
	require.Zero(t, tab.Len(), "AlterWAL is a cluster barrier too")
	_, err := tab.Body(6, v2, t0+ms(18))
	requireErr(t, err, txn.ErrAborted)

	replay(
		w.msg(messages.TypeBeginTxn, v2, t0+ms(19), ctx(7, ka)), // 115
		w.msg(messages.TypeInsert, v2, t0+ms(20), nil),
		w.msg(messages.TypeCreateCollection, v1, t0+ms(21), nil),
	)
	requireSession(t, tab, 7, v2, 115, 0, t0+ms(19))
}

func TestReplayExpiry(t *testing.T) {
	v1, v2 := vchannels(t)
	t0 := tick(t, 0, 7)
	w := newWAL(t, 1)
	tab := txn.NewTable()
	tab.Replay(w.msg(messages.TypeBeginTxn, v1, t0, ctx(1, keepalive)))   // 1: deadline t0+5ms
	tab.Replay(w.msg(messages.TypeBeginTxn, v2, t0+1, ctx(2, keepalive))) // 2: deadline t0+5ms+1

	// A message at 1's deadline leaves it alive.
	tab.Replay(w.msg(messages.TypeTimeTick, streamwal.VChannel{}, t0+ms(5), nil)) // 3
	require.Equal(t, 2, tab.Len())
	requireOldest(t, tab, 1, true)

	// The next one, a body of 2 at 2's deadline, expires 1 and extends 2.
	tab.Replay(w.msg(messages.TypeInsert, v2, t0+ms(5)+1, ctx(2, keepalive))) // 4
	require.Equal(t, 1, tab.Len())
	requireSession(t, tab, 2, v2, 2, 1, t0+ms(5)+1)
	requireOldest(t, tab, 2, true)
	_, err := tab.Body(1, v1, t0+ms(5)+2)
	requireErr(t, err, txn.ErrExpired)

	tab.Replay(w.msg(messages.TypeBeginTxn, v1, t0+ms(5)+3, ctx(3, keepalive))) // 5: deadline t0+10ms+3

	// A commit past 2's deadline is not replayed as a commit: 2 expired.
	tab.Replay(w.msg(messages.TypeCommitTxn, v2, t0+ms(10)+2, ctx(2, keepalive))) // 6
	_, ok := tab.Get(2)
	require.False(t, ok)
	_, err = tab.Body(2, v2, t0+ms(10)+3)
	requireErr(t, err, txn.ErrExpired)
	requireSession(t, tab, 3, v1, 5, 0, t0+ms(5)+3)
	requireOldest(t, tab, 5, true)

	// A body past 3's deadline neither counts nor refreshes it.
	tab.Replay(w.msg(messages.TypeInsert, v1, t0+ms(10)+4, ctx(3, keepalive))) // 7
	require.Zero(t, tab.Len())
	requireOldest(t, tab, 0, false)
	requireErr(t, tab.Rollback(3, v1, t0+ms(10)+5), txn.ErrExpired)
}

// ----- the model test -----

// pend is a body in flight: its TimeTick, and the session's idle mark
// before it (what the WAL hands BodyRefused).
type pend struct{ tt, prev messages.TimeTick }

// mSession is the model of one session the table still holds.
type mSession struct {
	v     streamwal.VChannel
	kams  int64
	begin messages.MessageID
	// acts are the TimeTicks of the BeginTxn and of every body not
	// refused, in stamp order: a reader sees exactly these, so the last
	// is the session's idle mark.
	acts       []messages.TimeTick
	pending    []pend // bodies in flight, in stamp order
	bodies     int
	live       bool
	committing bool
	cause      error
	ch         <-chan struct{} // returned by StartCommit, open until drained
}

func (s *mSession) last() messages.TimeTick     { return s.acts[len(s.acts)-1] }
func (s *mSession) deadline() messages.TimeTick { return s.last() + ms(s.kams) }

type model struct {
	sessions map[messages.TxnID]*mSession
	ended    map[messages.TxnID]error
	drained  []<-chan struct{} // channels that must now be closed
}

func (m *model) end(id messages.TxnID, cause error) {
	s := m.sessions[id]
	s.live, s.committing, s.cause = false, false, cause
	m.ended[id] = cause
	if len(s.pending) == 0 {
		delete(m.sessions, id)
	}
}

// resolve records that body i in flight of id resolved.
func (m *model) resolve(id messages.TxnID, i int, landed bool) {
	s := m.sessions[id]
	s.pending = slices.Delete(s.pending, i, i+1)
	if !landed && s.live {
		m.end(id, txn.ErrAborted)
	}
	if len(s.pending) == 0 {
		if s.ch != nil {
			m.drained = append(m.drained, s.ch)
			s.ch = nil
		}
		if !s.live {
			delete(m.sessions, id)
		}
	}
}

// refuse records that body i in flight of id was refused before it was
// sent: it never happened.
func (m *model) refuse(id messages.TxnID, i int) {
	s := m.sessions[id]
	s.bodies--
	s.acts = slices.DeleteFunc(s.acts, func(tt messages.TimeTick) bool { return tt == s.pending[i].tt })
	m.resolve(id, i, true)
}

// withPending lists the IDs that have bodies in flight.
func (m *model) withPending(ids []messages.TxnID) []messages.TxnID {
	var out []messages.TxnID
	for _, id := range ids {
		if s, ok := m.sessions[id]; ok && len(s.pending) > 0 {
			out = append(out, id)
		}
	}
	return out
}

// usable is the verdict on an operation of id on v at tt.
func (m *model) usable(id messages.TxnID, v streamwal.VChannel, tt messages.TimeTick) (*mSession, error) {
	s, ok := m.sessions[id]
	switch {
	case !ok && m.ended[id] != nil:
		return nil, m.ended[id]
	case !ok:
		return nil, txn.ErrUnknown
	case !s.live:
		return nil, s.cause
	case s.v != v:
		return nil, txn.ErrWrongVChannel
	case tt > s.deadline():
		m.end(id, txn.ErrExpired)
		return nil, txn.ErrExpired
	}
	return s, nil
}

func (m *model) liveIDs(v streamwal.VChannel, onlyOpen bool) []messages.TxnID {
	var ids []messages.TxnID
	for id, s := range m.sessions {
		if s.live && (v.IsZero() || s.v == v) && (!onlyOpen || !s.committing) {
			ids = append(ids, id)
		}
	}
	return ids
}

func requireVerdict(t *rapid.T, err, want error) {
	if want == nil {
		require.NoError(t, err)
		return
	}
	requireErr(t, err, want)
}

// TestTableModel drives the table with random Begin, Body, BodyDone,
// BodyRefused, StartCommit, Commit, CancelCommit, CommitFailed, Rollback,
// BeginDone, Abort and Expire at an increasing TimeTick, with Begin bounds
// non-decreasing as the WAL supplies them, and checks every verdict, the
// drained channels, Len, Get, Oldest and the LastConfirmed rule against a
// plain map of sessions. Refused bodies are reported latest first.
func TestTableModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { runModel(t, false) })
}

// TestTableModelRefusalsInAnyOrder is TestTableModel with bodies refused
// in any order, as the WAL may report them (see TestBodyRefusedOutOfOrder).
func TestTableModelRefusalsInAnyOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { runModel(t, true) })
}

func runModel(t *rapid.T, anyOrderRefusals bool) {
	v1, v2 := vchannels(t)
	vs := []streamwal.VChannel{v1, v2}
	ids := []messages.TxnID{1, 2, 3, 4, 5}
	tab := txn.NewTable()
	m := &model{sessions: map[messages.TxnID]*mSession{}, ended: map[messages.TxnID]error{}}
	clock, err := messages.NewTimeTick(base, 7)
	require.NoError(t, err)
	bound := messages.MessageID(1)
	// advance moves the clock: mostly by a fraction of a millisecond,
	// sometimes by whole milliseconds, and sometimes exactly to a live
	// session's deadline or one past it, to probe the boundary.
	advance := func() {
		var deadlines []messages.TimeTick
		for _, id := range ids {
			if s, ok := m.sessions[id]; ok && s.live && s.deadline() > clock {
				deadlines = append(deadlines, s.deadline())
			}
		}
		switch k := rapid.IntRange(0, 19).Draw(t, "clock"); {
		case k >= 18 && len(deadlines) > 0:
			d := rapid.SampledFrom(deadlines).Draw(t, "deadline")
			clock = d + messages.TimeTick(rapid.IntRange(0, 1).Draw(t, "past"))
		case k >= 16:
			clock += ms(rapid.Int64Range(1, 3).Draw(t, "jumpMs"))
		default:
			clock += messages.TimeTick(rapid.Uint64Range(1, uint64(ms(1))/4).Draw(t, "gap"))
		}
	}
	// The operations below, weighted so that sessions often have several
	// bodies in flight when they commit or are refused bodies.
	ops := []int{0, 1, 1, 1, 2, 3, 3, 4, 4, 5, 6, 7, 8, 9, 10, 10, 11}

	// pickID draws an ID, mostly a live session's, and among those
	// mostly one committing when committing is set.
	pickID := func(committing bool) messages.TxnID {
		var live, ready []messages.TxnID
		for _, id := range ids {
			if s, ok := m.sessions[id]; ok && s.live {
				live = append(live, id)
				if s.committing {
					ready = append(ready, id)
				}
			}
		}
		if committing && len(ready) > 0 && rapid.IntRange(0, 3).Draw(t, "readyID") > 0 {
			return rapid.SampledFrom(ready).Draw(t, "id")
		}
		if len(live) > 0 && rapid.IntRange(0, 3).Draw(t, "liveID") > 0 {
			return rapid.SampledFrom(live).Draw(t, "id")
		}
		return rapid.SampledFrom(ids).Draw(t, "id")
	}
	// target draws an ID and the VChannel an operation names: mostly
	// the session's own.
	target := func(committing bool) (messages.TxnID, streamwal.VChannel) {
		id := pickID(committing)
		v := rapid.SampledFrom(vs).Draw(t, "v")
		if s, ok := m.sessions[id]; ok && rapid.IntRange(0, 4).Draw(t, "wrongV") > 0 {
			v = s.v
		}
		return id, v
	}

	for range rapid.IntRange(20, 150).Draw(t, "steps") {
		advance()
		bound += messages.MessageID(rapid.IntRange(0, 2).Draw(t, "advance"))
		tt := clock
		switch op := rapid.SampledFrom(ops).Draw(t, "op"); op {
		case 0: // Begin
			id := rapid.SampledFrom(ids).Draw(t, "id")
			v := rapid.SampledFrom(vs).Draw(t, "v")
			kams := rapid.Int64Range(1, 10).Draw(t, "keepaliveMs")
			s, err := tab.Begin(id, v, time.Duration(kams)*time.Millisecond, tt, bound)
			if _, dup := m.sessions[id]; dup {
				requireVerdict(t, err, txn.ErrDuplicate)
				require.Nil(t, s)
				break
			}
			require.NoError(t, err)
			m.sessions[id] = &mSession{v: v, kams: kams, begin: bound, acts: []messages.TimeTick{tt}, live: true}
		case 1: // Body
			id, v := target(false)
			// The WAL reads the idle mark before the body, for
			// BodyRefused.
			var prev messages.TimeTick
			if s, ok := tab.Get(id); ok {
				prev = s.LastActivity
			}
			_, err := tab.Body(id, v, tt)
			s, want := m.usable(id, v, tt)
			if want == nil && s.committing {
				want = txn.ErrCommitted
			}
			requireVerdict(t, err, want)
			if want == nil {
				require.Equal(t, s.last(), prev)
				s.bodies++
				s.pending = append(s.pending, pend{tt: tt, prev: prev})
				s.acts = append(s.acts, tt)
			}
		case 2: // BodyDone
			pending := m.withPending(ids)
			if len(pending) == 0 {
				break
			}
			id := rapid.SampledFrom(pending).Draw(t, "pending")
			i := rapid.IntRange(0, len(m.sessions[id].pending)-1).Draw(t, "body")
			landed := rapid.IntRange(0, 3).Draw(t, "landed") > 0
			tab.BodyDone(id, landed)
			m.resolve(id, i, landed)
		case 10: // BodyRefused
			pending := m.withPending(ids)
			if len(pending) == 0 {
				break
			}
			id := rapid.SampledFrom(pending).Draw(t, "pending")
			i := len(m.sessions[id].pending) - 1
			if anyOrderRefusals {
				i = rapid.IntRange(0, i).Draw(t, "body")
			}
			p := m.sessions[id].pending[i]
			tab.BodyRefused(id, p.tt)
			m.refuse(id, i)
		case 11: // CommitFailed
			id := pickID(false)
			tab.CommitFailed(id, streamwal.Errorf(streamwal.CodeUnknownOutcome, "timed out"))
			if m.ended[id] != nil {
				m.ended[id] = txn.ErrAborted
			}
		case 3: // StartCommit
			id, v := target(false)
			ch, err := tab.StartCommit(id, v, tt)
			s, want := m.usable(id, v, tt)
			if want == nil && s.committing {
				want = txn.ErrCommitted
			}
			requireVerdict(t, err, want)
			if want != nil {
				require.Nil(t, ch)
				break
			}
			s.committing = true
			if len(s.pending) == 0 {
				require.Nil(t, ch)
			} else {
				require.NotNil(t, ch)
				s.ch = ch
			}
		case 4: // Commit
			id, v := target(true)
			n, err := tab.Commit(id, v, tt)
			s, want := m.usable(id, v, tt)
			if want == nil && (!s.committing || len(s.pending) > 0) {
				want = streamwal.ErrInternal
			}
			requireVerdict(t, err, want)
			if want == nil {
				require.Equal(t, s.bodies, n)
				m.end(id, txn.ErrCommitted)
			}
		case 5: // Rollback
			id, v := target(false)
			err := tab.Rollback(id, v, tt)
			_, want := m.usable(id, v, tt)
			requireVerdict(t, err, want)
			if want == nil {
				m.end(id, txn.ErrRolledBack)
			}
		case 6: // Abort
			v := streamwal.VChannel{}
			if rapid.Bool().Draw(t, "vchannelScope") {
				v = rapid.SampledFrom(vs).Draw(t, "v")
			}
			want := m.liveIDs(v, false)
			require.ElementsMatch(t, want, tab.Abort(v))
			for _, id := range want {
				m.end(id, txn.ErrAborted)
			}
		case 7: // Expire
			var want []messages.TxnID
			for _, id := range m.liveIDs(streamwal.VChannel{}, true) {
				if tt > m.sessions[id].deadline() {
					want = append(want, id)
				}
			}
			require.ElementsMatch(t, want, tab.Expire(tt))
			for _, id := range want {
				m.end(id, txn.ErrExpired)
			}
		case 8: // CancelCommit
			id := pickID(false)
			tab.CancelCommit(id)
			if s, ok := m.sessions[id]; ok && s.live && s.committing {
				s.committing = false
				s.ch = nil // the committer gave up on it
			}
		case 9: // BeginDone
			id := pickID(false)
			landed := rapid.IntRange(0, 2).Draw(t, "landed") > 0
			tab.BeginDone(id, landed)
			if s, ok := m.sessions[id]; ok && !landed && s.live {
				m.end(id, txn.ErrAborted)
			}
		}
		checkModel(t, tab, m, ids, bound)
	}
}

func checkModel(t *rapid.T, tab *txn.Table, m *model, ids []messages.TxnID, own messages.MessageID) {
	n := 0
	var oldest messages.MessageID
	haveOldest := false
	for _, id := range ids {
		ses, inModel := m.sessions[id]
		live := inModel && ses.live
		s, ok := tab.Get(id)
		require.Equal(t, live, ok, "Get(%d)", id)
		if inModel && ses.ch != nil {
			require.False(t, closed(ses.ch), "txn %d: drained closed with %d bodies in flight", id, len(ses.pending))
		}
		if !live {
			continue
		}
		n++
		if !haveOldest || ses.begin < oldest {
			oldest, haveOldest = ses.begin, true
		}
		require.Equal(t, id, s.ID)
		require.Equal(t, ses.v, s.VChannel)
		require.Equal(t, time.Duration(ses.kams)*time.Millisecond, s.Keepalive)
		require.Equal(t, ses.begin, s.Begin)
		require.Equal(t, ses.last(), s.LastActivity)
		require.Equal(t, ses.deadline(), s.Deadline())
		require.Equal(t, ses.bodies, s.Bodies)
		require.Equal(t, len(ses.pending), s.InFlight)
		want := txn.Open
		if ses.committing {
			want = txn.Committing
		}
		require.Equal(t, want, s.State)
	}
	for _, ch := range m.drained {
		require.True(t, closed(ch), "drained channel still open")
	}
	m.drained = nil
	require.Equal(t, n, tab.Len())
	got, ok := tab.Oldest()
	require.Equal(t, haveOldest, ok)
	if ok {
		require.Equal(t, oldest, got)
	}

	// The LastConfirmed of a message stamped now with own lower bound own
	// (>= every Begin so far): a reader starting there sees every live
	// transaction from its BeginTxn on, and the message itself.
	lc := own
	if ok && got < lc {
		lc = got
	}
	require.LessOrEqual(t, lc, own)
	for _, ses := range m.sessions {
		if ses.live {
			require.LessOrEqual(t, lc, ses.begin)
		}
	}
	if haveOldest {
		require.Equal(t, min(own, oldest), lc)
	} else {
		require.Equal(t, own, lc)
	}
}

// TestReplayMatchesLive: the messages a live table let through, replayed
// into a fresh table, rebuild the same live sessions. The driver stamps
// one message per step (the operation's when it succeeds, a TimeTick
// otherwise), expiring idle sessions at each as the WAL does; bodies land
// or are refused at once, and a commit is stamped right after its
// StartCommit.
func TestReplayMatchesLive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v1, v2 := vchannels(t)
		vs := []streamwal.VChannel{v1, v2}
		ids := []messages.TxnID{1, 2, 3, 4}
		w := newWAL(t, 1)
		live, replayed := txn.NewTable(), txn.NewTable()
		clock, err := messages.NewTimeTick(base, 7)
		require.NoError(t, err)
		gaps := []messages.TimeTick{1, ms(1) / 4, ms(1), ms(1) + 1, ms(2)}

		for range rapid.IntRange(10, 100).Draw(t, "steps") {
			clock += rapid.SampledFrom(gaps).Draw(t, "gap")
			tt := clock
			live.Expire(tt)
			id := rapid.SampledFrom(ids).Draw(t, "id")
			v := rapid.SampledFrom(vs).Draw(t, "v")
			if s, ok := live.Get(id); ok && rapid.IntRange(0, 4).Draw(t, "wrongV") > 0 {
				v = s.VChannel
			}
			var stamped *messages.ImmutableMessage
			switch rapid.IntRange(0, 6).Draw(t, "op") {
			case 0:
				ka := time.Duration(rapid.IntRange(1, 6).Draw(t, "keepaliveMs")) * time.Millisecond
				if _, err := live.Begin(id, v, ka, tt, w.next); err == nil {
					stamped = w.msg(messages.TypeBeginTxn, v, tt, ctx(id, ka))
				}
			case 1, 2:
				if s, err := live.Body(id, v, tt); err == nil {
					stamped = w.msg(messages.TypeInsert, v, tt, ctx(id, s.Keepalive))
					live.BodyDone(id, true)
				}
			case 3:
				// A body refused before it was sent: readers never see it.
				if _, err := live.Body(id, v, tt); err == nil {
					live.BodyRefused(id, tt)
				}
			case 4:
				s, ok := live.Get(id)
				if _, err := live.StartCommit(id, v, tt); err == nil {
					_, err := live.Commit(id, v, tt)
					require.NoError(t, err)
					require.True(t, ok)
					stamped = w.msg(messages.TypeCommitTxn, v, tt, ctx(id, s.Keepalive))
				}
			case 5:
				s, ok := live.Get(id)
				if err := live.Rollback(id, v, tt); err == nil {
					require.True(t, ok)
					stamped = w.msg(messages.TypeRollbackTxn, v, tt, ctx(id, s.Keepalive))
				}
			case 6:
				if rapid.Bool().Draw(t, "pchannelScope") {
					live.Abort(streamwal.VChannel{})
					stamped = w.msg(messages.TypeFlushAll, streamwal.VChannel{}, tt, nil)
				} else {
					live.Abort(v)
					stamped = w.msg(messages.TypeCreateCollection, v, tt, nil)
				}
			}
			if stamped == nil {
				stamped = w.msg(messages.TypeTimeTick, streamwal.VChannel{}, tt, nil)
			}
			replayed.Replay(stamped)

			require.Equal(t, live.Len(), replayed.Len())
			lo, lok := live.Oldest()
			ro, rok := replayed.Oldest()
			require.Equal(t, lok, rok)
			require.Equal(t, lo, ro)
			for _, id := range ids {
				ls, lok := live.Get(id)
				rs, rok := replayed.Get(id)
				require.Equal(t, lok, rok, "txn %d live", id)
				if !lok {
					continue
				}
				require.Equal(t, ls.VChannel, rs.VChannel)
				require.Equal(t, ls.Keepalive, rs.Keepalive)
				require.Equal(t, ls.Begin, rs.Begin)
				require.Equal(t, ls.LastActivity, rs.LastActivity)
				require.Equal(t, ls.Bodies, rs.Bodies)
				require.Equal(t, ls.State, rs.State)
			}
		}
	})
}
