package shard_test

import (
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/shard"
)

// t0 is the start of the fake clock.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// stream builds the messages of a test stream: MessageIDs from 1 and
// strictly increasing TimeTicks at the fake clock's time.
type stream struct {
	t  require.TestingT
	c  *messages.Codec
	p  streamwal.PChannel
	cc streamwal.VChannel
	// vs are p-0_42v0, p-0_42v1 and p-0_43v0.
	vs   []streamwal.VChannel
	now  time.Time
	id   messages.MessageID
	tt   messages.TimeTick
	msgs []*messages.ImmutableMessage
}

func newStream(t require.TestingT) *stream {
	c, err := messages.NewCodec("test", nil)
	require.NoError(t, err)
	p, err := streamwal.NewPChannel("p", 0)
	require.NoError(t, err)
	s := &stream{t: t, c: c, p: p, cc: p.CChannel(), now: t0}
	for _, sh := range []struct {
		coll  int64
		shard int
	}{{42, 0}, {42, 1}, {43, 0}} {
		v, err := p.VChannel(sh.coll, sh.shard)
		require.NoError(t, err)
		s.vs = append(s.vs, v)
	}
	return s
}

// next is the next TimeTick: at the clock, above every earlier one.
func (s *stream) next() messages.TimeTick {
	s.tt = max(s.tt+1, messages.TimeTickAt(s.now))
	return s.tt
}

// land stamps m with the next TimeTick and lands it at the next ID.
func (s *stream) land(m *messages.MutableMessage) *messages.ImmutableMessage {
	m.SetTimeTick(s.next())
	s.id++
	im := m.Freeze(s.id)
	s.msgs = append(s.msgs, im)
	return im
}

func (s *stream) body(t *messages.Type, v streamwal.VChannel, body any, opts ...messages.Option) *messages.ImmutableMessage {
	m, err := s.c.NewBody(t, v, body, opts...)
	require.NoError(s.t, err)
	return s.land(m)
}

func (s *stream) pbody(t *messages.Type, body any) *messages.ImmutableMessage {
	m, err := s.c.NewPChannelBody(t, s.p, body)
	require.NoError(s.t, err)
	return s.land(m)
}

func (s *stream) create(v streamwal.VChannel, partition, id int64) *messages.ImmutableMessage {
	return s.body(messages.TypeCreateSegment, v, messages.CreateSegmentBody{CollectionID: v.CollectionID(), PartitionID: partition, SegmentID: id})
}

// insert lands an insert of rows with a payload of size bytes into
// segment seg; txn != 0 makes it a body of that transaction (10 s
// keepalive).
func (s *stream) insert(v streamwal.VChannel, partition, seg int64, rows uint64, size int, txn messages.TxnID) *messages.ImmutableMessage {
	opts := []messages.Option{messages.WithDML(partition, rows)}
	if txn != 0 {
		opts = append(opts, messages.WithTxn(messages.TxnContext{ID: txn, Keepalive: 10 * time.Second}))
	}
	m, err := s.c.New(messages.TypeInsert, v, make([]byte, size), opts...)
	require.NoError(s.t, err)
	m.SetSegment(seg)
	return s.land(m)
}

func (s *stream) txnEnd(t *messages.Type, v streamwal.VChannel, txn messages.TxnID) *messages.ImmutableMessage {
	var body any = messages.CommitTxnBody{}
	if t == messages.TypeRollbackTxn {
		body = messages.RollbackTxnBody{}
	}
	return s.body(t, v, body, messages.WithTxn(messages.TxnContext{ID: txn, Keepalive: 10 * time.Second}))
}

func (s *stream) flush(v streamwal.VChannel, r shard.Reason, ids ...int64) *messages.ImmutableMessage {
	return s.body(messages.TypeFlush, v, messages.FlushBody{CollectionID: v.CollectionID(), SegmentIDs: ids, Reason: string(r)})
}

func (s *stream) ref(v streamwal.VChannel) messages.CollectionRef {
	return messages.CollectionRef{DBName: "db", CollectionName: "c", CollectionID: v.CollectionID()}
}

func (s *stream) manualFlush(v streamwal.VChannel) *messages.ImmutableMessage {
	return s.body(messages.TypeManualFlush, v, messages.ManualFlushBody{CollectionID: v.CollectionID()})
}

func (s *stream) dropPartition(v streamwal.VChannel, pid int64) *messages.ImmutableMessage {
	return s.body(messages.TypeDropPartition, v, messages.PartitionBody{CollectionRef: s.ref(v), PartitionID: pid})
}

func (s *stream) dropCollection(v streamwal.VChannel) *messages.ImmutableMessage {
	return s.body(messages.TypeDropCollection, v, messages.DropCollectionBody{CollectionRef: s.ref(v)})
}

func (s *stream) truncate(v streamwal.VChannel) *messages.ImmutableMessage {
	return s.body(messages.TypeTruncateCollection, v, messages.TruncateCollectionBody{CollectionRef: s.ref(v)})
}

func (s *stream) flushAll() *messages.ImmutableMessage {
	return s.pbody(messages.TypeFlushAll, messages.FlushAllBody{})
}

func (s *stream) timeTick() *messages.ImmutableMessage {
	return s.pbody(messages.TypeTimeTick, messages.TimeTickBody{})
}

// newManager returns a manager of cfg, failing the test on error.
func newManager(t require.TestingT, cfg shard.Config) *shard.Manager {
	m, err := shard.New(cfg)
	require.NoError(t, err)
	return m
}

// fixed returns a Rand that yields us in turn, then repeats the last.
func fixed(us ...float64) func() float64 {
	return func() float64 {
		u := us[0]
		if len(us) > 1 {
			us = us[1:]
		}
		return u
	}
}

// seg returns segment id of m, failing the test if it is unknown.
func seg(t require.TestingT, m *shard.Manager, id int64) shard.Segment {
	s, ok := m.Segment(id)
	require.True(t, ok, "segment %d", id)
	return s
}

// applyAll applies msgs and fails the test on an error.
func applyAll(t require.TestingT, m *shard.Manager, msgs []*messages.ImmutableMessage) {
	for _, msg := range msgs {
		require.NoError(t, m.Apply(msg), "apply %s at %d", msg.Type(), msg.ID())
	}
}

// noClock is a Config without the time policies, so that tests of the
// others need not think about the clock.
func noClock(cfg shard.Config) shard.Config {
	cfg.Lifetime, cfg.Idle = -1, -1
	if cfg.Jitter == 0 {
		cfg.Jitter = -1
	}
	return cfg
}
