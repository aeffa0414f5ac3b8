package wal_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/wal"
	"github.com/streamwal/streamwal/services/read"
	"github.com/streamwal/streamwal/services/wire"
)

// source builds the messages of another cluster's log on the env's
// PChannel index, as if read from its stream, for the env's WAL to take
// as replicas.
type source struct {
	t     *testing.T
	e     *env
	codec *messages.Codec
	next  messages.MessageID
	tick  messages.TimeTick
}

// newSource is cluster c's log.
func newSource(t *testing.T, e *env, c streamwal.Cluster) *source {
	codec, err := messages.NewCodec(c, nil)
	require.NoError(t, err)
	return &source{t: t, e: e, codec: codec, next: 1, tick: messages.TimeTick(1 << 20)}
}

// land freezes m as the source's next message.
func (s *source) land(m *messages.MutableMessage) *messages.ImmutableMessage {
	s.tick += 1 << 18
	m.SetTimeTick(s.tick)
	m.SetLastConfirmed(s.next)
	im := m.Freeze(s.next)
	s.next++
	return im
}

// replica is the env's replica of the source message m.
func (s *source) replica(m *messages.ImmutableMessage) *messages.MutableMessage {
	s.t.Helper()
	r, err := s.e.codec.NewReplicate(m, s.codec.Cluster(), s.e.p)
	require.NoError(s.t, err)
	return r
}

// insert is a source insert on v, replicated.
func (s *source) insert(v streamwal.VChannel, payload string) (*messages.ImmutableMessage, *messages.MutableMessage) {
	s.t.Helper()
	m, err := s.codec.New(messages.TypeInsert, v, []byte(payload))
	require.NoError(s.t, err)
	src := s.land(m)
	return src, s.replica(src)
}

// createCollection is a source CreateCollection of v, replicated.
func (s *source) createCollection(v streamwal.VChannel) *messages.MutableMessage {
	s.t.Helper()
	m, err := s.codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: v.String(), CollectionID: v.CollectionID()},
		VChannels:     []string{v.String()},
	})
	require.NoError(s.t, err)
	return s.replica(s.land(m))
}

// txn is a committed source transaction of n inserts on v, replicated
// whole; the source's begin, bodies and commit are interleaved with
// nothing.
func (s *source) txn(v streamwal.VChannel, n int) []*messages.MutableMessage {
	s.t.Helper()
	tc := messages.TxnContext{ID: messages.TxnID(s.tick + 1<<18), Keepalive: messages.DefaultKeepalive}
	begin, err := s.codec.NewBody(messages.TypeBeginTxn, v, messages.BeginTxnBody{}, messages.WithTxn(tc))
	require.NoError(s.t, err)
	unit := []*messages.MutableMessage{s.replica(s.land(begin))}
	for i := range n {
		m, err := s.codec.New(messages.TypeInsert, v, []byte(fmt.Sprint("txn row ", i)), messages.WithTxn(tc))
		require.NoError(s.t, err)
		unit = append(unit, s.replica(s.land(m)))
	}
	commit, err := s.codec.NewBody(messages.TypeCommitTxn, v, messages.CommitTxnBody{}, messages.WithTxn(tc))
	require.NoError(s.t, err)
	return append(unit, s.replica(s.land(commit)))
}

// member is the env's PChannel in cluster c.
func (e *env) member(c streamwal.Cluster) messages.ReplicateMember {
	return messages.ReplicateMember{Cluster: c, URL: "nats://" + string(c), PChannels: []string{e.p.String()}}
}

// configure appends an AlterReplicateConfig of topo to w.
func (e *env) configure(w *wal.WAL, topo messages.Topology) {
	e.t.Helper()
	m, err := e.codec.NewPChannelBody(messages.TypeAlterReplicateConfig, e.p, topo)
	require.NoError(e.t, err)
	_, err = w.Append(context.Background(), m)
	require.NoError(e.t, err)
}

// requireNotPrimary checks a NOT_PRIMARY that names primary, also as it
// comes out of a request-reply hop.
func requireNotPrimary(t *testing.T, err error, primary streamwal.Cluster) {
	t.Helper()
	require.ErrorIs(t, err, streamwal.ErrNotPrimary)
	for _, e := range []error{err, wire.ErrorOf(err).Err()} {
		p, ok := streamwal.PrimaryOf(e)
		require.True(t, ok, "%v names no primary", e)
		require.Equal(t, primary, p)
	}
}

