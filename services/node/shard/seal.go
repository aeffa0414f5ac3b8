package shard

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// Flush is a Flush message to append: sealed segments of one VChannel,
// sealed for one reason, whose inserts all resolved.
type Flush struct {
	VChannel     streamwal.VChannel
	CollectionID int64
	// Segments are sorted by ID.
	Segments []int64
	Reason   Reason
}

// Body is the body of the Flush message.
func (f Flush) Body() messages.FlushBody {
	return messages.FlushBody{CollectionID: f.CollectionID, SegmentIDs: slices.Clone(f.Segments), Reason: string(f.Reason)}
}

// seal seals a growing segment for reason r: it takes no insert any more
// and leaves the memory account.
func (m *Manager) seal(s *segment, r Reason) {
	if s.State != Growing {
		return
	}
	s.State, s.Reason = Sealed, r
	if m.growing[s.key()] == s.ID {
		delete(m.growing, s.key())
	}
	m.uncount(s, s.mem)
	m.pending[s.ID] = s
}

// flushOut records that the message after which no insert may follow
// segment s landed at at; a segment still growing is sealed for r.
func (m *Manager) flushOut(s *segment, at messages.MessageID, r Reason) {
	if s.flushedOut() {
		return
	}
	m.seal(s, r)
	s.FlushedAt = at
	s.HandedOut = false
	delete(m.pending, s.ID)
	m.dropHolds(s)
}

// SealVChannel seals every growing segment of v for reason r.
func (m *Manager) SealVChannel(v streamwal.VChannel, r Reason) {
	for k, id := range m.growing {
		if k.v == v {
			m.seal(m.segs[id], r)
		}
	}
}

// SealPartition seals the growing segment of partition of v, if any, for
// reason r.
func (m *Manager) SealPartition(v streamwal.VChannel, partition int64, r Reason) {
	if id, ok := m.Growing(v, partition); ok {
		m.seal(m.segs[id], r)
	}
}

// SealAll seals every growing segment for reason r.
func (m *Manager) SealAll(r Reason) {
	for _, id := range m.growing {
		m.seal(m.segs[id], r)
	}
}

// Tick runs the seal policies at now: capacity, rows, lifetime and idle on
// each growing segment, then the memory policy.
func (m *Manager) Tick(now time.Time) {
	for _, id := range m.growing {
		s := m.segs[id]
		if r, ok := m.due(s, now); ok {
			m.seal(s, r)
		}
	}
	m.relieve()
}

// full reports whether s reached its capacity or the row limit.
func (m *Manager) full(s *segment) (Reason, bool) {
	if s.Capacity != Off && s.Bytes+s.StampedBytes >= s.Capacity {
		return ReasonCapacity, true
	}
	if m.cfg.MaxRows != Off && s.Rows+s.StampedRows >= m.cfg.MaxRows {
		return ReasonRows, true
	}
	return "", false
}

// due reports the first per-segment policy that seals s at now.
func (m *Manager) due(s *segment, now time.Time) (Reason, bool) {
	if r, ok := m.full(s); ok {
		return r, true
	}
	c := &m.cfg
	if c.Lifetime > 0 && now.Sub(s.Created) >= c.Lifetime {
		return ReasonLifetime, true
	}
	if c.Idle > 0 && c.IdleMinBytes != Off && now.Sub(s.LastInsert) >= c.Idle && s.Bytes >= c.IdleMinBytes {
		return ReasonIdle, true
	}
	return "", false
}

// relieve runs the memory policy: above the high water mark, it seals the
// largest growing segments first until the node is at or below the low
// water mark.
func (m *Manager) relieve() {
	mem := m.cfg.Memory
	if mem == nil || !mem.above() {
		return
	}
	for _, s := range m.largestFirst() {
		if mem.Growing() <= mem.low || s.mem == 0 {
			return
		}
		m.seal(s, ReasonMemory)
	}
}

