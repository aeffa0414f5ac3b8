package shard_test

import (
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/shard"
)

// The model test drives a live manager the way the WAL does, with random
// interleavings of stamps, resolutions, transactions, seals, ticks and
// Flushes, and checks it against a model after every step. The messages
// that land form a stream in stamp order (a message's position is its
// MessageID; messages that did not land leave gaps); a follower manager
// applies the settled prefix of that stream (every position up to it
// resolved), and is checked for idempotence and restore-then-replay, and
// at the end against the live manager. A restart replaces the live
// manager by one recovered from a checkpoint of the follower plus replay,
// which then goes on live.

// minsert is an insert stamped into the live manager.
type minsert struct {
	seg         int64
	rows, bytes uint64
	txn         messages.TxnID
	msg         *messages.ImmutableMessage
}

// counted is what the model expects a segment to have landed.
type counted struct {
	rows, bytes     uint64
	first, last     messages.MessageID
	firstTT, lastTT messages.TimeTick
}

// outstanding is a Flush handed out and appended, not resolved yet.
type outstanding struct {
	f   shard.Flush
	msg *messages.ImmutableMessage
}

// snapshot is the follower after a prefix of the stream.
type snapshot struct {
	segs    []shard.Segment
	applied messages.MessageID
}

type model struct {
	t   *rapid.T
	s   *stream
	cfg shard.Config
	mem *shard.Memory
	m   *shard.Manager
	pos messages.MessageID

	inflight    []*minsert
	landed      map[int64]*counted
	open        map[messages.TxnID]streamwal.VChannel
	touched     map[messages.TxnID]map[int64]bool
	nextTxn     messages.TxnID
	handed      map[int64]bool
	flushedOut  map[int64]messages.MessageID
	byFlush     map[int64]bool // flushed out by a Flush (not a drop)
	byMessage   map[int64]bool // growing when a seal message covered it
	outs        []outstanding
	failed      map[int64]bool // CreateSegment did not land
	dropped     map[streamwal.VChannel]bool
	forgotten   map[int64]bool
	stampedRows uint64
	lostRows    uint64

	// The stream: settled positions (nil: did not land), the settled
	// prefix's landed messages, and the follower fed with them.
	settled map[messages.MessageID]*messages.ImmutableMessage
	done    messages.MessageID
	prefix  []*messages.ImmutableMessage
	f       *shard.Manager
	snaps   []snapshot
	// dup follows the stream too, re-reading its tail at every step.
	dup     *shard.Manager
	dupDone int
}

func drawConfig(t *rapid.T) shard.Config {
	return shard.Config{
		Capacity:     rapid.Uint64Range(200, 3000).Draw(t, "capacity"),
		Jitter:       rapid.SampledFrom([]float64{-1, 0, 0.3, 1}).Draw(t, "jitter"),
		MaxRows:      rapid.SampledFrom([]uint64{0, 20, 60}).Draw(t, "maxRows"),
		Lifetime:     rapid.SampledFrom([]time.Duration{-1, 0, 3 * time.Minute, 20 * time.Minute}).Draw(t, "lifetime"),
		Idle:         rapid.SampledFrom([]time.Duration{-1, 0, time.Minute, 4 * time.Minute}).Draw(t, "idle"),
		IdleMinBytes: rapid.SampledFrom([]uint64{0, 1, 200}).Draw(t, "idleMinBytes"),
	}
}

func newModel(t *rapid.T) *model {
	cfg := drawConfig(t)
	follower, dup := newManager(t, cfg), newManager(t, cfg)
	high := rapid.SampledFrom([]uint64{0, 300, 600, 1500}).Draw(t, "high")
	low := rapid.Uint64Range(0, high).Draw(t, "low")
	mem := shard.NewMemory(high, low)
	seed := rapid.Uint64().Draw(t, "seed")
	cfg.Memory, cfg.Rand = mem, rand.New(rand.NewPCG(seed, seed)).Float64
	return &model{
		t: t, s: newStream(t), cfg: cfg, mem: mem, m: newManager(t, cfg), f: follower, dup: dup,
		landed: map[int64]*counted{}, open: map[messages.TxnID]streamwal.VChannel{},
		touched: map[messages.TxnID]map[int64]bool{}, handed: map[int64]bool{},
		flushedOut: map[int64]messages.MessageID{}, byFlush: map[int64]bool{}, byMessage: map[int64]bool{},
		failed: map[int64]bool{}, dropped: map[streamwal.VChannel]bool{}, forgotten: map[int64]bool{},
		settled: map[messages.MessageID]*messages.ImmutableMessage{}, snaps: []snapshot{{}},
	}
}

func TestModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		md := newModel(t)
		actions := map[string]func(*rapid.T){
			"insert":       md.insert,
			"resolve":      md.resolve,
			"txnEnd":       md.txnEnd,
			"sealMessage":  md.sealMessage,
			"sealDirect":   md.sealDirect,
			"tick":         md.tick,
			"ready":        md.ready,
			"resolveFlush": md.resolveFlush,
			"markFlushed":  md.markFlushed,
			"restart":      md.restart,
			"":             md.check,
		}
		for range 3 {
			t.Repeat(actions)
		}
		md.drain(t)
		md.compareFollower(t)
		md.checkTwice(t)
	})
}

// keepalive is the transactions' keepalive: long enough that no replay
// expires one the model keeps open.
const keepalive = 1000 * time.Hour

// --- the stream ---

// freeze stamps m at tt and gives it the next position.
func (md *model) freeze(m *messages.MutableMessage, tt messages.TimeTick) *messages.ImmutableMessage {
	m.SetTimeTick(tt)
	md.pos++
	return m.Freeze(md.pos)
}

// stampBody builds and stamps a message with a body.
func (md *model) stampBody(typ *messages.Type, v streamwal.VChannel, body any, opts ...messages.Option) *messages.ImmutableMessage {
	var m *messages.MutableMessage
	var err error
	if v.IsZero() {
		m, err = md.s.c.NewPChannelBody(typ, md.s.p, body)
	} else {
		m, err = md.s.c.NewBody(typ, v, body, opts...)
	}
	require.NoError(md.t, err)
	return md.freeze(m, md.s.next())
}

// settle records whether msg landed and feeds the follower what became
// settled.
func (md *model) settle(msg *messages.ImmutableMessage, landed bool) {
	if landed {
		md.settled[msg.ID()] = msg
	} else {
		md.settled[msg.ID()] = nil
	}
	for {
		msg, ok := md.settled[md.done+1]
		if !ok {
			return
		}
		delete(md.settled, md.done+1)
		md.done++
		if msg != nil {
			md.prefix = append(md.prefix, msg)
			md.followerApply(md.f, msg)
			md.snaps = append(md.snaps, snapshot{md.f.Segments(), md.f.Applied()})
		}
	}
}

// followerApply applies msg to a follower; the only errors expected are
// about segments whose CreateSegment did not land.
func (md *model) followerApply(f *shard.Manager, msg *messages.ImmutableMessage) {
	err := f.Apply(msg)
	if err == nil {
		return
	}
	require.ErrorIs(md.t, err, shard.ErrUnknownSegment, "apply %s at %d", msg.Type(), msg.ID())
	var ids []int64
	if msg.Type() == messages.TypeFlush {
		var b messages.FlushBody
		require.NoError(md.t, msg.Body(&b))
		ids = b.SegmentIDs
	} else {
		ids = []int64{msg.Header().DML.SegmentID}
	}
	require.True(md.t, slices.ContainsFunc(ids, func(id int64) bool { return md.failed[id] }), "%v: %v", ids, err)
}

// --- actions ---

func (md *model) liveVChannels() []streamwal.VChannel {
	var out []streamwal.VChannel
	for _, v := range md.s.vs {
		if !md.dropped[v] {
			out = append(out, v)
		}
	}
	return out
}

func (md *model) drawVChannel(t *rapid.T) streamwal.VChannel {
	vs := md.liveVChannels()
	if len(vs) == 0 {
		t.Skip("every vchannel dropped")
	}
	return rapid.SampledFrom(vs).Draw(t, "v")
}

// drawTxn is 0, an open transaction of v, or a new one.
func (md *model) drawTxn(t *rapid.T, v streamwal.VChannel) messages.TxnID {
	var txns []messages.TxnID
	for id, tv := range md.open {
		if tv == v {
			txns = append(txns, id)
		}
	}
	slices.Sort(txns)
	switch k := rapid.IntRange(0, 4).Draw(t, "txnKind"); {
	case k == 0:
		md.nextTxn++
		md.open[md.nextTxn] = v
		md.touched[md.nextTxn] = map[int64]bool{}
		return md.nextTxn
	case k == 1 && len(txns) > 0:
		return rapid.SampledFrom(txns).Draw(t, "txn")
	}
	return 0
}

