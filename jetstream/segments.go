package jetstream

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"iter"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// manifestKey is the object metadata key holding a segment's manifest.
const manifestKey = "manifest"

// SegmentManifest describes one flushed segment and its object.
type SegmentManifest struct {
	// VChannel is the segment's VChannel.
	VChannel string `json:"vchannel"`
	// Segment is the segment's ID.
	Segment int64 `json:"segment"`
	// Partition is the partition the segment belongs to.
	Partition int64 `json:"partition"`
	// FirstID and LastID are the MessageIDs of its first and last
	// messages.
	FirstID messages.MessageID `json:"first_id"`
	LastID  messages.MessageID `json:"last_id"`
	// FirstTimeTick and LastTimeTick are their TimeTicks.
	FirstTimeTick messages.TimeTick `json:"first_time_tick"`
	LastTimeTick  messages.TimeTick `json:"last_time_tick"`
	// Count is the number of messages.
	Count int `json:"count"`
	// Bytes is the caller's byte count of the segment (default: the sum of
	// the messages' payloads).
	Bytes uint64 `json:"bytes"`
	// Checksum is the hex SHA-256 of the object, computed by WriteSegment.
	Checksum string `json:"checksum"`
	// Reason is the seal reason.
	Reason string `json:"reason"`
}

var _ SegmentStore = (*JetStream)(nil)

// Messages is a sequence of messages read one at a time (a read of the
// stream, or a slice through [MessagesOf]); a non-nil error ends it.
type Messages = iter.Seq2[*messages.ImmutableMessage, error]

// MessagesOf yields the messages of a slice.
func MessagesOf(msgs []*messages.ImmutableMessage) Messages {
	return func(yield func(*messages.ImmutableMessage, error) bool) {
		for _, m := range msgs {
			if !yield(m, nil) {
				return
			}
		}
	}
}

// WriteSegment implements SegmentStore: one object (named by
// streamwal.SegmentObjectName) holds the framed messages, its metadata the
// manifest. The messages are framed and uploaded as msgs yields them, so
// that a segment of any size is written in constant memory; the range,
// TimeTicks, count, bytes and checksum are taken from them (a value the
// caller set must agree, or nothing is stored). The manifest is added to
// the object once every message is stored: an object without one is an
// unfinished write, which Segments and ReadSegment do not see and the
// next write replaces. A segment whose range (m.FirstID and m.LastID, as
// recovery storage gives them) is stored already is not written again; a
// write without a range replaces what is stored.
func (b *JetStream) WriteSegment(ctx context.Context, m SegmentManifest, msgs Messages) error {
	v, err := b.segmentVChannel(m.VChannel)
	if err != nil {
		return err
	}
	name := streamwal.SegmentObjectName(v, m.Segment)
	if stored, err := b.segmentStored(ctx, name, m); err != nil || stored {
		return err
	}
	obs, err := b.writableObjects(ctx)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	fr := &segmentFramer{b: b, v: v, m: m, sum: sha256.New()}
	framed := make(chan error, 1)
	go func() {
		err := fr.run(pw, msgs)
		_ = pw.CloseWithError(err)
		framed <- err
	}()
	_, err = obs.Put(ctx, njs.ObjectMeta{Name: name, Opts: &njs.ObjectMetaOptions{ChunkSize: objectChunk}}, pr)
	_ = pr.CloseWithError(errSegmentAbandoned) // unblocks the framer if Put gave up early
	if ferr := <-framed; ferr != nil && !errors.Is(ferr, errSegmentAbandoned) {
		return ferr
	}
	if err != nil {
		return classify(fmt.Errorf("put segment %s: %w", name, err))
	}
	return b.finishSegment(ctx, obs, name, fr.m)
}

// segmentVChannel parses a manifest's VChannel, of a PChannel b serves.
func (b *JetStream) segmentVChannel(name string) (streamwal.VChannel, error) {
	v, err := streamwal.ParseVChannel(name)
	if err != nil {
		return streamwal.VChannel{}, err
	}
	if err := b.checkOpen(v.PChannel()); err != nil {
		return streamwal.VChannel{}, err
	}
	return v, nil
}

// errSegmentAbandoned ends the framing of a segment whose upload failed.
var errSegmentAbandoned = errors.New("segment upload abandoned")

