package jetstream

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// startID is the first MessageID a start position delivers (Latest has
// none).
func startID(s StartPosition) messages.MessageID {
	switch s.Kind {
	case StartFrom:
		return s.ID
	case StartAfter:
		return s.ID + 1
	}
	return 1
}

// readArchived returns a scanner that reads the archive first when
// opts.Start is below the archive's end; ok is false when the stream alone
// serves the read.
func (b *JetStream) readArchived(ctx context.Context, p streamwal.PChannel, opts ReadOptions) (Scanner, bool, error) {
	idx, err := b.loadIndex(ctx, p)
	if err != nil {
		return nil, false, err
	}
	from := startID(opts.Start)
	if idx.end() == 0 || from >= idx.end() {
		return nil, false, nil
	}
	return newTieredScanner(ctx, b, p, opts, idx, from), true, nil
}

// tieredScanner delivers the archived messages from a start position up to
// the archive's end, then the stream's from there on. A fetcher goroutine
// reads the next archived object while the caller decodes the current one.
//
// A truncation may move the archive's end past the point the stream's
// consumer has reached (the hand-off point, or a later one: its consumer
// pulls ahead of the reader): the stream would then deliver what follows
// the purge and skip what the truncation moved to the archive. So the
// stream part of such a read is read whole, filtered here as the archive
// is, and whenever the stream delivers a message above the one the read
// expects next, the scanner reads the archive's index again; if its end
// moved past that point, it goes back to the archive from there. (A
// filtered consumer could not tell a purge from the subjects it skips.)
type tieredScanner struct {
	b      *JetStream
	p      streamwal.PChannel
	opts   ReadOptions
	match  *subjectMatcher
	chunks chan archiveChunk
	stop   chan struct{}
	fctx   context.Context
	cancel context.CancelFunc

	// Owned by Next.
	cur     *frameReader
	skip    messages.MessageID
	handoff messages.MessageID
	expect  messages.MessageID // the next message the stream must deliver; 0: no check
	err     error

	mu      sync.Mutex
	closed  bool
	stream  *scanner
	fetched chan struct{} // closed when the current fetcher stopped
}

// archiveChunk is one archived object to deliver from `from` on, the
// archive's end (handoff) or the error that stopped the fetcher.
type archiveChunk struct {
	data    []byte
	from    messages.MessageID
	handoff messages.MessageID
	stream  *scanner
	err     error
}

// newTieredScanner starts the fetcher on idx from `from`.
func newTieredScanner(ctx context.Context, b *JetStream, p streamwal.PChannel, opts ReadOptions, idx *archiveIndex, from messages.MessageID) *tieredScanner {
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &tieredScanner{
		b: b, p: p, opts: opts, match: newSubjectMatcher(opts.Filters),
		chunks: make(chan archiveChunk), stop: make(chan struct{}), fetched: make(chan struct{}), fctx: fctx, cancel: cancel,
	}
	go s.fetch(fctx, idx, from, s.fetched)
	return s
}

// fetch sends the archived objects from want on, in order, then the
// archive's end. An object merged into a larger one since the index was
// read is found again in a newer index; the archive's end is read again
// once reached, since a truncation may have moved it meanwhile.
func (s *tieredScanner) fetch(ctx context.Context, idx *archiveIndex, want messages.MessageID, fetched chan struct{}) {
	defer close(fetched)
	for {
		var err error
		if want, err = s.fetchRanges(ctx, idx, want); err != nil {
			s.send(ctx, archiveChunk{err: err})
			return
		}
		err = retry(ctx, func() (err error) {
			idx, err = s.b.loadIndex(ctx, s.p)
			return err
		})
		if err != nil {
			s.send(ctx, archiveChunk{err: err})
			return
		}
		if idx.end() <= want {
			s.handOff(ctx, want)
			return
		}
	}
}

// handOff sends the archive's end with a scanner of the stream from there,
// opened while Next still decodes the last archived object (Next opens it
// itself if that failed).
func (s *tieredScanner) handOff(ctx context.Context, end messages.MessageID) {
	st, err := newScanner(ctx, s.b, s.p, s.streamOptions(end))
	if err != nil {
		st = nil
	}
	if !s.send(ctx, archiveChunk{handoff: end, stream: st}) && st != nil {
		_ = st.Close()
	}
}

// fetchRanges sends the objects of idx from want on and returns the end.
func (s *tieredScanner) fetchRanges(ctx context.Context, idx *archiveIndex, want messages.MessageID) (messages.MessageID, error) {
	for i := idx.find(want); i < len(idx.Ranges); i++ {
		r := idx.Ranges[i]
		var data []byte
		err := retry(ctx, func() (err error) {
			data, err = s.b.rangeObject(ctx, r)
			return err
		})
		if errors.Is(err, njs.ErrObjectNotFound) {
			err = retry(ctx, func() (err error) {
				idx, err = s.b.reindex(ctx, s.p, r)
				return err
			})
			if err != nil {
				return 0, err
			}
			i = idx.find(want) - 1
			continue
		}
		if err != nil {
			return 0, err
		}
		if r.Count > 0 && !s.send(ctx, archiveChunk{data: data, from: want}) {
			return 0, ctx.Err()
		}
		want = r.Last + 1
	}
	return want, nil
}

