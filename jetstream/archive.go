package jetstream

import (
	"context"
	"fmt"
	"sync"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// DefaultArchiveObjectBytes is the default size of one archived object.
const DefaultArchiveObjectBytes = 8 << 20

// directGetHeaders are the headers a direct get adds to a stored message.
var directGetHeaders = []string{njs.StreamHeader, njs.SequenceHeader, njs.TimeStampHeaer, njs.SubjectHeader,
	"Nats-Num-Pending", "Nats-Last-Sequence", "Nats-UpTo-Sequence"}

// archiveLock serializes truncations of p in this process.
func (b *JetStream) archiveLock(p streamwal.PChannel) *sync.Mutex {
	b.mu.Lock()
	defer b.mu.Unlock()
	l, ok := b.archiveMu[p]
	if !ok {
		l = &sync.Mutex{}
		b.archiveMu[p] = l
	}
	return l
}

// archiveBelow copies every message the stream stores from the archive's
// end up to below-1 into objects and indexes them; it returns the point
// below which the stream may be purged (0: nothing to purge). It never
// archives past the stream's last message, so that a message appended
// meanwhile is neither archived nor purged.
//
// damaged says that the stream is known to have lost messages (an
// operator accepted the loss): its state may count messages it cannot
// deliver, so the archive takes what the stream delivers and stops when
// nothing more comes, instead of failing.
func (b *JetStream) archiveBelow(ctx context.Context, s njs.Stream, p streamwal.PChannel, below messages.MessageID, damaged bool) (messages.MessageID, error) {
	idx, err := b.loadIndex(ctx, p)
	if err != nil {
		return 0, err
	}
	idx = idx.clone()
	cleaned, err := b.dropOrphans(ctx, idx)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, classify(fmt.Errorf("archive %s: %w", p, err))
	}
	a := &archiver{b: b, p: p, idx: idx, budget: b.opts.ArchiveObjectBytes}
	end := min(below, messages.MessageID(info.State.LastSeq)+1)
	if from := max(idx.end(), 1); end > from {
		a.src = &rawSource{b: b, stream: b.codec.Cluster().StreamName(p), next: uint64(from), end: uint64(end), damaged: damaged}
		err := a.run(ctx, from, end)
		a.src.close()
		if err != nil {
			return 0, err
		}
	} else if cleaned {
		if err := b.saveIndex(ctx, p, idx); err != nil {
			return 0, err
		}
	}
	return min(below, idx.end()), nil
}

// dropOrphans deletes the objects an earlier truncation may have left
// unindexed and forgets them (in idx; the next save records it).
func (b *JetStream) dropOrphans(ctx context.Context, idx *archiveIndex) (bool, error) {
	if len(idx.Orphans) == 0 {
		return false, nil
	}
	for _, name := range idx.Orphans {
		if idx.indexed(name) {
			continue
		}
		if err := b.deleteObject(ctx, name); err != nil {
			return false, err
		}
	}
	idx.Orphans = nil
	return true, nil
}

// archiver writes the archived objects of one truncation.
type archiver struct {
	b      *JetStream
	p      streamwal.PChannel
	idx    *archiveIndex
	src    *rawSource
	budget int
}

// run archives the IDs from..end-1, one object at a time.
func (a *archiver) run(ctx context.Context, from, end messages.MessageID) error {
	for from < end {
		r, data, err := a.fill(ctx, from, end)
		if err != nil {
			return err
		}
		if err := a.commit(ctx, r, data); err != nil {
			return err
		}
		from = r.Last + 1
	}
	return nil
}

// fill frames the stored messages from `from` on, up to the budget, and
// returns the range they cover (up to end-1 when the stream has no more).
func (a *archiver) fill(ctx context.Context, from, end messages.MessageID) (archiveRange, []byte, error) {
	data := appendFrameHeader(make([]byte, 0, min(a.budget, 1<<20)))
	r := archiveRange{First: from, Last: end - 1}
	for {
		m, err := a.src.peek(ctx)
		if err != nil {
			return r, nil, err
		}
		if m == nil {
			break
		}
		if r.Count > 0 && len(data)+len(m.Data)+len(m.Subject)+256 > a.budget {
			r.Last = messages.MessageID(m.Sequence) - 1
			break
		}
		data = appendFrame(data, messages.MessageID(m.Sequence), m.Subject, storedHeader(m), m.Data)
		r.Count++
		a.src.pop()
	}
	r.Bytes = len(data)
	return r, data, nil
}