func TestReplicateRoles(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w := e.open(1)
	prim := newSource(t, e, "prim")
	v := e.vchannel(1)
	e.createCollection(w, v)

	// Outside replication the cluster takes writes and refuses replicas.
	_, err := w.Append(ctx, e.insert(v, "local"))
	require.NoError(t, err)
	_, rep := prim.insert(v, "from prim")
	_, err = w.Append(ctx, rep)
	require.ErrorIs(t, err, streamwal.ErrNotSecondary)
	_, ok, _, _ := w.Replication()
	require.False(t, ok)

	// A secondary of prim.
	topo := messages.Star(e.member("prim"), e.member("test"))
	_, _, _, changed := w.Replication()
	e.configure(w, topo)
	select {
	case <-changed:
	default:
		t.Fatal("the topology changed without a word")
	}
	got, ok, source, _ := w.Replication()
	require.True(t, ok)
	require.Equal(t, topo, got)
	require.Nil(t, source)

	_, err = w.Append(ctx, e.insert(v, "direct"))
	requireNotPrimary(t, err, "prim")
	_, err = w.BeginTxn(ctx, v, 0)
	requireNotPrimary(t, err, "prim")
	_, err = w.Append(ctx, e.insert(v, "local only", messages.WithUnreplicable()))
	require.NoError(t, err, "an unreplicable message stays in its cluster, whatever its role")
	rg, err := e.codec.NewBroadcast(messages.TypeAlterResourceGroup, messages.Targets{CChannel: e.p.CChannel()}, messages.KeyScope{}, []byte("rg"))
	require.NoError(t, err)
	rg.SetID(1)
	_, err = w.Append(ctx, rg.Split()[0])
	require.NoError(t, err, "resource groups are unreplicable")

	// Replicas of prim land, each once.
	v2 := e.vchannel(2)
	_, err = w.Append(ctx, prim.createCollection(v2))
	require.NoError(t, err)
	src, rep := prim.insert(v2, "row 1")
	stored, err := w.Append(ctx, rep.Clone())
	require.NoError(t, err)
	require.Equal(t, &messages.ReplicateHeader{Cluster: "prim", MessageID: src.ID(), TimeTick: src.TimeTick(), LastConfirmed: src.LastConfirmed()}, stored.Replicate())
	require.NotEqual(t, src.TimeTick(), stored.TimeTick(), "the replica has a TimeTick of this cluster")
	_, err = w.Append(ctx, rep)
	require.ErrorIs(t, err, streamwal.ErrDuplicate, "the same source TimeTick again")
	_, _, source, _ = w.Replication()
	require.Equal(t, stored.Replicate(), source)

	other := newSource(t, e, "other")
	other.tick = prim.tick * 2
	_, rep = other.insert(v2, "not my primary")
	_, err = w.Append(ctx, rep)
	require.ErrorIs(t, err, streamwal.ErrNotSecondary)

	// A transaction replicates whole, as one unit, or not at all.
	unit := prim.txn(v2, 3)
	_, err = w.Append(ctx, unit[0])
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "a replicated BeginTxn alone")
	out, errs := w.AppendUnits(ctx, [][]*messages.MutableMessage{unit})
	require.NoError(t, errs[0])
	require.Len(t, out[0], 5)
	for i, m := range out[0] {
		require.Equal(t, out[0][0].ID()+messages.MessageID(i), m.ID(), "a whole transaction lands contiguously")
		require.Equal(t, messages.TxnID(out[0][0].TimeTick()), m.Txn().ID, "under a TxnID of this cluster")
		require.Equal(t, unit[i].Replicate(), m.Replicate())
	}
	_, _, source, _ = w.Replication()
	require.Equal(t, unit[4].Replicate(), source, "the source position moves to the commit")
	_, errs = w.AppendUnits(ctx, [][]*messages.MutableMessage{prim.txn(v2, 1)[:2]})
	require.ErrorIs(t, errs[0], streamwal.ErrInvalidArgument, "a transaction without its commit")

	// A primary again: replicas are refused, direct writes taken.
	e.configure(w, messages.Star(e.member("test"), e.member("prim")))
	_, rep = prim.insert(v2, "late")
	_, err = w.Append(ctx, rep)
	require.ErrorIs(t, err, streamwal.ErrNotSecondary)
	_, err = w.Append(ctx, e.insert(v2, "direct"))
	require.NoError(t, err)
}