// create stamps a CreateSegment for partition p of v, as the WAL does
// before an insert that has no growing segment; lands reports whether it
// landed.
func (md *model) create(t *rapid.T, v streamwal.VChannel, p int64) (id int64, lands bool) {
	tt := md.s.next()
	id = int64(tt)
	m, err := md.s.c.NewBody(messages.TypeCreateSegment, v, messages.CreateSegmentBody{CollectionID: v.CollectionID(), PartitionID: p, SegmentID: id})
	require.NoError(t, err)
	msg := md.freeze(m, tt)
	require.NoError(t, md.m.Create(v, p, id, tt.Physical()))
	lands = rapid.IntRange(0, 9).Draw(t, "createLands") > 0
	md.settle(msg, lands)
	if !lands {
		md.failed[id] = true
	}
	return id, lands
}

func (md *model) insert(t *rapid.T) {
	v := md.drawVChannel(t)
	p := rapid.Int64Range(-1, 2).Draw(t, "partition")
	rows := rapid.Uint64Range(1, 5).Draw(t, "rows")
	size := rapid.IntRange(1, 300).Draw(t, "bytes")
	txn := md.drawTxn(t, v)
	id, ok := md.m.Growing(v, p)
	lands := true
	if !ok {
		id, lands = md.create(t, v, max(p, 0))
	}
	require.False(t, md.handed[id], "an insert into segment %d, whose Flush is handed out", id)
	require.Zero(t, md.flushedOut[id], "an insert into segment %d, flushed out", id)
	require.NoError(t, md.m.Stamp(id, rows, uint64(size), txn, md.s.now))
	opts := []messages.Option{messages.WithDML(p, rows)}
	if txn != 0 {
		opts = append(opts, messages.WithTxn(messages.TxnContext{ID: txn, Keepalive: keepalive}))
		md.touched[txn][id] = true
	}
	m, err := md.s.c.New(messages.TypeInsert, v, make([]byte, size), opts...)
	require.NoError(t, err)
	m.SetSegment(id)
	md.inflight = append(md.inflight, &minsert{seg: id, rows: rows, bytes: uint64(size), txn: txn, msg: md.freeze(m, md.s.next())})
	md.stampedRows += rows
	if !lands {
		md.m.CreateFailed(id)
	}
}

func (md *model) resolve(t *rapid.T) {
	if len(md.inflight) == 0 {
		t.Skip("nothing in flight")
	}
	i := rapid.IntRange(0, len(md.inflight)-1).Draw(t, "insert")
	in := md.inflight[i]
	md.inflight = slices.Delete(md.inflight, i, i+1)
	md.resolveOne(in, rapid.IntRange(0, 4).Draw(t, "landed") > 0)
}

func (md *model) resolveOne(in *minsert, landed bool) {
	require.Zero(md.t, md.flushedOut[in.seg], "segment %d flushed out with insert in flight", in.seg)
	md.m.Resolve(in.seg, in.rows, in.bytes, landed, in.msg.ID(), in.msg.TimeTick())
	if landed {
		c := md.landed[in.seg]
		if c == nil {
			c = &counted{}
			md.landed[in.seg] = c
		}
		c.rows += in.rows
		c.bytes += in.bytes
		c.first, c.last = lowerNonZero(c.first, in.msg.ID()), max(c.last, in.msg.ID())
		c.firstTT, c.lastTT = lowerNonZero(c.firstTT, in.msg.TimeTick()), max(c.lastTT, in.msg.TimeTick())
	} else {
		md.lostRows += in.rows
	}
	md.settle(in.msg, landed)
}

func lowerNonZero[T ~uint64](a, b T) T {
	if a == 0 {
		return b
	}
	return min(a, b)
}