// storedHeader is a direct get's header without what the get added.
func storedHeader(m *njs.RawStreamMsg) map[string][]string {
	h := make(map[string][]string, len(m.Header))
	for k, v := range m.Header {
		h[k] = v
	}
	for _, k := range directGetHeaders {
		delete(h, k)
	}
	return h
}

// commit stores one range: merged with the smaller ranges before it when
// they fit (so that the index keeps about one range per object's worth of
// messages, however often the stream is truncated), recorded as an orphan
// first so that a crash never leaves an object nobody deletes, then
// indexed in place of the ranges merged, whose objects go last.
func (a *archiver) commit(ctx context.Context, r archiveRange, data []byte) error {
	if r.Count == 0 {
		a.extendEmpty(r)
		return a.b.saveIndex(ctx, a.p, a.idx)
	}
	r, data, keep, err := a.merge(ctx, r, data)
	if err != nil {
		return err
	}
	r.Name = streamwal.ArchiveObjectName(a.p, uint64(r.First), uint64(r.Last))
	r.Checksum, r.Bytes = checksum(data), len(data)
	a.idx.Orphans = append(a.idx.Orphans, r.Name)
	if err := a.b.saveIndex(ctx, a.p, a.idx); err != nil {
		return err
	}
	if _, err := a.b.putObject(ctx, r.Name, data, nil); err != nil {
		return err
	}
	a.idx.Orphans = nil
	for _, t := range a.idx.Ranges[keep:] {
		if t.Name != "" {
			a.idx.Orphans = append(a.idx.Orphans, t.Name)
		}
	}
	a.idx.Ranges = append(a.idx.Ranges[:keep], r)
	if err := a.b.saveIndex(ctx, a.p, a.idx); err != nil {
		return err
	}
	_, err = a.b.dropOrphans(ctx, a.idx)
	return err
}

// extendEmpty records a range without messages: the last range grows over
// it, or it is the first range.
func (a *archiver) extendEmpty(r archiveRange) {
	if n := len(a.idx.Ranges); n > 0 {
		a.idx.Ranges[n-1].Last = r.Last
		return
	}
	r.Bytes = 0
	a.idx.Ranges = append(a.idx.Ranges, r)
}

// merge prepends the last indexed ranges to r while each is no larger than
// what r holds and the whole fits in the budget; it returns how many
// ranges stay in front of the merged one.
func (a *archiver) merge(ctx context.Context, r archiveRange, data []byte) (archiveRange, []byte, int, error) {
	keep := len(a.idx.Ranges)
	for ; keep > 0; keep-- {
		t := a.idx.Ranges[keep-1]
		if t.Bytes > r.Bytes || t.Bytes+r.Bytes-frameHeaderLen > a.budget {
			break
		}
		old, err := a.b.rangeObject(ctx, t)
		if err != nil {
			return r, nil, 0, err
		}
		data = append(old[:len(old):len(old)], data[frameHeaderLen:]...)
		r.First, r.Count, r.Bytes = t.First, r.Count+t.Count, len(data)
	}
	return r, data, keep, nil
}

// rangeObject reads and verifies the object of r (a frame header alone
// for a range without messages).
func (b *JetStream) rangeObject(ctx context.Context, r archiveRange) ([]byte, error) {
	if r.Count == 0 {
		return appendFrameHeader(nil), nil
	}
	data, info, err := b.getObject(ctx, r.Name)
	if err != nil {
		return nil, err
	}
	if err := verify("archived range "+r.Name, data, info, r.Checksum); err != nil {
		return nil, err
	}
	return data, nil
}

// rawSource reads the messages a stream stores from next up to end
// (exclusive), as they are stored, through an ordered consumer: a direct
// batch get costs a round trip and a reply per message, several times the
// consumer's cost on a long range.
type rawSource struct {
	b      *JetStream
	stream string
	next   uint64
	end    uint64
	msgs   njs.MessagesContext
	left   uint64 // messages the stream holds from next on
	head   *njs.RawStreamMsg
	done   bool
	// damaged: when the stream delivers nothing for rawWait, the range
	// ends there (see archiveBelow) instead of failing.
	damaged bool
}

