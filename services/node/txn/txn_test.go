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

func requireOldest(t *testing.T, tab *txn.Table, want messages.MessageID, ok bool) {
	t.Helper()
	got, gotOK := tab.Oldest()
	require.Equal(t, ok, gotOK)
	if ok {
		require.Equal(t, want, got)
	}
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