func (md *model) txnEnd(t *rapid.T) {
	if len(md.open) == 0 {
		t.Skip("no open transaction")
	}
	txn := rapid.SampledFrom(slices.Sorted(maps.Keys(md.open))).Draw(t, "txn")
	typ, body := messages.TypeCommitTxn, any(messages.CommitTxnBody{})
	if rapid.Bool().Draw(t, "rollback") {
		typ, body = messages.TypeRollbackTxn, messages.RollbackTxnBody{}
	}
	msg := md.stampBody(typ, md.open[txn], body, messages.WithTxn(messages.TxnContext{ID: txn, Keepalive: keepalive}))
	md.settle(msg, true)
	md.endTxn(txn)
}

func (md *model) endTxn(txn messages.TxnID) {
	md.m.TxnEnded(txn)
	delete(md.open, txn)
	delete(md.touched, txn)
}

// abort ends the open transactions an exclusive operation on v (every one
// when v is zero) aborts, as the WAL does.
func (md *model) abort(v streamwal.VChannel) {
	for txn, tv := range md.open {
		if v.IsZero() || tv == v {
			md.endTxn(txn)
		}
	}
}

// covered notes the growing segments a seal message covers.
func (md *model) covered(cover func(s shard.Segment) bool) {
	for _, s := range md.m.Segments() {
		if s.State == shard.Growing && cover(s) {
			md.byMessage[s.ID] = true
		}
	}
}

// sealMessage appends one of the messages that seal what they cover.
func (md *model) sealMessage(t *rapid.T) {
	v := md.drawVChannel(t)
	onV := func(s shard.Segment) bool { return s.VChannel == v }
	var msg *messages.ImmutableMessage
	switch rapid.IntRange(0, 4).Draw(t, "kind") {
	case 0:
		md.covered(onV)
		md.m.SealVChannel(v, shard.ReasonManual)
		msg = md.stampBody(messages.TypeManualFlush, v, messages.ManualFlushBody{CollectionID: v.CollectionID()})
	case 1:
		p := rapid.Int64Range(1, 2).Draw(t, "dropPartition")
		md.covered(func(s shard.Segment) bool { return s.VChannel == v && s.Partition == p })
		md.m.SealPartition(v, p, shard.ReasonLifecycle)
		msg = md.stampBody(messages.TypeDropPartition, v, messages.PartitionBody{CollectionRef: md.s.ref(v), PartitionID: p})
	case 2:
		md.covered(onV)
		md.m.SealVChannel(v, shard.ReasonLifecycle)
		msg = md.stampBody(messages.TypeTruncateCollection, v, messages.TruncateCollectionBody{CollectionRef: md.s.ref(v)})
	case 3:
		md.covered(func(shard.Segment) bool { return true })
		md.m.SealAll(shard.ReasonFlushAll)
		msg = md.stampBody(messages.TypeFlushAll, streamwal.VChannel{}, messages.FlushAllBody{})
		v = streamwal.VChannel{}
	case 4:
		md.dropCollection(t, v)
		return
	}
	md.abort(v)
	md.settle(msg, true)
}

// dropCollection drops v; like the WAL's exclusive lock, it waits for
// nothing in flight on v (here: it is skipped otherwise).
func (md *model) dropCollection(t *rapid.T, v streamwal.VChannel) {
	if slices.ContainsFunc(md.inflight, func(in *minsert) bool { return in.msg.VChannel() == v }) ||
		slices.ContainsFunc(md.outs, func(o outstanding) bool { return o.f.VChannel == v }) {
		t.Skip("appends in flight on the vchannel")
	}
	md.covered(func(s shard.Segment) bool { return s.VChannel == v })
	md.m.SealVChannel(v, shard.ReasonLifecycle)
	msg := md.stampBody(messages.TypeDropCollection, v, messages.DropCollectionBody{CollectionRef: md.s.ref(v)})
	md.abort(v)
	md.settle(msg, true)
	require.NoError(t, md.m.Dropped(v, msg.ID()))
	md.dropped[v] = true
	for _, s := range md.m.Segments() {
		if s.VChannel == v && md.flushedOut[s.ID] == 0 {
			require.Equal(t, msg.ID(), s.FlushedAt)
			md.flushedOut[s.ID] = msg.ID()
			md.handed[s.ID] = false
		}
	}
}

