package jetstream_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// segmentMessages builds the immutable messages of a segment of v: inserts
// with DML headers, properties, a trace and a transaction, a replicated
// insert and a broadcast replica, at IDs from first on.
func segmentMessages(t *testing.T, codec *messages.Codec, v streamwal.VChannel, segment int64, first messages.MessageID) []*messages.ImmutableMessage {
	t.Helper()
	var out []*messages.ImmutableMessage
	freeze := func(m *messages.MutableMessage, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		id := first + messages.MessageID(len(out))
		m.SetTimeTick(messages.TimeTick(1000 + uint64(id)))
		m.SetLastConfirmed(id)
		m.SetTerm(3)
		m.SetSegment(segment)
		out = append(out, m.Freeze(id))
	}
	for i := range 3 {
		freeze(codec.New(messages.TypeInsert, v, []byte(fmt.Sprintf("rows %d", i)), messages.WithDML(7, uint64(i+1)),
			messages.WithMsgID(fmt.Sprintf("seg-%d-%d", segment, i)), messages.WithProperty("k", "v"),
			messages.WithTrace("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x=1")))
	}
	freeze(codec.New(messages.TypeInsert, v, []byte("in a txn"), messages.WithDML(7, 1),
		messages.WithTxn(messages.TxnContext{ID: 9, Keepalive: time.Second})))
	src, err := messages.NewCodec("source", nil)
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := streamwal.NewPChannel(v.PChannel().Prefix(), v.PChannel().Index())
	sv, _ := sp.VChannel(v.CollectionID(), v.Shard())
	orig, err := src.New(messages.TypeInsert, sv, []byte("replicated"), messages.WithDML(7, 2))
	if err != nil {
		t.Fatal(err)
	}
	orig.SetTimeTick(55)
	freeze(codec.NewReplicate(orig.Freeze(77), "source", v.PChannel()))
	bc, err := codec.NewBroadcast(messages.TypeImport, messages.Targets{VChannels: []streamwal.VChannel{v}},
		messages.KeyScope{DBName: "db", CollectionName: "c"}, []byte("import"))
	if err != nil {
		t.Fatal(err)
	}
	bc.SetID(42)
	freeze(bc.Split()[0], nil)
	return out
}

// sameMessages compares messages as a reader sees them.
func sameMessages(t *testing.T, what string, got, want []*messages.ImmutableMessage) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d messages, want %d", what, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.ID() != w.ID() || g.Type() != w.Type() || !bytes.Equal(g.Payload(), w.Payload()) || !reflect.DeepEqual(g.Header(), w.Header()) {
			t.Errorf("%s: message %d is\n%+v\nwant\n%+v", what, i, g.Header(), w.Header())
		}
	}
}