// Backoff of the fetcher's retries.
const (
	retryFirst = 20 * time.Millisecond
	retryMax   = time.Second
)

// retry calls fn until it succeeds, fails for good or ctx ends: a server
// restarting or a connection reconnecting does not stop a read of the
// archive, as it does not stop an ordered consumer.
func retry(ctx context.Context, fn func() error) error {
	delay := retryFirst
	for {
		err := fn()
		// A deadline of ctx's own means a request timed out.
		timedOut := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
		if err == nil || !streamwal.IsRetriable(err) && !timedOut {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		delay = min(2*delay, retryMax)
	}
}

// reindex reads p's index again after the object of r was not found: a
// truncation merged it into another. The object is lost if the new index
// still names it.
func (b *JetStream) reindex(ctx context.Context, p streamwal.PChannel, r archiveRange) (*archiveIndex, error) {
	idx, err := b.loadIndex(ctx, p)
	if err != nil {
		return nil, err
	}
	if idx.indexed(r.Name) {
		return nil, streamwal.Errorf(streamwal.CodeUnrecoverable, "archived range %d..%d of %s: object %s is missing",
			r.First, r.Last, p, r.Name)
	}
	return idx, nil
}

// send hands c to Next unless the scanner stops first.
func (s *tieredScanner) send(ctx context.Context, c archiveChunk) bool {
	select {
	case s.chunks <- c:
		return true
	case <-ctx.Done():
		return false
	}
}

// Start implements Scanner.
func (s *tieredScanner) Start() StartPosition { return s.opts.Start }

// Next implements Scanner.
func (s *tieredScanner) Next(ctx context.Context) (*messages.ImmutableMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for {
		st, err := s.streamScanner()
		switch {
		case err != nil:
			return nil, err
		case st != nil:
			m, err := st.Next(ctx)
			if err != nil {
				return nil, err
			}
			if back, err := s.behindArchive(ctx, m); back || err != nil {
				if err == nil {
					err = s.rewind()
				}
				if err != nil {
					return nil, err
				}
				continue
			}
			if s.match.match(s.subjectOf(m)) {
				return m, nil
			}
		case s.err != nil:
			return nil, s.err
		case s.cur != nil:
			if m, err := s.nextArchived(); m != nil || err != nil {
				return m, err
			}
		case s.handoff != 0:
			if err := s.openStream(ctx); err != nil {
				return nil, err
			}
		default:
			if err := s.receive(ctx); err != nil {
				return nil, err
			}
		}
	}
}

// receive waits for the fetcher's next chunk.
func (s *tieredScanner) receive(ctx context.Context) error {
	select {
	case c := <-s.chunks:
		switch {
		case c.err != nil:
			s.err = fmt.Errorf("read %s: archive: %w", s.p, c.err)
		case c.stream != nil:
			s.expect = c.handoff
			return s.setStream(c.stream)
		case c.handoff != 0:
			s.handoff = c.handoff
		default:
			fr, err := newFrameReader(c.data)
			if err != nil {
				s.err = s.corrupt(err)
			}
			s.cur, s.skip = fr, c.from
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return s.closedErr()
	}
}

// nextArchived decodes the next archived message to deliver from the
// current object; nil, nil when the object is done.
func (s *tieredScanner) nextArchived() (*messages.ImmutableMessage, error) {
	f, ok, err := s.cur.next(s.keep)
	if err != nil {
		s.err = s.corrupt(err)
		return nil, s.err
	}
	if !ok {
		s.cur = nil
		return nil, nil
	}
	im, err := s.b.codec.Decode(&nats.Msg{Subject: f.Subject, Header: f.Header, Data: f.Data}, f.ID)
	if err != nil {
		return nil, fmt.Errorf("read %s: archived message %d: %w", s.p, f.ID, err)
	}
	return im, nil
}

// keep selects the frames to deliver.
func (s *tieredScanner) keep(id messages.MessageID, subject string) bool {
	return id >= s.skip && s.match.match(subject)
}

// corrupt is the error of an archived object that does not decode.
func (s *tieredScanner) corrupt(err error) error {
	return streamwal.Errorf(streamwal.CodeUnrecoverable, "read %s: archived object: %w", s.p, err)
}

// streamOptions are the read options of the stream from end on: the
// reader's own, but for the start and the filters (the stream is read
// whole, and filtered by Next, so that a gap in its sequence is a
// truncation).
func (s *tieredScanner) streamOptions(end messages.MessageID) ReadOptions {
	o := s.opts
	o.Start, o.Filters = From(end), nil
	return o
}

// openStream continues on the stream from the archive's end.
func (s *tieredScanner) openStream(ctx context.Context) error {
	st, err := newScanner(ctx, s.b, s.p, s.streamOptions(s.handoff))
	if err != nil {
		return err
	}
	s.expect = s.handoff
	return s.setStream(st)
}

// behindArchive reports whether m, delivered by the stream, comes after
// messages that a truncation moved to the archive since the read handed
// off (or, without filters, since its last message): then the read must
// go back to the archive from s.expect, and m is not delivered now. It
// moves s.expect past m otherwise.
func (s *tieredScanner) behindArchive(ctx context.Context, m *messages.ImmutableMessage) (bool, error) {
	if s.expect != 0 && m.ID() > s.expect {
		var idx *archiveIndex
		err := retry(ctx, func() (err error) {
			idx, err = s.b.loadIndex(ctx, s.p)
			return err
		})
		if err != nil {
			return false, fmt.Errorf("read %s: archive: %w", s.p, err)
		}
		if idx.end() > s.expect {
			return true, nil
		}
	}
	s.expect = m.ID() + 1
	return false, nil
}

// subjectOf is the subject m is stored under.
func (s *tieredScanner) subjectOf(m *messages.ImmutableMessage) string {
	if v := m.VChannel(); !v.IsZero() {
		return s.b.codec.Cluster().VChannelSubject(v, m.Type().Token)
	}
	return s.b.codec.Cluster().PChannelSubject(m.PChannel(), m.Type().Token)
}

// rewind closes the stream's scanner and reads the archive again from
// s.expect, with a new fetcher.
func (s *tieredScanner) rewind() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.closedErr()
	}
	st, from := s.stream, s.expect
	s.stream, s.handoff, s.cur, s.expect = nil, 0, nil, 0
	s.fetched = make(chan struct{})
	go s.fetch(s.fctx, &archiveIndex{}, from, s.fetched)
	s.mu.Unlock()
	return st.Close()
}