// sealDirect seals without a message, as a policy would.
func (md *model) sealDirect(t *rapid.T) {
	v := md.drawVChannel(t)
	r := rapid.SampledFrom([]shard.Reason{shard.ReasonCapacity, shard.ReasonIdle, shard.ReasonMemory}).Draw(t, "reason")
	switch rapid.IntRange(0, 2).Draw(t, "scope") {
	case 0:
		md.m.SealVChannel(v, r)
	case 1:
		md.m.SealPartition(v, rapid.Int64Range(-1, 2).Draw(t, "partition"), r)
	case 2:
		md.m.SealAll(r)
	}
}

// size is what a segment counts against capacity and memory.
func size(s shard.Segment) uint64 { return s.Bytes + s.StampedBytes }

func (md *model) tick(t *rapid.T) {
	md.s.now = md.s.now.Add(time.Duration(rapid.Int64Range(0, 300).Draw(t, "advance")) * time.Second)
	before := map[int64]bool{}
	for _, s := range md.m.Segments() {
		before[s.ID] = s.State == shard.Growing
	}
	md.m.Tick(md.s.now)
	var byMemory, still []shard.Segment
	for _, s := range md.m.Segments() {
		switch {
		case s.State == shard.Growing:
			still = append(still, s)
		case before[s.ID] && s.Reason == shard.ReasonMemory:
			byMemory = append(byMemory, s)
		}
	}
	md.checkMemory(t, byMemory, still)
}

// checkMemory checks what the memory policy did in one Tick: it sealed
// the largest growing segments first, only above the high water mark, and
// no more than it took to reach the low water mark.
func (md *model) checkMemory(t *rapid.T, byMemory, still []shard.Segment) {
	total, high, low := md.mem.Growing(), md.mem.High(), md.mem.Low()
	anyLeft := slices.ContainsFunc(still, func(s shard.Segment) bool { return size(s) > 0 })
	if len(byMemory) == 0 {
		require.True(t, high == 0 || total <= high || !anyLeft, "above the high water mark (%d > %d) with segments to seal", total, high)
		return
	}
	var freed, smallest uint64 = 0, math.MaxUint64
	for _, s := range byMemory {
		freed += size(s)
		smallest = min(smallest, size(s))
		for _, g := range still {
			require.GreaterOrEqual(t, size(s), size(g), "sealed %d (%d bytes) before the larger %d (%d bytes)", s.ID, size(s), g.ID, size(g))
		}
	}
	require.Greater(t, total+freed, high, "fired at or below the high water mark")
	require.True(t, total <= low || !anyLeft, "stopped above the low water mark (%d > %d)", total, low)
	require.Greater(t, total+smallest, low, "sealed more than it took to reach the low water mark")
}

func (md *model) ready(t *rapid.T) {
	for _, f := range md.m.Ready() {
		require.NotEmpty(t, f.Segments)
		require.Equal(t, f.VChannel.CollectionID(), f.CollectionID)
		for _, id := range f.Segments {
			s, ok := md.m.Segment(id)
			require.True(t, ok)
			require.Equal(t, shard.Sealed, s.State)
			require.Equal(t, f.VChannel, s.VChannel)
			require.Equal(t, f.Reason, s.Reason)
			require.Zero(t, s.FlushedAt)
			require.False(t, md.handed[id], "segment %d handed out twice", id)
			require.Zero(t, md.inFlight(id), "segment %d handed out with inserts in flight", id)
			require.Empty(t, md.holders(id), "segment %d handed out while transactions hold it", id)
			md.handed[id] = true
		}
		msg := md.stampBody(messages.TypeFlush, f.VChannel, f.Body())
		md.outs = append(md.outs, outstanding{f, msg})
	}
	// Whatever it kept back was not ready.
	for _, s := range md.m.Segments() {
		if s.State == shard.Sealed && s.FlushedAt == 0 && !md.handed[s.ID] {
			require.True(t, md.inFlight(s.ID) > 0 || len(md.holders(s.ID)) > 0, "segment %d is ready but was not handed out", s.ID)
		}
	}
}

func (md *model) inFlight(id int64) int {
	n := 0
	for _, in := range md.inflight {
		if in.seg == id {
			n++
		}
	}
	return n
}

func (md *model) holders(id int64) []messages.TxnID {
	var out []messages.TxnID
	for txn, segs := range md.touched {
		if segs[id] {
			out = append(out, txn)
		}
	}
	return out
}