// segmentStored reports whether the object name holds a finished segment
// of m's range (when m gives one).
func (b *JetStream) segmentStored(ctx context.Context, name string, m SegmentManifest) (bool, error) {
	if m.FirstID == 0 || m.LastID == 0 {
		return false, nil
	}
	old, err := b.objectInfo(ctx, name)
	if errors.Is(err, njs.ErrObjectNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	prev, err := manifestOf(old)
	if err != nil {
		return false, nil // unfinished: write it again
	}
	return prev.VChannel == m.VChannel && prev.Segment == m.Segment && prev.FirstID == m.FirstID && prev.LastID == m.LastID, nil
}

// finishSegment adds the manifest m to the uploaded object name.
func (b *JetStream) finishSegment(ctx context.Context, obs njs.ObjectStore, name string, m SegmentManifest) error {
	meta, err := json.Marshal(m)
	if err != nil {
		return streamwal.Errorf(streamwal.CodeInternal, "segment %s/%d: %v", m.VChannel, m.Segment, err)
	}
	if err := obs.UpdateMeta(ctx, name, njs.ObjectMeta{Name: name, Metadata: map[string]string{manifestKey: string(meta)}}); err != nil {
		return classify(fmt.Errorf("manifest of segment %s: %w", name, err))
	}
	return nil
}

// segmentFramer frames a segment's messages into its object as they
// come, checking them against the manifest and completing it.
type segmentFramer struct {
	b     *JetStream
	v     streamwal.VChannel
	m     SegmentManifest
	sum   hash.Hash
	count int
	bytes uint64
	first *messages.ImmutableMessage
	last  *messages.ImmutableMessage
}

// run writes the framed messages to w in writes of a whole object chunk
// (the object store stores what one read of its reader returns as one
// chunk); an error leaves the object unwritten (the upload fails with it).
func (f *segmentFramer) run(w io.Writer, msgs Messages) error {
	chunks := bufio.NewWriterSize(w, objectChunk)
	if err := f.frame(io.MultiWriter(chunks, f.sum), msgs); err != nil {
		return err
	}
	return chunks.Flush()
}

// frame writes the framed messages to out.
func (f *segmentFramer) frame(out io.Writer, msgs Messages) error {
	buf := appendFrameHeader(nil)
	if _, err := out.Write(buf); err != nil {
		return err
	}
	for msg, err := range msgs {
		if err != nil {
			return fmt.Errorf("segment %s/%d: read: %w", f.v, f.m.Segment, err)
		}
		if err := f.check(msg); err != nil {
			return err
		}
		wire, err := f.b.wireOf(msg)
		if err != nil {
			return err
		}
		buf = appendFrame(buf[:0], msg.ID(), wire.Subject, wire.Header, wire.Data)
		if _, err := out.Write(buf); err != nil {
			return err
		}
	}
	return f.complete()
}

// check takes the next message of the segment.
func (f *segmentFramer) check(msg *messages.ImmutableMessage) error {
	switch {
	case msg == nil:
		return invalidArg("segment %s/%d: message %d is nil", f.v, f.m.Segment, f.count)
	case msg.VChannel() != f.v:
		return invalidArg("segment %s/%d: message %d is of %q", f.v, f.m.Segment, msg.ID(), msg.VChannel())
	case f.last != nil && msg.ID() <= f.last.ID():
		return invalidArg("segment %s/%d: message %d after %d", f.v, f.m.Segment, msg.ID(), f.last.ID())
	}
	if f.first == nil {
		f.first = msg
	}
	f.last = msg
	f.count++
	f.bytes += uint64(len(msg.Payload()))
	return nil
}

// complete fills the manifest from the messages framed, once all were.
func (f *segmentFramer) complete() error {
	m := &f.m
	if m.Count != 0 && m.Count != f.count {
		return invalidArg("segment %s/%d: manifest counts %d messages, %d given", f.v, m.Segment, m.Count, f.count)
	}
	m.Count = f.count
	if m.Bytes == 0 {
		m.Bytes = f.bytes
	}
	m.Checksum = hex.EncodeToString(f.sum.Sum(nil))
	if f.count == 0 {
		return nil
	}
	for _, c := range []struct {
		what string
		have *uint64
		from uint64
	}{
		{"first id", (*uint64)(&m.FirstID), uint64(f.first.ID())},
		{"last id", (*uint64)(&m.LastID), uint64(f.last.ID())},
		{"first time tick", (*uint64)(&m.FirstTimeTick), uint64(f.first.TimeTick())},
		{"last time tick", (*uint64)(&m.LastTimeTick), uint64(f.last.TimeTick())},
	} {
		if *c.have != 0 && *c.have != c.from {
			return invalidArg("segment %s/%d: manifest %s %d, the messages say %d", f.v, m.Segment, c.what, *c.have, c.from)
		}
		*c.have = c.from
	}
	return nil
}

// errUnfinishedSegment: a segment object without a manifest, whose
// upload did not finish.
var errUnfinishedSegment = errors.New("no manifest: an unfinished upload")

// manifestOf reads the manifest from an object's metadata.
func manifestOf(info *njs.ObjectInfo) (SegmentManifest, error) {
	var m SegmentManifest
	raw, ok := info.Metadata[manifestKey]
	if !ok {
		return m, fmt.Errorf("segment object %s: %w", info.Name, errUnfinishedSegment)
	}
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return m, streamwal.Errorf(streamwal.CodeUnrecoverable, "segment object %s: manifest: %v", info.Name, err)
	}
	return m, nil
}