// TestReplicationSurvivesReopen: the role and the source position come
// back from the log (a replay from the first message, without recovery
// storage) or from the checkpoint (with it, replaying only its tail).
func TestReplicationSurvivesReopen(t *testing.T) {
	for _, storage := range []bool{false, true} {
		t.Run(fmt.Sprint("storage=", storage), func(t *testing.T) {
			se := newStorageEnv(t, nil)
			e := se.env
			open := func(term uint64) *wal.WAL {
				if storage {
					return se.openStorage(term)
				}
				return e.open(term)
			}
			ctx := context.Background()
			prim := newSource(t, e, "prim")
			w1 := open(1)
			e.configure(w1, messages.Star(e.member("prim"), e.member("test")))
			v := e.vchannel(1)
			_, err := w1.Append(ctx, prim.createCollection(v))
			require.NoError(t, err)
			var last *messages.MutableMessage
			for i := range 150 {
				_, rep := prim.insert(v, fmt.Sprint("row ", i))
				last = rep.Clone()
				_, err := w1.Append(ctx, rep)
				require.NoError(t, err)
			}
			require.NoError(t, w1.Close())

			w2 := open(2)
			if storage {
				require.Greater(t, w2.Recovered().From, messages.MessageID(3), "the replay starts past the AlterReplicateConfig")
			}
			topo, ok, source, _ := w2.Replication()
			require.True(t, ok)
			require.Equal(t, messages.RoleSecondary, topo.Role("test"))
			require.Equal(t, last.Replicate(), source)
			_, err = w2.Append(ctx, e.insert(v, "direct"))
			requireNotPrimary(t, err, "prim")
			_, err = w2.Append(ctx, last)
			require.ErrorIs(t, err, streamwal.ErrDuplicate)
			_, rep := prim.insert(v, "next")
			_, err = w2.Append(ctx, rep)
			require.NoError(t, err)
		})
	}
}

// TestRolesFollowTheLog: writers append direct writes and replicas while
// the topology flips between primary and secondary; whatever landed
// obeys the role the log gave at its position, and the replicas' source
// TimeTicks only grow along the log.
func TestRolesFollowTheLog(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w := e.open(1)
	v := e.vchannel(1)
	e.createCollection(w, v)
	prim := newSource(t, e, "prim")
	var srcMu sync.Mutex // the source's log is written by one writer at a time
	secondary := messages.Star(e.member("prim"), e.member("test"))
	primary := messages.Star(e.member("test"), e.member("prim"))

	var landed, refusedRole atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var m *messages.MutableMessage
				if g%2 == 0 {
					m = e.insert(v, fmt.Sprint("direct ", g, " ", i))
				} else {
					srcMu.Lock()
					_, m = prim.insert(v, fmt.Sprint("replica ", g, " ", i))
					srcMu.Unlock()
				}
				_, err := w.Append(ctx, m)
				switch {
				case err == nil:
					landed.Add(1)
				case streamwal.CodeOf(err) == streamwal.CodeNotPrimary || streamwal.CodeOf(err) == streamwal.CodeNotSecondary:
					refusedRole.Add(1)
				case streamwal.CodeOf(err) == streamwal.CodeDuplicate || streamwal.CodeOf(err) == streamwal.CodeUnavailable:
					// A replica overtaken by a later one of the source.
				default:
					t.Errorf("append: %v", err)
					return
				}
			}
		}()
	}
	for i := range 20 {
		topo := primary
		if i%2 == 0 {
			topo = secondary
		}
		e.configure(w, topo)
		// Let the writers meet this role a few times.
		for before := landed.Load() + refusedRole.Load(); landed.Load()+refusedRole.Load() < before+10; {
			_, err := w.Append(ctx, e.insert(v, "pace", messages.WithUnreplicable()))
			require.NoError(t, err)
		}
	}
	close(stop)
	wg.Wait()
	require.Positive(t, landed.Load())
	require.Positive(t, refusedRole.Load())

	// Read the log back and check every message against the role of its
	// position.
	last, err := w.Append(ctx, e.insert(v, "end", messages.WithUnreplicable()))
	require.NoError(t, err)
	role := messages.RolePrimary
	var high messages.TimeTick
	configs, replicas, direct := 0, 0, 0
	for _, m := range e.readUntil(e.scan(streamwal.VChannel{}, read.Earliest(), messages.TypeInsert, messages.TypeAlterReplicateConfig), last.ID()) {
		if m.Type() == messages.TypeAlterReplicateConfig {
			var topo messages.Topology
			require.NoError(t, m.Body(&topo))
			role = topo.Role("test")
			configs++
			continue
		}
		h := m.Replicate()
		switch {
		case m.Unreplicable():
		case h != nil:
			require.Equal(t, messages.RoleSecondary, role, "replica %d landed on a primary", m.ID())
			require.Greater(t, h.TimeTick, high, "replica %d goes back in its source", m.ID())
			high = h.TimeTick
			replicas++
		default:
			require.Equal(t, messages.RolePrimary, role, "direct write %d landed on a secondary", m.ID())
			direct++
		}
	}
	require.Equal(t, 20, configs)
	require.Positive(t, replicas)
	require.Positive(t, direct)
}

