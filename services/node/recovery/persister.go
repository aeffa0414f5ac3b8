package recovery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// maxAttempts bounds the compare-and-set attempts of one write: each
// conflict re-reads the key. After a Claim only a newer owner (which
// fences) or an own write of unknown outcome (which the re-read adopts)
// can cause one; during a Claim an older owner still writing can cause a
// few, each of them a write that owner won.
const maxAttempts = 64

// Persister writes the recovery storage of one PChannel for one owner
// term. Use: [Persister.Load], then [Persister.Claim] before landing the
// RecoveryBarrier, then [Persister.Persist] once per round. Its methods
// are safe for concurrent use; they run one at a time. Once fenced (a
// newer term holds one of the keys) every method returns
// streamwal.ErrFenced.
type Persister struct {
	store Store
	p     streamwal.PChannel
	term  uint64
	node  string
	now   func() time.Time

	mu      sync.Mutex
	loaded  bool
	claimed bool
	fenced  error
	// revs, stored and content are per key: the revision and the bytes
	// last read or written, and for metadata keys stored under this term
	// the content part of those bytes (nil when unknown).
	revs    map[string]uint64
	stored  map[string][]byte
	content map[string][]byte
	last    Checkpoint // last written or read
	floor   Checkpoint // highest ever attempted; may have landed
	// view is a copy of last that Last reads without waiting for a round.
	view atomic.Pointer[Checkpoint]
}

// NewPersister returns the persister of PChannel p for the owner of the
// given term, running on node.
func NewPersister(s Store, p streamwal.PChannel, term uint64, node string) *Persister {
	return &Persister{store: s, p: p, term: term, node: node, now: time.Now,
		revs: map[string]uint64{}, stored: map[string][]byte{}, content: map[string][]byte{}}
}

// Keys in the order a round writes them.
func (p *Persister) vchannelsKey() string  { return streamwal.VChannelMetaKey(p.p) }
func (p *Persister) segmentsKey() string   { return streamwal.SegmentMetaKey(p.p) }
func (p *Persister) checkpointKey() string { return streamwal.CheckpointKey(p.p) }

// Last returns the last checkpoint written or loaded (zero before Load
// and on a new PChannel).
func (p *Persister) Last() Checkpoint {
	c := p.view.Load()
	if c == nil {
		return Checkpoint{}
	}
	out := *c
	out.Replication = bytes.Clone(c.Replication)
	return out
}

// setLast records c as the last checkpoint written or read.
func (p *Persister) setLast(c Checkpoint) {
	p.last = c
	p.view.Store(&c)
}

// Load reads the stored snapshot and remembers the keys' revisions. found
// is false when no checkpoint covering a message is stored (a new
// PChannel, or one only claimed so far: replay from the start); metadata
// is returned even then. The checkpoint is read first,
// so the metadata read is never behind it. A key written by a newer term
// is streamwal.ErrFenced; a value that does not decode matches
// [ErrCorrupt] and streamwal.ErrUnrecoverable.
func (p *Persister) Load(ctx context.Context) (s Snapshot, found bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fenced != nil {
		return Snapshot{}, false, p.fenced
	}
	if found, err = p.loadCheckpoint(ctx, &s); err != nil {
		return Snapshot{}, false, err
	}
	if err = p.loadVChannels(ctx, &s); err != nil {
		return Snapshot{}, false, err
	}
	if err = p.loadSegments(ctx, &s); err != nil {
		return Snapshot{}, false, err
	}
	p.loaded = true
	return s, found, nil
}

// loadCheckpoint reads the checkpoint into s.
func (p *Persister) loadCheckpoint(ctx context.Context, s *Snapshot) (bool, error) {
	raw, found, err := p.refresh(ctx, p.checkpointKey())
	if err != nil || !found {
		p.setLast(Checkpoint{})
		return false, err
	}
	c, err := decodeCheckpoint(p.checkpointKey(), raw)
	if err != nil {
		return false, err
	}
	s.Checkpoint = c
	s.Checkpoint.Replication = bytes.Clone(c.Replication)
	return c.Consumed != 0 || c.TimeTick != 0 || c.MessageID != 0, nil
}