// Segments implements SegmentStore. It lists the whole object store.
func (b *JetStream) Segments(ctx context.Context, v streamwal.VChannel) ([]SegmentManifest, error) {
	if _, err := b.segmentVChannel(v.String()); err != nil {
		return nil, err
	}
	obs, err := b.objects(ctx)
	if err != nil {
		return nil, err
	}
	// A list of a store whose stream has no leader yet (just created on a
	// cluster) waits for its end until its deadline: list in attempts.
	var infos []*njs.ObjectInfo
	err = InAttempts(ctx, func(ctx context.Context) (err error) {
		infos, err = obs.List(ctx)
		return err
	})
	if errors.Is(err, njs.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, classify(fmt.Errorf("segments of %s: %w", v, err))
	}
	var out []SegmentManifest
	prefix := streamwal.SegmentPrefix(v)
	for _, info := range infos {
		if !strings.HasPrefix(info.Name, prefix) {
			continue
		}
		m, err := manifestOf(info)
		if errors.Is(err, errUnfinishedSegment) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b SegmentManifest) int { return cmp.Compare(a.Segment, b.Segment) })
	return out, nil
}

// ReadSegment implements SegmentStore: a segment whose object does not
// match its checksum is streamwal.ErrUnrecoverable wrapping
// ErrChecksumMismatch; a missing one streamwal.ErrInvalidArgument wrapping
// ErrNoSegment.
func (b *JetStream) ReadSegment(ctx context.Context, v streamwal.VChannel, id int64) (SegmentManifest, []*messages.ImmutableMessage, error) {
	if _, err := b.segmentVChannel(v.String()); err != nil {
		return SegmentManifest{}, nil, err
	}
	name := streamwal.SegmentObjectName(v, id)
	data, info, err := b.getObject(ctx, name)
	if errors.Is(err, njs.ErrObjectNotFound) {
		return SegmentManifest{}, nil, invalidArg("segment %s/%d: %w", v, id, ErrNoSegment)
	}
	if err != nil {
		return SegmentManifest{}, nil, err
	}
	m, err := manifestOf(info)
	if errors.Is(err, errUnfinishedSegment) {
		return SegmentManifest{}, nil, invalidArg("segment %s/%d: %w (%w)", v, id, ErrNoSegment, err)
	}
	if err != nil {
		return SegmentManifest{}, nil, err
	}
	if err := verify("segment "+name, data, info, m.Checksum); err != nil {
		return m, nil, err
	}
	msgs, err := b.decodeObject(data)
	if err != nil {
		return m, nil, streamwal.Errorf(streamwal.CodeUnrecoverable, "segment %s: %w", name, err)
	}
	if len(msgs) != m.Count {
		return m, nil, streamwal.Errorf(streamwal.CodeUnrecoverable, "segment %s holds %d messages, its manifest %d", name, len(msgs), m.Count)
	}
	return m, msgs, nil
}

// decodeObject decodes every message of a framed object.
func (b *JetStream) decodeObject(data []byte) ([]*messages.ImmutableMessage, error) {
	fr, err := newFrameReader(data)
	if err != nil {
		return nil, err
	}
	var out []*messages.ImmutableMessage
	for {
		f, ok, err := fr.next(nil)
		if err != nil || !ok {
			return out, err
		}
		m, err := b.codec.Decode(&nats.Msg{Subject: f.Subject, Header: f.Header, Data: f.Data}, f.ID)
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", f.ID, err)
		}
		out = append(out, m)
	}
}