// TestAppendUnitsStopsAtARefusal: what lands of AppendUnits is a prefix
// of the units (a replica landed before does not end it), so that a
// replicator's source position never passes a replica that was refused.
func TestAppendUnitsStopsAtARefusal(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w := e.open(1)
	e.configure(w, messages.Star(e.member("prim"), e.member("test")))
	prim := newSource(t, e, "prim")
	v, unknown := e.vchannel(1), e.vchannel(2)
	_, err := w.Append(ctx, prim.createCollection(v))
	require.NoError(t, err)
	_, done := prim.insert(v, "landed before")
	_, err = w.Append(ctx, done.Clone())
	require.NoError(t, err)
	_, a := prim.insert(v, "a")
	_, bad := prim.insert(unknown, "no such collection")
	_, b := prim.insert(v, "b")
	out, errs := w.AppendUnits(ctx, [][]*messages.MutableMessage{{done}, {a}, {bad}, {b}})
	require.ErrorIs(t, errs[0], streamwal.ErrDuplicate)
	require.NoError(t, errs[1], "a duplicate does not stop the units after it")
	require.ErrorIs(t, errs[2], streamwal.ErrLifecycle)
	require.ErrorIs(t, errs[3], streamwal.ErrUnavailable, "nothing starts past a refusal")
	require.Nil(t, out[3])
	_, _, source, _ := w.Replication()
	require.Equal(t, a.Replicate(), source)
}

// TestHandoverAndOlderTopologies: a primary handing over (a switchover
// in progress) refuses direct writes with NOT_PRIMARY naming the cluster
// that takes over, and replicas; a topology older than the one in force
// changes nothing, wakes nobody, and stays ignored when the log is
// replayed.
func TestHandoverAndOlderTopologies(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w := e.open(1)
	v := e.vchannel(1)
	e.createCollection(w, v)
	star := messages.Star(e.member("test"), e.member("sec"))
	star.Version = 2
	e.configure(w, star)
	_, err := w.Append(ctx, e.insert(v, "before"))
	require.NoError(t, err)

	fence := star.Clone()
	fence.Version, fence.Handover = 3, "sec"
	e.configure(w, fence)
	handingOver := func(w *wal.WAL) {
		t.Helper()
		_, err := w.Append(ctx, e.insert(v, "during"))
		requireNotPrimary(t, err, "sec")
		_, err = w.BeginTxn(ctx, v, 0)
		requireNotPrimary(t, err, "sec")
		_, err = w.Append(ctx, e.insert(v, "local only", messages.WithUnreplicable()))
		require.NoError(t, err, "an unreplicable message stays in its cluster")
		_, rep := newSource(t, e, "sec").insert(v, "replica")
		_, err = w.Append(ctx, rep)
		require.ErrorIs(t, err, streamwal.ErrNotSecondary, "a primary handing over is no secondary")
	}
	handingOver(w)

	// The star of version 2 again, late: ignored.
	_, _, _, changed := w.Replication()
	e.configure(w, star)
	select {
	case <-changed:
		t.Fatal("an older topology woke the replicator")
	default:
	}
	got, ok, _, _ := w.Replication()
	require.True(t, ok)
	require.Equal(t, fence, got)
	handingOver(w)
	require.NoError(t, w.Close())

	// The replay of the log ignores it too.
	w = e.open(2)
	got, _, _, _ = w.Replication()
	require.Equal(t, fence, got)
	handingOver(w)

	// The newer topology takes effect: a secondary of sec.
	swapped := fence.Promote("sec")
	swapped.Version = 4
	e.configure(w, swapped)
	_, err = w.Append(ctx, e.insert(v, "after"))
	requireNotPrimary(t, err, "sec")
	got, _, _, _ = w.Replication()
	require.Equal(t, messages.RoleSecondary, got.Role("test"))
}