func (md *model) resolveFlush(t *rapid.T) {
	if len(md.outs) == 0 {
		t.Skip("no Flush outstanding")
	}
	i := rapid.IntRange(0, len(md.outs)-1).Draw(t, "flush")
	md.resolveFlushOne(md.outs[i], rapid.Bool().Draw(t, "flushLanded"))
	md.outs = slices.Delete(md.outs, i, i+1)
}

func (md *model) resolveFlushOne(o outstanding, landed bool) {
	if landed {
		require.NoError(md.t, md.m.FlushLanded(o.f, o.msg.ID()))
	} else {
		md.m.FlushFailed(o.f)
	}
	for _, id := range o.f.Segments {
		md.handed[id] = false
		if landed {
			md.flushedOut[id] = o.msg.ID()
			md.byFlush[id] = true
		}
	}
	md.settle(o.msg, landed)
}

func (md *model) markFlushed(t *rapid.T) {
	var ids []int64
	for _, s := range md.m.Segments() {
		if s.State == shard.Sealed && s.FlushedAt != 0 {
			ids = append(ids, s.ID)
		}
	}
	if len(ids) == 0 {
		t.Skip("nothing flushed out")
	}
	id := rapid.SampledFrom(ids).Draw(t, "segment")
	require.NoError(t, md.m.MarkFlushed(id))
	if rapid.Bool().Draw(t, "forget") {
		md.m.Forget(id)
		md.forgotten[id] = true
	}
}

// restart stops the node and opens the PChannel again: what was in
// flight lands or not, unseen by the old manager; the new one restores
// a checkpoint of the follower and replays the stream from where open
// transactions began (or the checkpoint), and goes on live.
func (md *model) restart(t *rapid.T) {
	for _, in := range md.inflight {
		md.settle(in.msg, rapid.Bool().Draw(t, "crashLanded"))
	}
	for _, o := range md.outs {
		md.settle(o.msg, rapid.Bool().Draw(t, "crashFlushLanded"))
	}
	md.inflight, md.outs = nil, nil
	require.Empty(t, md.settled)
	require.NoError(t, md.m.Restore(nil, 0))
	require.Zero(t, md.mem.Growing(), "the old manager gave its bytes back")

	k := rapid.IntRange(0, len(md.prefix)).Draw(t, "checkpoint")
	j := min(k, md.firstOpenInsert())
	m := newManager(t, md.cfg)
	require.NoError(t, m.Restore(md.snaps[k].segs, md.snaps[k].applied))
	for _, msg := range md.prefix[j:] {
		md.followerApply(m, msg)
	}
	require.Equal(t, persisted(md.f.Segments()), persisted(m.Segments()))
	md.m = m
	md.resetFromLive()
}

// firstOpenInsert is the index in the prefix of the first insert of a
// transaction still open.
func (md *model) firstOpenInsert() int {
	i := slices.IndexFunc(md.prefix, func(msg *messages.ImmutableMessage) bool {
		_, open := md.open[txnOf(msg)]
		return msg.Type() == messages.TypeInsert && open
	})
	if i < 0 {
		return len(md.prefix)
	}
	return i
}

func txnOf(msg *messages.ImmutableMessage) messages.TxnID {
	if tc := msg.Txn(); tc != nil {
		return tc.ID
	}
	return 0
}

// resetFromLive takes the model's view of the live manager from the one
// recovery built: what landed, what is flushed out, and what the open
// transactions hold (their landed inserts in segments not flushed out).
func (md *model) resetFromLive() {
	md.landed, md.handed, md.forgotten = map[int64]*counted{}, map[int64]bool{}, map[int64]bool{}
	md.flushedOut = map[int64]messages.MessageID{}
	md.stampedRows, md.lostRows = 0, 0
	for _, s := range md.m.Segments() {
		md.landed[s.ID] = &counted{s.Rows, s.Bytes, s.First, s.Last, s.FirstTT, s.LastTT}
		md.flushedOut[s.ID] = s.FlushedAt
		md.stampedRows += s.Rows
	}
	for txn := range md.touched {
		md.touched[txn] = map[int64]bool{}
	}
	for _, msg := range md.prefix {
		txn := txnOf(msg)
		if _, open := md.open[txn]; !open || msg.Type() != messages.TypeInsert {
			continue
		}
		id := msg.Header().DML.SegmentID
		if s, ok := md.m.Segment(id); ok && s.FlushedAt == 0 {
			md.touched[txn][id] = true
		}
	}
}