// largestFirst lists the growing segments by decreasing memory, then ID.
func (m *Manager) largestFirst() []*segment {
	out := make([]*segment, 0, len(m.growing))
	for _, id := range m.growing {
		out = append(out, m.segs[id])
	}
	slices.SortFunc(out, func(a, b *segment) int {
		return cmp.Or(cmp.Compare(b.mem, a.mem), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// ready reports whether the Flush of s may be handed out now.
func (s *segment) ready() bool {
	return s.State == Sealed && !s.flushedOut() && !s.HandedOut && s.InFlight == 0 && len(s.holds) == 0
}

// Ready hands out the Flushes to append: the sealed segments whose flush
// has not landed, with no insert in flight and no transaction hold, that
// were not handed out yet (or were given back by FlushFailed); one Flush
// per VChannel and reason, in the order of their oldest segment.
func (m *Manager) Ready() []Flush {
	var list []int64
	for id, s := range m.pending {
		if s.ready() {
			list = append(list, id)
		}
	}
	slices.Sort(list)
	var out []Flush
	at := map[flushKey]int{}
	for _, id := range list {
		s := m.pending[id]
		s.HandedOut = true
		k := flushKey{s.VChannel, s.Reason}
		i, ok := at[k]
		if !ok {
			i = len(out)
			at[k] = i
			out = append(out, Flush{VChannel: s.VChannel, CollectionID: s.VChannel.CollectionID(), Reason: s.Reason})
		}
		out[i].Segments = append(out[i].Segments, id)
	}
	return out
}

// flushKey groups the segments of one Flush.
type flushKey struct {
	v streamwal.VChannel
	r Reason
}

// FlushFailed records that the append of f did not land (or may not
// have): its segments are handed out again by Ready.
func (m *Manager) FlushFailed(f Flush) {
	for _, id := range f.Segments {
		if s, ok := m.pending[id]; ok {
			s.HandedOut = false
		}
	}
}

// FlushLanded records that the append of f landed at MessageID at (which
// must be positive): its segments are flushed-out; no insert may follow.
func (m *Manager) FlushLanded(f Flush, at messages.MessageID) error {
	if at == 0 {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "flush of %v on %s landed at message id 0: %w", f.Segments, f.VChannel, ErrMalformed)
	}
	for _, id := range f.Segments {
		if s, ok := m.segs[id]; ok {
			m.flushOut(s, at, f.Reason)
		}
	}
	return nil
}

// Dropped records that the DropCollection of v landed at MessageID at
// (positive): v's segments are sealed (ReasonLifecycle) and flushed-out
// there, without a Flush (which could not be appended after it).
func (m *Manager) Dropped(v streamwal.VChannel, at messages.MessageID) error {
	if at == 0 {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "drop of %s landed at message id 0: %w", v, ErrMalformed)
	}
	m.drop(v, at)
	return nil
}

// drop flushes out every segment of v at at.
func (m *Manager) drop(v streamwal.VChannel, at messages.MessageID) {
	for _, s := range m.segs {
		if s.VChannel == v {
			m.flushOut(s, at, ReasonLifecycle)
		}
	}
}

// MarkFlushed records that segment id's data is in the object store:
// Sealed to Flushed. Its flush-out must have landed ([ErrFlushPending]);
// marking a flushed segment again changes nothing.
func (m *Manager) MarkFlushed(id int64) error {
	s, ok := m.segs[id]
	switch {
	case !ok:
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "mark segment %d flushed: %w", id, ErrUnknownSegment)
	case s.State == Flushed:
		return nil
	case !s.flushedOut():
		return streamwal.Errorf(streamwal.CodeLifecycle, "mark segment %d on %s flushed while %s: %w", id, s.VChannel, s.State, ErrFlushPending)
	}
	s.State = Flushed
	s.HandedOut = false
	return nil
}

// Forget drops a flushed segment from memory, once its metadata is
// persisted; its ID (and every lower one) stays used. Other segments are
// kept.
func (m *Manager) Forget(id int64) {
	s, ok := m.segs[id]
	if !ok || s.State != Flushed {
		return
	}
	delete(m.segs, id)
	m.forgotten = max(m.forgotten, id)
}

// Counts is how many segments are growing, sealed and flushed.
func (m *Manager) Counts() (growing, sealed, flushed int) {
	for _, s := range m.segs {
		switch s.State {
		case Growing:
			growing++
		case Sealed:
			sealed++
		case Flushed:
			flushed++
		}
	}
	return growing, sealed, flushed
}

// ids lists the keys of a segment map in order.
func ids(segs map[int64]*segment) []int64 { return slices.Sorted(maps.Keys(segs)) }
