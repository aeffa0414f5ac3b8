package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/messages"
)

// archiveFixture is a backend with Archive on, one writer on p, and the
// IDs it appended.
type archiveFixture struct {
	t   *testing.T
	ctx context.Context
	b   *JetStream
	p   streamwal.PChannel
	v   streamwal.VChannel
	w   Writer
	ids []messages.MessageID
}

// newArchiveFixture starts a server and opens p with budget bytes per
// archived object.
func newArchiveFixture(t *testing.T, budget int) *archiveFixture {
	t.Helper()
	srv := embedded.StartTest(t)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	codec, err := messages.NewCodec("archint", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(nc, codec, Options{Archive: true, ArchiveObjectBytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	p, _ := streamwal.NewPChannel("archint", 0)
	v, _ := p.VChannel(1, 0)
	w, err := b.OpenWriter(ctx, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return &archiveFixture{t: t, ctx: ctx, b: b, p: p, v: v, w: w, ids: []messages.MessageID{w.Barrier().ID()}}
}

// add appends n inserts of size bytes.
func (f *archiveFixture) add(n, size int) {
	f.t.Helper()
	for range n {
		payload := fmt.Sprintf("%d:%s", len(f.ids), strings.Repeat("x", size))
		m, err := f.b.codec.New(messages.TypeInsert, f.v, []byte(payload))
		if err != nil {
			f.t.Fatal(err)
		}
		ids, err := f.w.Append(f.ctx, m)
		if err != nil {
			f.t.Fatal(err)
		}
		f.ids = append(f.ids, ids...)
	}
}

// last is the last ID appended.
func (f *archiveFixture) last() messages.MessageID { return f.ids[len(f.ids)-1] }

// truncate truncates below id.
func (f *archiveFixture) truncate(below messages.MessageID) {
	f.t.Helper()
	if err := f.b.Truncate(f.ctx, f.p, below); err != nil {
		f.t.Fatalf("truncate below %d: %v", below, err)
	}
}

// index reads the index afresh, not from the cache.
func (f *archiveFixture) index() *archiveIndex {
	f.t.Helper()
	f.b.mu.Lock()
	delete(f.b.indexes, f.p)
	f.b.mu.Unlock()
	idx, err := f.b.loadIndex(f.ctx, f.p)
	if err != nil {
		f.t.Fatal(err)
	}
	return idx
}

// objects lists the archive's objects in the store, index excluded.
func (f *archiveFixture) objects() []string {
	f.t.Helper()
	obs, err := f.b.objects(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	infos, err := obs.List(f.ctx)
	if err != nil && !errors.Is(err, njs.ErrNoObjectsFound) {
		f.t.Fatal(err)
	}
	var names []string
	for _, info := range infos {
		if strings.HasPrefix(info.Name, streamwal.ArchivePrefix(f.p)) && info.Name != streamwal.ArchiveIndexName(f.p) {
			names = append(names, info.Name)
		}
	}
	slices.Sort(names)
	return names
}

// checkObjects checks that the store holds exactly the indexed objects.
func (f *archiveFixture) checkObjects(what string) {
	f.t.Helper()
	idx := f.index()
	var want []string
	for _, r := range idx.Ranges {
		if r.Name != "" {
			want = append(want, r.Name)
		}
	}
	slices.Sort(want)
	if got := f.objects(); !slices.Equal(got, want) {
		f.t.Errorf("%s: objects %v, the index names %v (orphans %v)", what, got, want, idx.Orphans)
	}
}

// readAll reads from start through the last ID and checks it got ids.
func (f *archiveFixture) readAll(what string, start StartPosition, want []messages.MessageID) {
	f.t.Helper()
	sc, err := f.b.Read(f.ctx, f.p, ReadOptions{Start: start})
	if err != nil {
		f.t.Fatal(err)
	}
	defer func() { _ = sc.Close() }()
	var got []messages.MessageID
	for len(got) < len(want) {
		m, err := sc.Next(f.ctx)
		if err != nil {
			f.t.Fatalf("%s: after %v: %v", what, got, err)
		}
		got = append(got, m.ID())
	}
	if !slices.Equal(got, want) {
		f.t.Errorf("%s: read %v, want %v", what, got, want)
	}
}

// TestArchiveIndexedNotPurged: a crash after the index was written and
// before the purge leaves messages both archived and in the stream; reads
// deliver them once, and the next truncation purges them without
// archiving again.
func TestArchiveIndexedNotPurged(t *testing.T) {
	f := newArchiveFixture(t, 4096)
	f.add(30, 10)
	s, err := f.b.stream(f.ctx, f.p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.archiveBelow(f.ctx, s, f.p, 20, false); err != nil {
		t.Fatal(err)
	}
	before := f.index()
	f.readAll("earliest, archived but not purged", Earliest(), f.ids)
	f.readAll("from 10", From(10), f.ids[9:])
	st, err := f.b.State(f.ctx, f.p)
	if err != nil || st.ArchivedBelow != 20 || st.First != 20 || st.Messages != uint64(f.last()-19) {
		t.Errorf("state %+v, %v", st, err)
	}
	f.truncate(20)
	if after := f.index(); !slices.Equal(after.Ranges, before.Ranges) {
		t.Errorf("a retried truncation changed the ranges: %v, then %v", before.Ranges, after.Ranges)
	}
	info, err := s.Info(f.ctx)
	if err != nil || info.State.FirstSeq != 1 || info.State.Msgs != uint64(f.last()-19)+1 {
		t.Errorf("stream after the retried truncation: %+v, %v (want the barrier at 1 and 20..%d)", info.State, err, f.last())
	}
	f.truncate(20) // and again: nothing to do
	f.readAll("earliest after the retries", Earliest(), f.ids)
	f.checkObjects("after the retries")
}

// TestArchiveOrphans: an object written by a truncation that crashed
// before indexing it is deleted (or overwritten) by the next.
func TestArchiveOrphans(t *testing.T) {
	f := newArchiveFixture(t, 4096)
	f.add(30, 10)
	f.truncate(10)
	idx := f.index().clone()
	// What a crash after the object's put leaves: the name among the
	// orphans, the object stored, the range not indexed.
	for _, name := range []string{streamwal.ArchiveObjectName(f.p, 10, 24), streamwal.ArchiveObjectName(f.p, 10, 19)} {
		idx.Orphans = append(idx.Orphans, name)
		if _, err := f.b.putObject(f.ctx, name, []byte("partial"), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.b.saveIndex(f.ctx, f.p, idx); err != nil {
		t.Fatal(err)
	}
	f.truncate(20)
	if got := f.index(); len(got.Orphans) != 0 || got.end() != 20 {
		t.Errorf("index after the retry: %+v", got)
	}
	f.checkObjects("after the retry")
	f.readAll("earliest after the retry", Earliest(), f.ids)
}

// TestArchiveMerges: many small truncations keep few ranges (each
// merging the smaller ones before it), no object is left behind, and
// everything stays readable.
func TestArchiveMerges(t *testing.T) {
	f := newArchiveFixture(t, 8192)
	for range 40 {
		f.add(1+len(f.ids)%3, 40)
		f.truncate(f.last())
	}
	idx := f.index()
	if len(idx.Ranges) > 8 {
		t.Errorf("%d ranges after 40 truncations of a few messages", len(idx.Ranges))
	}
	for _, r := range idx.Ranges {
		if r.Bytes > 8192 {
			t.Errorf("range %d..%d of %d bytes", r.First, r.Last, r.Bytes)
		}
	}
	f.checkObjects("after the merges")
	f.readAll("earliest after the merges", Earliest(), f.ids)
}

// TestArchiveReadAcrossMerge: a scanner whose index names objects that a
// truncation then merges away finds them in the new index.
func TestArchiveReadAcrossMerge(t *testing.T) {
	f := newArchiveFixture(t, 1<<20)
	// Truncations of ever smaller messages merge nothing; a larger one
	// then merges them all.
	for _, size := range []int{4000, 2000, 1000, 500} {
		f.add(1, size)
		f.truncate(f.last() + 1)
	}
	if n := len(f.index().Ranges); n != 4 {
		t.Fatalf("%d ranges, want 4", n)
	}
	sc, err := f.b.Read(f.ctx, f.p, ReadOptions{Start: Earliest()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sc.Close() }()
	first, err := sc.Next(f.ctx)
	if err != nil || first.ID() != 1 {
		t.Fatalf("first: %v %v", first, err)
	}
	f.add(20, 500)
	f.truncate(f.last() + 1)
	if n := len(f.index().Ranges); n != 1 {
		t.Fatalf("%d ranges after the merging truncation, want 1", n)
	}
	f.checkObjects("after the merge")
	got := []messages.MessageID{first.ID()}
	for len(got) < len(f.ids) {
		m, err := sc.Next(f.ctx)
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, m.ID())
	}
	if !slices.Equal(got, f.ids) {
		t.Errorf("read %v, want %v", got, f.ids)
	}
}

// TestArchiveCorruption: an archived object that does not match its
// checksum, or whose framing is broken, stops a read with a typed error;
// so does an index that does not parse.
func TestArchiveCorruption(t *testing.T) {
	f := newArchiveFixture(t, 4096)
	f.add(20, 10)
	f.truncate(15)
	r := f.index().Ranges[0]
	readErr := func() error {
		sc, err := f.b.Read(f.ctx, f.p, ReadOptions{Start: Earliest()})
		if err != nil {
			return err
		}
		defer func() { _ = sc.Close() }()
		for {
			if _, err := sc.Next(f.ctx); err != nil {
				return err
			}
		}
	}
	if _, err := f.b.putObject(f.ctx, r.Name, []byte("SWAL\x01other bytes"), nil); err != nil {
		t.Fatal(err)
	}
	if err := readErr(); !errors.Is(err, ErrChecksumMismatch) || !errors.Is(err, streamwal.ErrUnrecoverable) {
		t.Errorf("read of a changed object: %v", err)
	}
	if _, err := f.b.Get(f.ctx, f.p, 2); !errors.Is(err, ErrChecksumMismatch) {
		t.Errorf("get from a changed object: %v", err)
	}
	// Broken framing under a matching checksum.
	bad := []byte("SWAL\x01\x09\x01")
	if _, err := f.b.putObject(f.ctx, r.Name, bad, nil); err != nil {
		t.Fatal(err)
	}
	idx := f.index().clone()
	idx.Ranges[0].Checksum = checksum(bad)
	if err := f.b.saveIndex(f.ctx, f.p, idx); err != nil {
		t.Fatal(err)
	}
	var fe *FrameError
	if err := readErr(); !errors.As(err, &fe) || !errors.Is(err, ErrFrameTruncated) || !errors.Is(err, streamwal.ErrUnrecoverable) {
		t.Errorf("read of a broken object: %v", err)
	}
	if _, err := f.b.putObject(f.ctx, streamwal.ArchiveIndexName(f.p), []byte("{not json"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.Read(f.ctx, f.p, ReadOptions{Start: Earliest()}); !errors.Is(err, streamwal.ErrUnrecoverable) {
		t.Errorf("read with a broken index: %v", err)
	}
}

// TestArchiveIndexCheck: an index whose ranges do not follow each other
// from 1 is refused.
func TestArchiveIndexCheck(t *testing.T) {
	p, _ := streamwal.NewPChannel("x", 0)
	ok := &archiveIndex{Version: archiveIndexVersion, PChannel: p.String(), Ranges: []archiveRange{
		{First: 1, Last: 9, Name: "a", Count: 3}, {First: 10, Last: 10}, {First: 11, Last: 20, Name: "b", Count: 1}}}
	if err := ok.check(p); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []archiveIndex{
		{Version: 2, PChannel: p.String()},
		{Version: archiveIndexVersion, PChannel: "other-0"},
		{Version: archiveIndexVersion, PChannel: p.String(), Ranges: []archiveRange{{First: 2, Last: 3, Name: "a", Count: 1}}},
		{Version: archiveIndexVersion, PChannel: p.String(), Ranges: []archiveRange{{First: 1, Last: 3, Name: "a", Count: 1}, {First: 5, Last: 6, Name: "b", Count: 1}}},
		{Version: archiveIndexVersion, PChannel: p.String(), Ranges: []archiveRange{{First: 1, Last: 0}}},
		{Version: archiveIndexVersion, PChannel: p.String(), Ranges: []archiveRange{{First: 1, Last: 3, Count: 2}}},
	} {
		if err := bad.check(p); err == nil {
			t.Errorf("index %+v accepted", bad)
		}
	}
}