// loadVChannels reads the VChannel metadata into s.
func (p *Persister) loadVChannels(ctx context.Context, s *Snapshot) error {
	raw, found, err := p.refresh(ctx, p.vchannelsKey())
	if err != nil || !found {
		return err
	}
	v, err := decodeVChannels(p.vchannelsKey(), raw)
	if err != nil {
		return err
	}
	s.VChannels, s.VChannelsThrough = v.VChannels, v.TimeTick
	return nil
}

// loadSegments reads the segment metadata into s.
func (p *Persister) loadSegments(ctx context.Context, s *Snapshot) error {
	raw, found, err := p.refresh(ctx, p.segmentsKey())
	if err != nil || !found {
		return err
	}
	v, err := decodeSegments(p.segmentsKey(), raw)
	if err != nil {
		return err
	}
	s.Segments, s.SegmentsThrough = v.Segments, v.TimeTick
	return nil
}

// Claim rewrites every key as loaded under this persister's term (creating
// the missing ones empty), compare-and-set on the revisions Load read, so
// that from then on every write of an older owner fails. A key changed
// since Load by an older owner is re-read and claimed as it now is
// (the checkpoint never moves backwards); one changed by a newer owner
// fences. Call it once after Load, before the WAL lands its barrier.
func (p *Persister) Claim(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.ready(); err != nil {
		return err
	}
	return p.claim(ctx)
}

// ready checks that the persister may write.
func (p *Persister) ready() error {
	if p.fenced != nil {
		return p.fenced
	}
	if !p.loaded {
		return streamwal.Errorf(streamwal.CodeInternal, "pchannel %s: recovery storage written before Load", p.p)
	}
	return nil
}

// claim rewrites the three keys in round order.
func (p *Persister) claim(ctx context.Context) error {
	for _, key := range []string{p.vchannelsKey(), p.segmentsKey(), p.checkpointKey()} {
		if err := p.claimKey(ctx, key); err != nil {
			return streamwal.Errorf(streamwal.CodeOf(err), "pchannel %s: claim for term %d: %w", p.p, p.term, err)
		}
	}
	p.claimed = true
	return nil
}

// claimKey rewrites key's stored value under this term, re-reading it
// after a conflict.
func (p *Persister) claimKey(ctx context.Context, key string) error {
	for range maxAttempts {
		w, err := p.reterm(key, p.stored[key])
		if err != nil {
			return err
		}
		done, err := p.attempt(ctx, w)
		if done || err != nil {
			return err
		}
	}
	return p.unsettled(key)
}

// reterm re-encodes a stored value (nil: absent) under this term.
func (p *Persister) reterm(key string, raw []byte) (write, error) {
	switch key {
	case p.checkpointKey():
		var c Checkpoint
		if raw != nil {
			var err error
			if c, err = decodeCheckpoint(key, raw); err != nil {
				return write{}, err
			}
		}
		return p.checkpointWrite(p.stamp(c))
	case p.vchannelsKey():
		v := vchannelsValue{}
		if raw != nil {
			var err error
			if v, err = decodeVChannels(key, raw); err != nil {
				return write{}, err
			}
		}
		return p.vchannelsWrite(v.VChannels, v.TimeTick)
	}
	v := segmentsValue{}
	if raw != nil {
		var err error
		if v, err = decodeSegments(key, raw); err != nil {
			return write{}, err
		}
	}
	return p.segmentsWrite(v.Segments, v.TimeTick)
}

// stamp sets the persister's identity on c.
func (p *Persister) stamp(c Checkpoint) Checkpoint {
	c.Term, c.Node, c.Written = p.term, p.node, p.now().UTC()
	return c
}

