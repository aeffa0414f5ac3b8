package wal

import (
	"context"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/shard"
)

// planSegments, under the mutex before op's TimeTicks are drawn, opens a
// growing segment for every insert of op whose VChannel and partition
// have none: a CreateSegment, whose TimeTick is the segment's ID, rides
// in front of op in the same atomic unit.
func (w *WAL) planSegments(op *appendOp) error {
	if w.segs == nil || op.internal {
		return nil
	}
	for _, m := range op.msgs {
		if !assignable(m) {
			continue
		}
		d, _ := m.DML()
		v, part := m.VChannel(), partitionOf(d)
		if _, ok := w.segs.Growing(v, part); ok {
			continue
		}
		if w.life.Check(m) != nil {
			continue // the lifecycle stage refuses it: no segment for it
		}
		if err := w.openSegment(op, v, part); err != nil {
			return err
		}
	}
	return nil
}

// openSegment adds the CreateSegment of a new segment of v and part to op.
func (w *WAL) openSegment(op *appendOp, v streamwal.VChannel, part int64) error {
	tt, err := w.nextTimeTick()
	if err != nil {
		return err
	}
	id := int64(tt)
	cs, err := w.codec.NewBody(messages.TypeCreateSegment, v,
		messages.CreateSegmentBody{CollectionID: v.CollectionID(), PartitionID: part, SegmentID: id})
	if err != nil {
		return err
	}
	cs.SetTimeTick(tt)
	if err := w.segs.Create(v, part, id, tt.Physical()); err != nil {
		return streamwal.Errorf(streamwal.CodeInternal, "open a segment of %s partition %d: %w", v, part, err)
	}
	op.pre, op.preTTs, op.created = append(op.pre, cs), append(op.preTTs, tt), append(op.created, id)
	return nil
}

// assignable reports whether m is an insert that goes to a segment.
func assignable(m *messages.MutableMessage) bool {
	v := m.VChannel()
	return m.Type() == messages.TypeInsert && !v.IsZero() && !v.IsControl()
}

// partitionOf is the partition an insert goes to: 0 for none.
func partitionOf(d messages.DMLHeader) int64 {
	return max(d.PartitionID, 0)
}

// shardInterceptor assigns inserts to growing segments and seals what
// ManualFlush, partition and collection DDL and FlushAll cover. It
// refuses nothing that the lifecycle stage let through.
type shardInterceptor struct{}

func (shardInterceptor) admit(context.Context, *WAL, *appendOp) error { return nil }

func (shardInterceptor) stamp(w *WAL, op *appendOp) error {
	if w.segs == nil {
		return nil
	}
	op.shares = unitShares(op)
	for i, m := range op.msgs {
		if err := w.stampSegment(op, i, m); err != nil {
			return err
		}
	}
	return nil
}

// share is what an insert counts in its segment: rows and bytes.
type share struct{ rows, bytes uint64 }

// unitShares says what each insert of op counts in its segment. The
// inserts of one op into one partition land together, in one atomic unit,
// and no segment can be opened in the middle of it (its CreateSegment
// would land after inserts with later TimeTicks): they are stamped as one,
// the last of them with all their rows and bytes and the others with
// none, so that none fills the segment before the others are in it.
func unitShares(op *appendOp) []share {
	if len(op.msgs) == 1 {
		// One message, one share: no need to group.
		m := op.msgs[0]
		if !assignable(m) {
			return nil
		}
		d, _ := m.DML()
		return []share{{d.Rows, shard.InsertBytes(m)}}
	}
	out := make([]share, len(op.msgs))
	type part struct {
		v streamwal.VChannel
		p int64
	}
	last := map[part]int{}
	sum := map[part]share{}
	for i, m := range op.msgs {
		if !assignable(m) {
			continue
		}
		d, _ := m.DML()
		k := part{m.VChannel(), partitionOf(d)}
		last[k] = i
		s := sum[k]
		sum[k] = share{s.rows + d.Rows, s.bytes + shard.InsertBytes(m)}
	}
	for k, i := range last {
		out[i] = sum[k]
	}
	return out
}

