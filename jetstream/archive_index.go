package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// archiveIndexVersion is the version of the index format.
const archiveIndexVersion = 1

// archiveIndex is the index object of a PChannel's archive (JSON under
// streamwal.ArchiveIndexName): the ranges of MessageIDs archived, in
// order and contiguous from 1, so that the archive holds every message the
// stream stored below its end and the stream holds the rest.
type archiveIndex struct {
	Version  int            `json:"version"`
	PChannel string         `json:"pchannel"`
	Ranges   []archiveRange `json:"ranges"`
	// Orphans are objects that may be stored without being indexed: one
	// being written when the index was saved, or ranges merged into a
	// larger one. The next truncation deletes them.
	Orphans []string `json:"orphans,omitempty"`
}

// archiveRange is one archived object: every message the stream stored
// with an ID in First..Last (a range covers IDs, not counts: IDs the
// stream no longer held when it was archived are simply absent).
type archiveRange struct {
	First messages.MessageID `json:"first"`
	Last  messages.MessageID `json:"last"`
	// Name is the object (empty when the range holds no message).
	Name  string `json:"name,omitempty"`
	Count int    `json:"count"`
	// Bytes is the object's size.
	Bytes int `json:"bytes"`
	// Checksum is the hex SHA-256 of the object.
	Checksum string `json:"checksum,omitempty"`
}

// end is the archive's end: every stored message below it is archived (0
// when nothing is).
func (x *archiveIndex) end() messages.MessageID {
	if len(x.Ranges) == 0 {
		return 0
	}
	return x.Ranges[len(x.Ranges)-1].Last + 1
}

// find returns the index of the range holding id (len(Ranges) if none).
func (x *archiveIndex) find(id messages.MessageID) int {
	return sort.Search(len(x.Ranges), func(i int) bool { return x.Ranges[i].Last >= id })
}

// indexed reports whether name is the object of a range.
func (x *archiveIndex) indexed(name string) bool {
	return slices.ContainsFunc(x.Ranges, func(r archiveRange) bool { return r.Name == name })
}

// clone returns a copy Truncate may change.
func (x *archiveIndex) clone() *archiveIndex {
	c := *x
	c.Ranges, c.Orphans = slices.Clone(x.Ranges), slices.Clone(x.Orphans)
	return &c
}

// check validates a decoded index.
func (x *archiveIndex) check(p streamwal.PChannel) error {
	if x.Version != archiveIndexVersion || x.PChannel != p.String() {
		return fmt.Errorf("index of version %d for %q", x.Version, x.PChannel)
	}
	next := messages.MessageID(1)
	for _, r := range x.Ranges {
		switch {
		case r.First != next || r.Last < r.First:
			return fmt.Errorf("range %d..%d after the archive's end %d", r.First, r.Last, next)
		case r.Count < 0 || (r.Count > 0) != (r.Name != ""):
			return fmt.Errorf("range %d..%d: %d messages in object %q", r.First, r.Last, r.Count, r.Name)
		}
		next = r.Last + 1
	}
	return nil
}

// cachedIndex is an index as last read, by the NUID of its object.
type cachedIndex struct {
	nuid string
	idx  *archiveIndex
}

// loadIndex reads p's archive index (empty if there is none). The result
// is shared: clone it to change it.
func (b *JetStream) loadIndex(ctx context.Context, p streamwal.PChannel) (*archiveIndex, error) {
	name := streamwal.ArchiveIndexName(p)
	info, err := b.objectInfo(ctx, name)
	if errors.Is(err, njs.ErrObjectNotFound) {
		return &archiveIndex{Version: archiveIndexVersion, PChannel: p.String()}, nil
	}
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	c, ok := b.indexes[p]
	b.mu.Unlock()
	if ok && c.nuid == info.NUID {
		return c.idx, nil
	}
	data, info, err := b.getObject(ctx, name)
	if errors.Is(err, njs.ErrObjectNotFound) {
		return &archiveIndex{Version: archiveIndexVersion, PChannel: p.String()}, nil
	}
	if err != nil {
		return nil, err
	}
	idx := &archiveIndex{}
	if err := json.Unmarshal(data, idx); err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnrecoverable, "archive index of %s: %v", p, err)
	}
	if err := idx.check(p); err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnrecoverable, "archive index of %s: %v", p, err)
	}
	b.cacheIndex(p, info.NUID, idx)
	return idx, nil
}

// saveIndex writes p's archive index.
func (b *JetStream) saveIndex(ctx context.Context, p streamwal.PChannel, idx *archiveIndex) error {
	data, err := json.Marshal(idx)
	if err != nil {
		return streamwal.Errorf(streamwal.CodeInternal, "archive index of %s: %v", p, err)
	}
	info, err := b.putObject(ctx, streamwal.ArchiveIndexName(p), data, nil)
	if err != nil {
		return err
	}
	b.cacheIndex(p, info.NUID, idx.clone())
	return nil
}

// cacheIndex remembers idx as the index object nuid holds.
func (b *JetStream) cacheIndex(p streamwal.PChannel, nuid string, idx *archiveIndex) {
	b.mu.Lock()
	b.indexes[p] = cachedIndex{nuid: nuid, idx: idx}
	b.mu.Unlock()
}