// Persist writes a round: the VChannel metadata, then the segment
// metadata, then the checkpoint, each compare-and-set and carrying the
// term; a metadata value whose content equals the stored one is not
// rewritten. The persister sets the checkpoint's Term, Node and Written,
// and keeps Reached and Truncated at their maximum. A persister not yet
// claimed claims first.
//
// A round whose checkpoint has a smaller Consumed or TimeTick than the
// last one loaded, written or attempted is refused with [ErrBackwards]
// (streamwal.ErrInvalidArgument) and writes nothing, as is a round with
// invalid metadata. A conflict re-reads the key: a newer term there
// fences the persister for good (streamwal.ErrFenced from then on); an
// own write whose answer was lost is adopted; an older term is
// overwritten. A failed round may have written some of its metadata, but
// never a checkpoint its metadata does not cover: retry it, or persist a
// later one.
func (p *Persister) Persist(ctx context.Context, s Snapshot) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.ready(); err != nil {
		return err
	}
	if !p.claimed {
		if err := p.claim(ctx); err != nil {
			return err
		}
	}
	writes, cp, err := p.round(s)
	if err != nil {
		return err
	}
	p.floor = cp
	for _, w := range writes {
		if w.content != nil && bytes.Equal(p.content[w.key], w.content) {
			continue
		}
		if err := p.put(ctx, w); err != nil {
			return streamwal.Errorf(streamwal.CodeOf(err), "pchannel %s: persist through %v: %w", p.p, cp.TimeTick, err)
		}
	}
	return nil
}

// round checks s against the last checkpoint and encodes its writes.
func (p *Persister) round(s Snapshot) ([]write, Checkpoint, error) {
	cp := p.stamp(s.Checkpoint)
	cp.Reached = max(cp.Reached, p.last.Reached, p.floor.Reached)
	cp.Truncated = max(cp.Truncated, p.last.Truncated, p.floor.Truncated)
	for _, prev := range []Checkpoint{p.last, p.floor} {
		if cp.behind(prev) {
			return nil, cp, backwards(p.p, cp, prev)
		}
	}
	v, err := p.vchannelsWrite(s.VChannels, cp.TimeTick)
	if err != nil {
		return nil, cp, err
	}
	sg, err := p.segmentsWrite(s.Segments, cp.TimeTick)
	if err != nil {
		return nil, cp, err
	}
	c, err := p.checkpointWrite(cp)
	if err != nil {
		return nil, cp, err
	}
	return []write{v, sg, c}, cp, nil
}

// backwards builds the refusal of cp, which is below prev.
func backwards(p streamwal.PChannel, cp, prev Checkpoint) error {
	return streamwal.Errorf(streamwal.CodeInvalidArgument,
		"pchannel %s: %w: consumed %v timetick %d is below consumed %v timetick %d",
		p, ErrBackwards, cp.Consumed, uint64(cp.TimeTick), prev.Consumed, uint64(prev.TimeTick))
}

// write is one key's value in a round.
type write struct {
	key   string
	value []byte
	// content is the part of a metadata value compared to skip equal
	// rewrites; nil for the checkpoint.
	content []byte
	// cp is the checkpoint of the checkpoint key's write.
	cp *Checkpoint
}

// vchannelsWrite encodes the VChannel metadata value.
func (p *Persister) vchannelsWrite(vs []VChannelMeta, tt messages.TimeTick) (write, error) {
	if vs == nil {
		vs = []VChannelMeta{}
	}
	for _, v := range vs {
		if err := v.check(); err != nil {
			return write{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "pchannel %s: %v", p.p, err)
		}
	}
	content, err := json.Marshal(vs)
	if err != nil {
		return write{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "pchannel %s: encode vchannels: %v", p.p, err)
	}
	value, err := json.Marshal(vchannelsValue{Term: p.term, TimeTick: tt, VChannels: vs})
	if err != nil {
		return write{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "pchannel %s: encode vchannels: %v", p.p, err)
	}
	return write{key: p.vchannelsKey(), value: value, content: content}, nil
}

// segmentsWrite encodes the segment metadata value.
func (p *Persister) segmentsWrite(raw json.RawMessage, tt messages.TimeTick) (write, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("null")
	}
	var content bytes.Buffer
	if err := json.Compact(&content, raw); err != nil {
		return write{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "pchannel %s: segments are not valid JSON: %v", p.p, err)
	}
	value, err := json.Marshal(segmentsValue{Term: p.term, TimeTick: tt, Segments: content.Bytes()})
	if err != nil {
		return write{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "pchannel %s: encode segments: %v", p.p, err)
	}
	return write{key: p.segmentsKey(), value: value, content: content.Bytes()}, nil
}