// rawWait bounds the wait for the next stored message of the range (the
// consumer said how many there are to come).
const rawWait = 30 * time.Second

// damagedWait is that wait on a damaged stream, whose count may include
// messages it lost.
const damagedWait = 3 * time.Second

// peek returns the next stored message, nil after the last.
func (s *rawSource) peek(ctx context.Context) (*njs.RawStreamMsg, error) {
	if s.head != nil || s.done {
		return s.head, nil
	}
	if s.next >= s.end {
		s.done = true
		return nil, nil
	}
	if s.msgs == nil {
		if err := s.open(ctx); err != nil {
			return nil, err
		}
	}
	if s.left == 0 {
		s.done = true
		return nil, nil
	}
	patience := rawWait
	if s.damaged {
		patience = damagedWait
	}
	wait, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	m, err := s.msgs.Next(njs.NextContext(wait))
	if err != nil && s.damaged && ctx.Err() == nil {
		s.done = true
		return nil, nil
	}
	if err != nil {
		return nil, classify(fmt.Errorf("archive %s from %d: %w", s.stream, s.next, err))
	}
	seq, err := streamSequence(m)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeInternal, "archive %s from %d: message without metadata: %v", s.stream, s.next, err)
	}
	if seq >= s.end {
		s.done = true
		return nil, nil
	}
	s.next, s.left = seq+1, s.left-1
	s.head = &njs.RawStreamMsg{Subject: m.Subject(), Sequence: seq, Header: m.Headers(), Data: m.Data()}
	return s.head, nil
}

// open starts the consumer at next.
func (s *rawSource) open(ctx context.Context) error {
	cons, err := s.b.js.OrderedConsumer(ctx, s.stream, njs.OrderedConsumerConfig{
		DeliverPolicy: njs.DeliverByStartSequencePolicy, OptStartSeq: s.next})
	if err != nil {
		return classify(fmt.Errorf("archive %s from %d: %w", s.stream, s.next, err))
	}
	if s.msgs, err = cons.Messages(); err != nil {
		return classify(fmt.Errorf("archive %s from %d: %w", s.stream, s.next, err))
	}
	s.left = cons.CachedInfo().NumPending
	return nil
}

// pop drops the message peek returned.
func (s *rawSource) pop() { s.head = nil }

// close stops the consumer.
func (s *rawSource) close() {
	if s.msgs != nil {
		s.msgs.Stop()
	}
}

// Advance makes the next message stored in p's stream get the ID next, for
// an operator who accepts the loss of history: with Options.Archive it
// first archives everything the stream holds (as Truncate does), then it
// purges the whole stream, barriers included, and moves its sequence to
// next-1. next must lie above the stream's last message (and the archive's
// end): IDs are never reused. Call it only while no writer is open on p;
// the next writer must open under a term above every earlier one, since
// the stream no longer holds their barriers.
func (b *JetStream) Advance(ctx context.Context, p streamwal.PChannel, next messages.MessageID) error {
	if err := b.checkOpen(p); err != nil {
		return err
	}
	s, err := b.stream(ctx, p)
	if err != nil {
		return err
	}
	l := b.archiveLock(p)
	l.Lock()
	defer l.Unlock()
	info, err := s.Info(ctx)
	if err != nil {
		return classify(fmt.Errorf("advance %s: %w", p, err))
	}
	last := messages.MessageID(info.State.LastSeq)
	if next <= last {
		return invalidArg("advance %s to %d: the stream holds messages up to %d", p, next, last)
	}
	if b.opts.Archive {
		if err := b.archiveAll(ctx, s, p, next); err != nil {
			return err
		}
	}
	if err := s.Purge(ctx, njs.WithPurgeSequence(uint64(next))); err != nil {
		return classify(fmt.Errorf("advance %s to %d: %w", p, next, err))
	}
	return nil
}

// archiveAll archives everything s holds before Advance purges it to next.
func (b *JetStream) archiveAll(ctx context.Context, s njs.Stream, p streamwal.PChannel, next messages.MessageID) error {
	idx, err := b.loadIndex(ctx, p)
	if err != nil {
		return err
	}
	if idx.end() > next {
		return invalidArg("advance %s to %d: the archive holds messages up to %d", p, next, idx.end()-1)
	}
	_, err = b.archiveBelow(ctx, s, p, next, true)
	return err
}