// setStream switches to the stream's scanner (closing it if the scanner
// was closed meanwhile).
func (s *tieredScanner) setStream(st *scanner) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = st.Close()
		return s.closedErr()
	}
	s.stream = st
	return nil
}

// streamScanner is the stream's scanner once the archive is done.
func (s *tieredScanner) streamScanner() (*scanner, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.closedErr()
	}
	return s.stream, nil
}

// All implements Scanner.
func (s *tieredScanner) All(ctx context.Context) iter.Seq2[*messages.ImmutableMessage, error] {
	return all(ctx, s.Next)
}

// Close implements Scanner; it is idempotent.
func (s *tieredScanner) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	st, fetched := s.stream, s.fetched
	s.mu.Unlock()
	s.cancel()
	<-fetched
	if st != nil {
		return st.Close()
	}
	return nil
}

func (s *tieredScanner) closedErr() error {
	return streamwal.Errorf(streamwal.CodeClosed, "scanner of %s is closed", s.p)
}

// recentObject is the archived object Get read last.
type recentObject struct {
	mu   sync.Mutex
	name string
	sum  string
	data []byte
}

// archivedGet reads the message stored at id from p's archive.
func (b *JetStream) archivedGet(ctx context.Context, p streamwal.PChannel, id messages.MessageID) (*messages.ImmutableMessage, error) {
	idx, err := b.loadIndex(ctx, p)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		i := idx.find(id)
		if i == len(idx.Ranges) || idx.Ranges[i].Count == 0 {
			return nil, nil
		}
		data, err := b.recentRange(ctx, idx.Ranges[i])
		if errors.Is(err, njs.ErrObjectNotFound) && attempt == 0 {
			if idx, err = b.reindex(ctx, p, idx.Ranges[i]); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return b.findFrame(p, data, id)
	}
}

// recentRange is rangeObject through the one-object cache of Get.
func (b *JetStream) recentRange(ctx context.Context, r archiveRange) ([]byte, error) {
	c := &b.recent
	c.mu.Lock()
	if c.name == r.Name && c.sum == r.Checksum {
		data := c.data
		c.mu.Unlock()
		return data, nil
	}
	c.mu.Unlock()
	data, err := b.rangeObject(ctx, r)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.name, c.sum, c.data = r.Name, r.Checksum, data
	c.mu.Unlock()
	return data, nil
}

// findFrame decodes the message id of an archived object (nil if absent).
func (b *JetStream) findFrame(p streamwal.PChannel, data []byte, id messages.MessageID) (*messages.ImmutableMessage, error) {
	fr, err := newFrameReader(data)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnrecoverable, "get %s/%d: archived object: %w", p, id, err)
	}
	f, ok, err := fr.next(func(fid messages.MessageID, _ string) bool { return fid >= id })
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnrecoverable, "get %s/%d: archived object: %w", p, id, err)
	}
	if !ok || f.ID != id {
		return nil, nil
	}
	return b.codec.Decode(&nats.Msg{Subject: f.Subject, Header: f.Header, Data: f.Data}, id)
}