// wireOf re-encodes an immutable message as the stream stores it, and
// checks that decoding it gives the message back.
func (b *JetStream) wireOf(m *messages.ImmutableMessage) (*nats.Msg, error) {
	h := m.Header()
	mm, err := b.rebuild(m, h)
	if err != nil {
		return nil, invalidArg("segment message %d cannot be encoded: %w", m.ID(), err)
	}
	msg, err := b.codec.Encode(mm)
	if err != nil {
		return nil, invalidArg("segment message %d cannot be encoded: %w", m.ID(), err)
	}
	encodeRare(msg.Header, h)
	back, err := b.codec.Decode(msg, m.ID())
	if err != nil || back.Type() != m.Type() || !slices.Equal(back.Payload(), m.Payload()) || !sameHeader(back.Header(), h) {
		return nil, invalidArg("segment message %d does not survive re-encoding (%v)", m.ID(), err)
	}
	return msg, nil
}

// rebuild builds the mutable message m was frozen from (but for the
// broadcast and replicate headers, which encodeRare adds).
func (b *JetStream) rebuild(m *messages.ImmutableMessage, h messages.Header) (*messages.MutableMessage, error) {
	var opts []messages.Option
	if h.MsgID != "" {
		opts = append(opts, messages.WithMsgID(h.MsgID))
	}
	if h.TraceParent != "" || h.TraceState != "" {
		opts = append(opts, messages.WithTrace(h.TraceParent, h.TraceState))
	}
	if h.Unreplicable {
		opts = append(opts, messages.WithUnreplicable())
	}
	if h.DML != nil {
		opts = append(opts, messages.WithDML(h.DML.PartitionID, h.DML.Rows))
	}
	if h.Txn != nil {
		opts = append(opts, messages.WithTxn(*h.Txn))
	}
	for _, k := range slices.Sorted(maps.Keys(h.Props)) {
		opts = append(opts, messages.WithProperty(k, h.Props[k]))
	}
	var mm *messages.MutableMessage
	var err error
	if h.VChannel.IsZero() {
		mm, err = b.codec.NewPChannel(m.Type(), h.PChannel, m.Payload(), opts...)
	} else {
		mm, err = b.codec.New(m.Type(), h.VChannel, m.Payload(), opts...)
	}
	if err != nil {
		return nil, err
	}
	mm.SetTimeTick(h.TimeTick)
	mm.SetLastConfirmed(h.LastConfirmed)
	mm.SetTerm(h.Term)
	if h.DML != nil && h.DML.SegmentID != 0 {
		mm.SetSegment(h.DML.SegmentID)
	}
	return mm, nil
}

// encodeRare writes the broadcast and replicate headers, which no option
// of the messages package sets, as the codec writes them.
func encodeRare(hdr nats.Header, h messages.Header) {
	if r := h.Replicate; r != nil {
		hdr.Set(messages.HdrReplicateCluster, string(r.Cluster))
		setNonZero(hdr, messages.HdrReplicateID, uint64(r.MessageID))
		setNonZero(hdr, messages.HdrReplicateTimeTick, uint64(r.TimeTick))
		setNonZero(hdr, messages.HdrReplicateLastConf, uint64(r.LastConfirmed))
	}
	if bc := h.Broadcast; bc != nil {
		hdr.Set(messages.HdrBroadcastID, fmt.Sprint(bc.ID))
		targets := make([]string, 0, len(bc.VChannels)+len(bc.PChannels))
		for _, v := range bc.VChannels {
			targets = append(targets, v.String())
		}
		for _, p := range bc.PChannels {
			targets = append(targets, p.String())
		}
		hdr.Set(messages.HdrBroadcastTargets, strings.Join(targets, ","))
		for _, k := range bc.Keys {
			hdr.Add(messages.HdrBroadcastKey, k.String())
		}
	}
}

func setNonZero(hdr nats.Header, key string, v uint64) {
	if v != 0 {
		hdr.Set(key, fmt.Sprint(v))
	}
}

// sameHeader compares headers, an empty collection equal to none.
func sameHeader(a, b messages.Header) bool {
	return reflect.DeepEqual(normalHeader(a), normalHeader(b))
}

func normalHeader(h messages.Header) messages.Header {
	if len(h.Props) == 0 {
		h.Props = nil
	}
	if bc := h.Broadcast; bc != nil {
		c := *bc
		if len(c.VChannels) == 0 {
			c.VChannels = nil
		}
		if len(c.PChannels) == 0 {
			c.PChannels = nil
		}
		if len(c.Keys) == 0 {
			c.Keys = nil
		}
		h.Broadcast = &c
	}
	return h
}