// --- checks ---

// check runs after every action.
func (md *model) check(t *rapid.T) {
	md.checkSegments(t)
	md.checkFollower(t)
}

// checkSegments checks the live manager against the model.
func (md *model) checkSegments(t *rapid.T) {
	var rows, growing uint64
	seen := map[int64]bool{}
	for _, s := range md.m.Segments() {
		seen[s.ID] = true
		md.checkSegment(t, s)
		rows += s.Rows + s.StampedRows
		if s.State == shard.Growing {
			growing += size(s)
		}
	}
	for id, c := range md.landed {
		if md.forgotten[id] {
			rows += c.rows
		}
	}
	require.Equal(t, md.stampedRows, rows+md.lostRows, "every row stamped is in exactly one segment or lost")
	for _, in := range md.inflight {
		require.True(t, seen[in.seg], "insert in flight into unknown segment %d", in.seg)
	}
	require.Equal(t, growing, md.mem.Growing(), "the memory account is the growing segments' bytes")
	for _, v := range md.s.vs {
		for p := int64(-1); p <= 2; p++ {
			if id, ok := md.m.Growing(v, p); ok {
				s, _ := md.m.Segment(id)
				require.Equal(t, shard.Growing, s.State, "Growing returned a %s segment", s.State)
				require.Equal(t, max(p, 0), s.Partition)
			}
		}
	}
}

// checkSegment checks one live segment against the model. It runs for
// every segment after every step, so it tests with plain comparisons.
func (md *model) checkSegment(t *rapid.T, s shard.Segment) {
	var n int
	var rows, bytes uint64
	for _, in := range md.inflight {
		if in.seg == s.ID {
			n, rows, bytes = n+1, rows+in.rows, bytes+in.bytes
		}
	}
	expect(t, n == s.InFlight && rows == s.StampedRows && bytes == s.StampedBytes,
		"segment %d in flight: %d inserts, %d rows, %d bytes; want %d, %d, %d", s.ID, s.InFlight, s.StampedRows, s.StampedBytes, n, rows, bytes)
	c := counted{}
	if md.landed[s.ID] != nil {
		c = *md.landed[s.ID]
	}
	got := counted{s.Rows, s.Bytes, s.First, s.Last, s.FirstTT, s.LastTT}
	expect(t, got == c, "segment %d landed %+v, want %+v", s.ID, got, c)
	expect(t, md.handed[s.ID] == s.HandedOut, "segment %d handed out: %v", s.ID, s.HandedOut)
	expect(t, md.flushedOut[s.ID] == s.FlushedAt, "segment %d flushed out at %d, want %d", s.ID, s.FlushedAt, md.flushedOut[s.ID])
	expect(t, len(md.holders(s.ID)) == s.Holds, "segment %d held by %d, want %v", s.ID, s.Holds, md.holders(s.ID))
	if s.State == shard.Growing {
		id, ok := md.m.Growing(s.VChannel, s.Partition)
		expect(t, ok && id == s.ID, "growing segment %d is not where inserts go", s.ID)
		expect(t, !s.HandedOut && s.FlushedAt == 0, "growing segment %d handed out or flushed out", s.ID)
	}
	md.checkCapacity(t, s)
}

// checkCapacity checks that a segment's capacity is within the jitter.
func (md *model) checkCapacity(t *rapid.T, s shard.Segment) {
	j := md.cfg.Jitter
	switch {
	case j == 0:
		j = shard.DefaultJitter
	case j < 0:
		j = 0
	}
	lo := math.Floor(float64(md.cfg.Capacity) * (1 - j))
	expect(t, s.Capacity <= md.cfg.Capacity && float64(s.Capacity) >= lo, "segment %d capacity %d not in [%v, %d]", s.ID, s.Capacity, lo, md.cfg.Capacity)
}

// expect fails the test unless ok.
func expect(t *rapid.T, ok bool, format string, args ...any) {
	if !ok {
		t.Fatalf(format, args...)
	}
}