// stampSegment assigns message i of op, or seals what it covers.
func (w *WAL) stampSegment(op *appendOp, i int, m *messages.MutableMessage) error {
	v := m.VChannel()
	switch m.Type() {
	case messages.TypeManualFlush:
		w.segs.SealVChannel(v, shard.ReasonManual)
	case messages.TypeDropCollection, messages.TypeTruncateCollection:
		w.segs.SealVChannel(v, shard.ReasonLifecycle)
	case messages.TypeDropPartition:
		var b messages.PartitionBody
		if m.Body(&b) == nil {
			w.segs.SealPartition(v, b.PartitionID, shard.ReasonLifecycle)
		}
	case messages.TypeFlushAll:
		w.segs.SealAll(shard.ReasonFlushAll)
	}
	if op.internal || !assignable(m) {
		return nil
	}
	d, _ := m.DML()
	id, ok := w.segs.Growing(v, partitionOf(d))
	if !ok {
		return streamwal.Errorf(streamwal.CodeInternal, "no growing segment for an insert on %s partition %d", v, partitionOf(d))
	}
	var holder messages.TxnID
	if tc := m.Txn(); tc != nil && !op.whole {
		holder = tc.ID
	}
	if err := w.segs.Stamp(id, op.shares[i].rows, op.shares[i].bytes, holder, op.tts[i].Physical()); err != nil {
		return streamwal.Errorf(streamwal.CodeInternal, "assign an insert to segment %d: %w", id, err)
	}
	if holder != 0 {
		w.held[holder] = struct{}{}
	}
	m.SetSegment(id)
	if op.segs == nil {
		op.segs = make([]int64, len(op.msgs))
	}
	op.segs[i] = id
	return nil
}

func (shardInterceptor) finish(w *WAL, op *appendOp, _ int) {
	if w.segs == nil {
		return
	}
	for i, id := range op.segs {
		if id == 0 {
			continue
		}
		// A message deduplicated to one stored before did not land.
		ok := op.outcome == landed && op.ids[i] > op.tail
		var at messages.MessageID
		if ok {
			at = op.ids[i]
		}
		w.segs.Resolve(id, op.shares[i].rows, op.shares[i].bytes, ok, at, op.tts[i])
	}
	if op.outcome != landed {
		// Its CreateSegments did not land, or may not have: later inserts
		// go to new segments.
		for _, id := range op.created {
			w.segs.CreateFailed(id)
		}
		return
	}
	for i, m := range op.msgs {
		if m.Type() == messages.TypeDropCollection && op.ids[i] > op.tail {
			if err := w.segs.Dropped(m.VChannel(), op.ids[i]); err != nil {
				w.log.Warn().Err(err).Str("vchannel", m.VChannel().String()).Msg("segments of a dropped collection")
			}
		}
	}
}

// shardTick runs the seal policies and appends a Flush for every sealed
// segment whose inserts all landed and that no open transaction holds.
func (w *WAL) shardTick(ctx context.Context) {
	if w.segs == nil {
		return
	}
	w.mu.Lock()
	w.releaseHolds()
	w.segs.Tick(time.Now())
	ready := w.segs.Ready()
	w.mu.Unlock()
	for _, f := range ready {
		if err := w.appendFlush(ctx, f); err != nil {
			w.log.Warn().Err(err).Str("vchannel", f.VChannel.String()).Ints64("segments", f.Segments).Msg("flush not appended; will retry")
			w.mu.Lock()
			w.segs.FlushFailed(f)
			w.mu.Unlock()
			continue
		}
		w.log.Debug().Str("vchannel", f.VChannel.String()).Ints64("segments", f.Segments).Str("reason", string(f.Reason)).Msg("segments sealed")
	}
}

// appendFlush appends the Flush of f.
func (w *WAL) appendFlush(ctx context.Context, f shard.Flush) error {
	m, err := w.codec.NewBody(messages.TypeFlush, f.VChannel,
		messages.FlushBody{CollectionID: f.CollectionID, SegmentIDs: f.Segments, Reason: string(f.Reason)})
	if err != nil {
		return err
	}
	out, err := w.run(ctx, &appendOp{msgs: []*messages.MutableMessage{m}, internal: true})
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.segs.FlushLanded(f, out[0].ID())
}

// releaseHolds tells the shard manager of the transactions with rows in
// segments that ended.
func (w *WAL) releaseHolds() {
	for id := range w.held {
		if _, live := w.txns.Get(id); live {
			continue
		}
		w.segs.TxnEnded(id)
		delete(w.held, id)
	}
}