// checkpointWrite encodes the checkpoint value.
func (p *Persister) checkpointWrite(cp Checkpoint) (write, error) {
	value, err := json.Marshal(cp)
	if err != nil {
		return write{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "pchannel %s: encode checkpoint: %v", p.p, err)
	}
	return write{key: p.checkpointKey(), value: value, cp: &cp}, nil
}

// put writes w, re-reading the key after each conflict.
func (p *Persister) put(ctx context.Context, w write) error {
	for range maxAttempts {
		done, err := p.attempt(ctx, w)
		if done || err != nil {
			return err
		}
		if err := p.checkStored(w); err != nil {
			return err
		}
	}
	return p.unsettled(w.key)
}

// attempt makes one compare-and-set write of w. done is false after a
// conflict, once the key was re-read (and not found to be w itself).
func (p *Persister) attempt(ctx context.Context, w write) (done bool, err error) {
	rev, err := p.store.Put(ctx, w.key, w.value, p.revs[w.key])
	if err == nil {
		p.wrote(w, rev)
		return true, nil
	}
	if !errors.Is(err, ErrConflict) {
		delete(p.content, w.key) // it may or may not have landed
		return false, streamwal.Errorf(unknownCode(err), "write %s: %w", w.key, err)
	}
	if _, _, err := p.refresh(ctx, w.key); err != nil {
		return false, err
	}
	if bytes.Equal(p.stored[w.key], w.value) { // an own write whose answer was lost
		p.wrote(w, p.revs[w.key])
		return true, nil
	}
	return false, nil
}

// unknownCode is the code of a failed write: the storage's own, or
// CodeUnavailable for an error without one.
func unknownCode(err error) streamwal.Code {
	if c := streamwal.CodeOf(err); c != streamwal.CodeInternal {
		return c
	}
	return streamwal.CodeUnavailable
}

// checkStored refuses to overwrite a stored checkpoint that is ahead of
// the one w writes.
func (p *Persister) checkStored(w write) error {
	if w.cp == nil || p.stored[w.key] == nil {
		return nil
	}
	if w.cp.behind(p.last) {
		return backwards(p.p, *w.cp, p.last)
	}
	return nil
}

// wrote records a successful write of w at rev.
func (p *Persister) wrote(w write, rev uint64) {
	p.revs[w.key], p.stored[w.key] = rev, w.value
	if w.content != nil {
		p.content[w.key] = w.content
	}
	if w.cp != nil {
		p.setLast(*w.cp)
	}
}

// unsettled is the error of a key that kept changing under every attempt.
func (p *Persister) unsettled(key string) error {
	return streamwal.Errorf(streamwal.CodeUnavailable, "write %s: still changing after %d attempts", key, maxAttempts)
}

// refresh reads key and remembers its revision and bytes; a value of a
// newer term fences the persister. A read checkpoint becomes Last.
func (p *Persister) refresh(ctx context.Context, key string) (raw []byte, found bool, err error) {
	raw, rev, err := p.store.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		p.revs[key], p.stored[key] = 0, nil
		delete(p.content, key)
		return nil, false, nil
	}
	if err != nil {
		return nil, false, streamwal.Errorf(unknownCode(err), "read %s: %w", key, err)
	}
	term, err := storedTerm(key, raw)
	if err != nil {
		return nil, false, err
	}
	if term > p.term {
		return nil, false, p.fence(key, term)
	}
	p.revs[key], p.stored[key] = rev, raw
	return raw, true, p.learn(key, raw, term)
}

// learn updates what the persister knows of key's stored value.
func (p *Persister) learn(key string, raw []byte, term uint64) error {
	delete(p.content, key)
	switch key {
	case p.checkpointKey():
		c, err := decodeCheckpoint(key, raw)
		if err != nil {
			return err
		}
		p.setLast(c)
	default:
		if term == p.term {
			w, err := p.reterm(key, raw)
			if err != nil {
				return err
			}
			p.content[key] = w.content
		}
	}
	return nil
}

// fence stops the persister for good: key holds a newer term.
func (p *Persister) fence(key string, term uint64) error {
	p.fenced = streamwal.Errorf(streamwal.CodeFenced, "pchannel %s: %s was written under term %d, above this owner's term %d",
		p.p, key, term, p.term)
	return p.fenced
}