// checkFollower checks the follower, which applied the settled prefix:
// a second follower that re-reads the tail of the prefix after every step
// has the same segments, and so has one restored from a snapshot of the
// follower that applies what follows (re-reading some of what the
// snapshot covers).
func (md *model) checkFollower(t *rapid.T) {
	for _, s := range md.f.Segments() {
		md.checkCapacity(t, s)
	}
	n := len(md.prefix)
	for _, msg := range md.prefix[md.dupDone:] {
		md.followerApply(md.dup, msg)
	}
	md.dupDone = n
	for _, msg := range md.prefix[rapid.IntRange(max(0, n-8), n).Draw(t, "reread"):] {
		md.followerApply(md.dup, msg)
	}
	require.Equal(t, md.f.Segments(), md.dup.Segments(), "re-read")

	k := rapid.IntRange(0, n).Draw(t, "cut")
	j := rapid.IntRange(max(0, k-8), k).Draw(t, "replayFrom")
	r := newManager(t, md.followerConfig())
	require.NoError(t, r.Restore(md.snaps[k].segs, md.snaps[k].applied))
	for _, msg := range md.prefix[j:] {
		md.followerApply(r, msg)
	}
	require.Equal(t, persisted(md.f.Segments()), persisted(r.Segments()), "restored at %d, replayed from %d", k, j)
	require.Equal(t, md.f.Applied(), r.Applied())
}

// checkTwice checks that applying the whole stream twice gives the
// segments of applying it once.
func (md *model) checkTwice(t *rapid.T) {
	twice := newManager(t, md.followerConfig())
	for range 2 {
		for _, msg := range md.prefix {
			md.followerApply(twice, msg)
		}
	}
	require.Equal(t, md.f.Segments(), twice.Segments(), "applied twice")
}

func (md *model) followerConfig() shard.Config {
	cfg := md.cfg
	cfg.Memory, cfg.Rand = nil, nil
	return cfg
}

// persisted drops the in-memory fields.
func persisted(segs []shard.Segment) []shard.Segment {
	out := slices.Clone(segs)
	for i := range out {
		out[i].InFlight, out[i].StampedRows, out[i].StampedBytes, out[i].Holds, out[i].HandedOut = 0, 0, 0, 0, false
	}
	return out
}

// drain resolves everything in flight and every Flush outstanding.
func (md *model) drain(t *rapid.T) {
	for len(md.inflight) > 0 {
		in := md.inflight[0]
		md.inflight = md.inflight[1:]
		md.resolveOne(in, rapid.Bool().Draw(t, "drainLanded"))
	}
	for _, o := range md.outs {
		md.resolveFlushOne(o, rapid.Bool().Draw(t, "drainFlushLanded"))
	}
	md.outs = nil
	require.Empty(t, md.settled, "every position settled")
	md.check(t)
}

// compareFollower checks, once everything settled, that the follower
// built from the stream agrees with the live manager on what landed.
func (md *model) compareFollower(t *rapid.T) {
	for _, s := range md.m.Segments() {
		fs, ok := md.f.Segment(s.ID)
		if md.failed[s.ID] {
			require.False(t, ok, "segment %d whose CreateSegment did not land", s.ID)
			continue
		}
		require.True(t, ok, "segment %d", s.ID)
		require.Equal(t, []any{s.VChannel, s.Partition, s.Created, s.FlushedAt}, []any{fs.VChannel, fs.Partition, fs.Created, fs.FlushedAt}, "segment %d", s.ID)
		require.Equal(t, counted{s.Rows, s.Bytes, s.First, s.Last, s.FirstTT, s.LastTT}, counted{fs.Rows, fs.Bytes, fs.First, fs.Last, fs.FirstTT, fs.LastTT}, "segment %d", s.ID)
		if fs.State != shard.Growing {
			require.NotEqual(t, shard.Growing, s.State, "segment %d sealed only in the follower", s.ID)
		}
		if md.byMessage[s.ID] {
			require.NotEqual(t, shard.Growing, fs.State, "segment %d, sealed by a message", s.ID)
		}
		if md.byFlush[s.ID] || md.byMessage[s.ID] {
			require.Equal(t, s.Reason, fs.Reason, "segment %d", s.ID)
		}
	}
	for _, fs := range md.f.Segments() {
		_, ok := md.m.Segment(fs.ID)
		require.True(t, ok || md.forgotten[fs.ID], "segment %d only in the follower", fs.ID)
	}
}