func TestSegments(t *testing.T) {
	e := newArchiveEnv(t, jetstream.Options{})
	p := e.pchannel(5)
	v, _ := p.VChannel(11, 0)
	other, _ := p.VChannel(12, 0)
	segs := map[int64][]*messages.ImmutableMessage{
		30: segmentMessages(t, e.codec, v, 30, 100),
		4:  segmentMessages(t, e.codec, v, 4, 10),
	}
	// The object store exists already, as nats.go creates one: with the
	// server's default duplicate window, which the backend shrinks.
	obs, err := njs.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	bucket := e.codec.Cluster().ObjectStoreName(streamwal.ObjectStoreSegments)
	if _, err := obs.CreateObjectStore(e.ctx, njs.ObjectStoreConfig{Bucket: bucket}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{30, 4} {
		m := jetstream.SegmentManifest{VChannel: v.String(), Segment: id, Partition: 7, Reason: "capacity"}
		if err := e.b.WriteSegment(e.ctx, m, jetstream.MessagesOf(segs[id])); err != nil {
			t.Fatalf("write segment %d: %v", id, err)
		}
	}
	if err := e.b.WriteSegment(e.ctx, jetstream.SegmentManifest{VChannel: other.String(), Segment: 1}, jetstream.MessagesOf(nil)); err != nil {
		t.Fatalf("write an empty segment: %v", err)
	}
	list, err := e.b.Segments(e.ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Segment != 4 || list[1].Segment != 30 {
		t.Fatalf("segments of %s: %+v", v, list)
	}
	m := list[1]
	msgs := segs[30]
	if m.VChannel != v.String() || m.FirstID != msgs[0].ID() || m.LastID != msgs[len(msgs)-1].ID() || m.Count != len(msgs) ||
		m.FirstTimeTick != msgs[0].TimeTick() || m.LastTimeTick != msgs[len(msgs)-1].TimeTick() || len(m.Checksum) != 64 ||
		m.Partition != 7 || m.Reason != "capacity" || m.Bytes == 0 {
		t.Errorf("manifest %+v", m)
	}
	got, gotMsgs, err := e.b.ReadSegment(e.ctx, v, 30)
	if err != nil {
		t.Fatal(err)
	}
	if got != m {
		t.Errorf("read manifest %+v, listed %+v", got, m)
	}
	sameMessages(t, "segment 30", gotMsgs, msgs)

	// Object writes carry no message IDs: the stream's duplicate window is
	// the smallest, so that a restarted server does not read back every
	// object written in the last two minutes.
	st, err := obs.Stream(e.ctx, streamwal.ObjectStreamName(bucket))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.Duplicates; got != 100*time.Millisecond {
		t.Errorf("object store's duplicate window %v, want 100ms", got)
	}
	store, err := obs.ObjectStore(e.ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	name := streamwal.SegmentObjectName(v, 30)
	before, err := store.GetInfo(e.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// Writing it again (the same range, as recovery storage gives it)
	// changes nothing.
	again := jetstream.SegmentManifest{VChannel: v.String(), Segment: 30, Partition: 7, Reason: "capacity",
		FirstID: msgs[0].ID(), LastID: msgs[len(msgs)-1].ID()}
	if err := e.b.WriteSegment(e.ctx, again, jetstream.MessagesOf(msgs)); err != nil {
		t.Fatal(err)
	}
	if after, err := store.GetInfo(e.ctx, name); err != nil || after.NUID != before.NUID {
		t.Errorf("writing the same segment again rewrote it (%v)", err)
	}

	// Changed bytes under the same manifest fail the checksum.
	if _, err := store.Put(e.ctx, njs.ObjectMeta{Name: name, Metadata: before.Metadata}, bytes.NewReader([]byte("SWAL\x01"))); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.b.ReadSegment(e.ctx, v, 30); !errors.Is(err, jetstream.ErrChecksumMismatch) || !errors.Is(err, streamwal.ErrUnrecoverable) {
		t.Errorf("read of a changed segment: %v", err)
	}
	if _, _, err := e.b.ReadSegment(e.ctx, v, 31); !errors.Is(err, jetstream.ErrNoSegment) || !errors.Is(err, streamwal.ErrInvalidArgument) {
		t.Errorf("read of a missing segment: %v", err)
	}
	if list, err := e.b.Segments(e.ctx, other); err != nil || len(list) != 1 || list[0].Count != 0 {
		t.Errorf("segments of %s: %+v, %v", other, list, err)
	}
}

func TestWriteSegmentRefuses(t *testing.T) {
	e := newArchiveEnv(t, jetstream.Options{})
	p := e.pchannel(6)
	v, _ := p.VChannel(11, 0)
	other, _ := p.VChannel(12, 0)
	msgs := segmentMessages(t, e.codec, v, 1, 10)
	swapped := slices.Clone(msgs)
	swapped[0], swapped[1] = swapped[1], swapped[0]
	for _, c := range []struct {
		what string
		m    jetstream.SegmentManifest
		msgs []*messages.ImmutableMessage
	}{
		{"a bad vchannel", jetstream.SegmentManifest{VChannel: "nope"}, msgs},
		{"messages of another vchannel", jetstream.SegmentManifest{VChannel: other.String()}, msgs},
		{"messages out of order", jetstream.SegmentManifest{VChannel: v.String()}, swapped},
		{"a nil message", jetstream.SegmentManifest{VChannel: v.String()}, append(slices.Clone(msgs), nil)},
		{"a wrong count", jetstream.SegmentManifest{VChannel: v.String(), Count: 2}, msgs},
		{"a wrong first id", jetstream.SegmentManifest{VChannel: v.String(), FirstID: 3}, msgs},
		{"a wrong last time tick", jetstream.SegmentManifest{VChannel: v.String(), LastTimeTick: 3}, msgs},
	} {
		if err := e.b.WriteSegment(e.ctx, c.m, jetstream.MessagesOf(c.msgs)); !errors.Is(err, streamwal.ErrInvalidArgument) {
			t.Errorf("write a segment with %s: %v", c.what, err)
		}
		if _, _, err := e.b.ReadSegment(e.ctx, v, 0); !errors.Is(err, jetstream.ErrNoSegment) {
			t.Errorf("after the refused write of a segment with %s: %v", c.what, err)
		}
	}
	if list, err := e.b.Segments(e.ctx, v); err != nil || len(list) != 0 {
		t.Errorf("segments after refused writes: %+v, %v", list, err)
	}
}

// TestWriteSegmentStreams: a segment is uploaded as its messages come; a
// read that fails half way stores nothing and leaves the segment stored
// before as it was, and an upload that never got its manifest (a crash
// between the two) is not listed and is replaced by the next write.
func TestWriteSegmentStreams(t *testing.T) {
	e := newArchiveEnv(t, jetstream.Options{})
	p := e.pchannel(7)
	v, _ := p.VChannel(13, 0)
	msgs := segmentMessages(t, e.codec, v, 5, 10)
	m := jetstream.SegmentManifest{VChannel: v.String(), Segment: 5}
	if err := e.b.WriteSegment(e.ctx, m, jetstream.MessagesOf(msgs)); err != nil {
		t.Fatal(err)
	}
	obs, err := njs.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	store, err := obs.ObjectStore(e.ctx, e.codec.Cluster().ObjectStoreName(streamwal.ObjectStoreSegments))
	if err != nil {
		t.Fatal(err)
	}
	// Uploaded in whole chunks, not a chunk per message.
	if info, err := store.GetInfo(e.ctx, streamwal.SegmentObjectName(v, 5)); err != nil || len(msgs) < 2 || info.Chunks != 1 {
		t.Errorf("a small segment of %d messages stored in %+v chunks (%v)", len(msgs), info, err)
	}
	broken := errors.New("stream read failed")
	failing := func(yield func(*messages.ImmutableMessage, error) bool) {
		for _, msg := range msgs[:len(msgs)/2] {
			if !yield(msg, nil) {
				return
			}
		}
		yield(nil, broken)
	}
	if err := e.b.WriteSegment(e.ctx, m, failing); !errors.Is(err, broken) {
		t.Errorf("write of a segment whose read fails: %v", err)
	}
	_, got, err := e.b.ReadSegment(e.ctx, v, 5)
	if err != nil {
		t.Fatal(err)
	}
	sameMessages(t, "segment 5 after a failed rewrite", got, msgs)

	// An object without its manifest: invisible, then replaced.
	name := streamwal.SegmentObjectName(v, 6)
	if _, err := store.Put(e.ctx, njs.ObjectMeta{Name: name}, bytes.NewReader([]byte("SWAL\x01half"))); err != nil {
		t.Fatal(err)
	}
	if list, err := e.b.Segments(e.ctx, v); err != nil || len(list) != 1 || list[0].Segment != 5 {
		t.Errorf("segments with an unfinished upload: %+v, %v", list, err)
	}
	if _, _, err := e.b.ReadSegment(e.ctx, v, 6); !errors.Is(err, jetstream.ErrNoSegment) {
		t.Errorf("read of an unfinished segment: %v", err)
	}
	six := segmentMessages(t, e.codec, v, 6, 100)
	full := jetstream.SegmentManifest{VChannel: v.String(), Segment: 6, FirstID: six[0].ID(), LastID: six[len(six)-1].ID()}
	if err := e.b.WriteSegment(e.ctx, full, jetstream.MessagesOf(six)); err != nil {
		t.Fatal(err)
	}
	if _, got, err = e.b.ReadSegment(e.ctx, v, 6); err != nil {
		t.Fatal(err)
	}
	sameMessages(t, "segment 6", got, six)
}
