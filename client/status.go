package client

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
)

// Status is the cluster as the coordinator, the streams and the recovery
// storage describe it.
type Status struct {
	View     streamwal.View  `json:"view"`
	Channels []ChannelStatus `json:"channels"`
}

// ChannelStatus is one PChannel: its assignment, its stream's head and
// tail, and what its owner last persisted in recovery storage. Serving is
// true only while the owner confirms it serves the PChannel under the
// current term in its current session (see streamwal.Assignment): a PChannel
// that cannot take writes is not serving, whatever its state.
//
// Everything in it was confirmed by a component: the assignment by the
// coordinator, FirstID and LastID by the stream, Checkpoint and Segments
// by the values the owner wrote. What is not known is absent (null), not
// zero.
type ChannelStatus struct {
	PChannel  string                    `json:"pchannel"`
	State     streamwal.AssignmentState `json:"state"`
	Serving   bool                      `json:"serving"`
	Since     time.Time                 `json:"since"`
	Node      string                    `json:"node,omitempty"`
	Term      uint64                    `json:"term"`
	VChannels int                       `json:"vchannels"`
	// FirstID is the first message the stream keeps (everything below it
	// was truncated, and is in the archive when the owner archives); 0
	// while the stream holds none or its state could not be read.
	FirstID messages.MessageID `json:"first_message_id"`
	// LastID and LastTimeTick are those of the stream's last message (0
	// while it holds none).
	LastID       messages.MessageID `json:"last_id"`
	LastTimeTick messages.TimeTick  `json:"last_timetick"`
	// Checkpoint is the owner's last persisted checkpoint; nil before the
	// first one (or without recovery storage).
	Checkpoint *CheckpointStatus `json:"checkpoint"`
	// Segments counts the segments of the owner's last persisted segment
	// metadata by state; nil before it persisted any.
	Segments *SegmentCounts `json:"segments"`
	// Error is why the PChannel is not served: the failure of its last
	// open as the coordinator recorded it (streamwal.Assignment.Error), such as
	// a node's HISTORY_LOST refusal.
	Error string `json:"error,omitempty"`
	// StorageError says why the recovery storage of the PChannel could
	// not be read (unreachable, or a value that does not decode); the
	// Checkpoint or Segments it hides are then nil.
	StorageError string `json:"storage_error,omitempty"`
}

// CheckpointStatus is a PChannel's persisted checkpoint: what its owner
// consumed of its WAL, and where a replay starts.
type CheckpointStatus struct {
	// MessageID is where the next open's replay starts.
	MessageID messages.MessageID `json:"message_id"`
	// TimeTick: every message at or below it was consumed.
	TimeTick messages.TimeTick `json:"timetick"`
	// Consumed is the last message consumed.
	Consumed messages.MessageID `json:"consumed"`
	// Term is the term of the owner that wrote it.
	Term uint64 `json:"term"`
	// Written is when its owner wrote it.
	Written time.Time `json:"written"`
	// Age is the seconds from Written to the Status call, in the
	// client's clock (millisecond precision; 0 if the clocks disagree so
	// that Written lies ahead).
	Age float64 `json:"age"`
}

// AgeDuration is Age as a duration.
func (c *CheckpointStatus) AgeDuration() time.Duration {
	return time.Duration(c.Age * float64(time.Second))
}

// SegmentCounts counts segments by state.
type SegmentCounts struct {
	// Growing segments take inserts.
	Growing int `json:"growing"`
	// Sealed segments take none; their flush is pending.
	Sealed int `json:"sealed"`
	// Flushed segments are in the object store.
	Flushed int `json:"flushed"`
}

// View asks the coordinator for the assignment view.
func (c *Client) View(ctx context.Context) (streamwal.View, error) {
	var v streamwal.View
	err := c.callCoord(ctx, streamwal.CoordStatus, struct{}{}, &v)
	return v, err
}

// CheckPChannel refuses a PChannel the cluster does not have
// (streamwal.ErrInvalidArgument), so that nothing waits for an owner that
// will never come.
func (c *Client) CheckPChannel(ctx context.Context, p streamwal.PChannel) error {
	v, err := c.View(ctx)
	if err != nil {
		return err
	}
	for _, a := range v.Channels {
		if a.PChannel == p.String() {
			return nil
		}
	}
	return streamwal.Errorf(streamwal.CodeInvalidArgument, "cluster %s has no pchannel %s (it has %d)", c.opts.cluster, p, len(v.Channels))
}

// Status asks the coordinator for the assignment view, reads the head
// and tail of every assigned PChannel's stream, and reads every
// PChannel's checkpoint and segment metadata.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	var err error
	if st.View, err = c.View(ctx); err != nil {
		return st, err
	}
	tiers, _, err := c.tiers(ctx)
	if err != nil {
		return st, err
	}
	defer func() { _ = tiers.Close() }()
	store, storeErr := c.recoveryStore(ctx)
	now := time.Now()
	for _, a := range st.View.Channels {
		st.Channels = append(st.Channels, c.channelStatus(ctx, a, tiers, store, storeErr, now))
	}
	return st, nil
}

// channelStatus describes one PChannel; its reads are bounded by the
// client's request timeout, so that one stuck read costs only its own
// fields.
func (c *Client) channelStatus(ctx context.Context, a streamwal.Assignment, tiers *jetstream.JetStream, store recovery.Store, storeErr error, now time.Time) ChannelStatus {
	ch := ChannelStatus{PChannel: a.PChannel, State: a.State, Serving: a.Serving, Since: a.Since, Node: a.Node,
		Term: a.Term, VChannels: a.VChannels, Error: a.Error}
	p, err := streamwal.ParsePChannel(a.PChannel)
	if err != nil {
		return ch
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	if a.Term > 0 {
		ch.LastID, ch.LastTimeTick = c.tail(ctx, p)
		ch.FirstID = first(ctx, tiers, p)
	}
	ch.readStorage(ctx, store, storeErr, p, now)
	return ch
}

// tiers is a backend that sees the archive and the flushed segments, and
// whether the object store that holds them exists (a backend would create
// it on first use, and reading must not); close it when done.
func (c *Client) tiers(ctx context.Context) (*jetstream.JetStream, bool, error) {
	js, err := njs.New(c.nc)
	if err != nil {
		return nil, false, streamwal.Errorf(streamwal.CodeUnavailable, "jetstream: %v", err)
	}
	name := c.opts.cluster.ObjectStoreName(streamwal.ObjectStoreSegments)
	_, err = js.ObjectStore(ctx, name)
	exists := err == nil
	if err != nil && !errors.Is(err, njs.ErrBucketNotFound) {
		return nil, false, streamwal.Errorf(streamwal.CodeUnavailable, "object store %s: %v", name, err)
	}
	be, err := jetstream.New(c.nc, c.codec, jetstream.Options{Archive: exists, Logger: c.opts.logger})
	return be, exists, err
}

// tail reads the last message of p's stream (zeros if none), without a
// consumer: status is polled, and every consumer would stay on the server
// until it timed out.
func (c *Client) tail(ctx context.Context, p streamwal.PChannel) (messages.MessageID, messages.TimeTick) {
	last, err := c.backend.Last(ctx, p)
	if err != nil || last == 0 {
		return 0, 0
	}
	m, err := c.backend.Get(ctx, p, last)
	if err != nil {
		return last, 0
	}
	return last, m.TimeTick()
}

// first is the first message p's stream keeps (0 if none, or unknown).
func first(ctx context.Context, tiers *jetstream.JetStream, p streamwal.PChannel) messages.MessageID {
	s, err := tiers.State(ctx, p)
	if err != nil || s.Messages == 0 {
		return 0
	}
	return s.First
}

// recoveryStore opens the cluster's checkpoints bucket as it is; nil
// (and no error) when it does not exist: no node persisted anything yet.
func (c *Client) recoveryStore(ctx context.Context) (recovery.Store, error) {
	js, err := njs.New(c.nc)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "jetstream: %v", err)
	}
	name := c.opts.cluster.BucketName(streamwal.BucketCheckpoints)
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, njs.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "open bucket %s: %v", name, err)
	}
	return recovery.NewKV(kv), nil
}

// readStorage fills in the checkpoint and the segment counts of p.
func (ch *ChannelStatus) readStorage(ctx context.Context, s recovery.Store, openErr error, p streamwal.PChannel, now time.Time) {
	if openErr != nil {
		ch.StorageError = openErr.Error()
		return
	}
	if s == nil {
		return
	}
	cp, err := readCheckpoint(ctx, s, p)
	if err != nil {
		ch.StorageError = err.Error()
		return
	}
	if cp != nil {
		ch.Checkpoint = checkpointStatus(*cp, now)
	}
	segs, found, err := readSegments(ctx, s, p)
	if err != nil {
		ch.StorageError = err.Error()
		return
	}
	if found {
		ch.Segments = countSegments(segs)
	}
}

// checkpointStatus is cp as of now.
func checkpointStatus(cp recovery.Checkpoint, now time.Time) *CheckpointStatus {
	age := max(now.Sub(cp.Written), 0).Seconds()
	return &CheckpointStatus{MessageID: cp.MessageID, TimeTick: cp.TimeTick, Consumed: cp.Consumed, Term: cp.Term,
		Written: cp.Written, Age: math.Round(age*1000) / 1000}
}

// countSegments counts segs by state.
func countSegments(segs []shard.Segment) *SegmentCounts {
	n := &SegmentCounts{}
	for _, s := range segs {
		switch s.State {
		case shard.Growing:
			n.Growing++
		case shard.Sealed:
			n.Sealed++
		case shard.Flushed:
			n.Flushed++
		}
	}
	return n
}

// readValue reads key; found is false when it is not stored.
func readValue(ctx context.Context, s recovery.Store, key string) (raw []byte, found bool, err error) {
	raw, _, err = s.Get(ctx, key)
	if errors.Is(err, recovery.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, streamwal.Errorf(streamwal.CodeUnavailable, "read %s: %v", key, err)
	}
	return raw, true, nil
}

// readCheckpoint reads p's checkpoint (nil if none is stored).
func readCheckpoint(ctx context.Context, s recovery.Store, p streamwal.PChannel) (*recovery.Checkpoint, error) {
	key := streamwal.CheckpointKey(p)
	raw, found, err := readValue(ctx, s, key)
	if err != nil || !found {
		return nil, err
	}
	var cp recovery.Checkpoint
	if err := json.Unmarshal(raw, &cp); err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnrecoverable, "%s does not decode: %v", key, err)
	}
	return &cp, nil
}

// segmentMeta is the stored value of streamwal.SegmentMetaKey.
type segmentMeta struct {
	Term     uint64          `json:"term"`
	Segments []shard.Segment `json:"segments"`
}

// readSegments reads p's segment metadata; found is false when none is
// stored.
func readSegments(ctx context.Context, s recovery.Store, p streamwal.PChannel) ([]shard.Segment, bool, error) {
	key := streamwal.SegmentMetaKey(p)
	raw, found, err := readValue(ctx, s, key)
	if err != nil || !found {
		return nil, false, err
	}
	var v segmentMeta
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, false, streamwal.Errorf(streamwal.CodeUnrecoverable, "%s does not decode: %v", key, err)
	}
	return v.Segments, true, nil
}

// Where a SegmentInfo was read.
const (
	// SourceMetadata: the owner's persisted segment metadata.
	SourceMetadata = "metadata"
	// SourceObjectStore: the manifest of a flushed segment in the object
	// store.
	SourceObjectStore = "object_store"
)

// SegmentInfo is one segment of a VChannel.
type SegmentInfo struct {
	// ID is the segment's ID (the TimeTick of its CreateSegment).
	ID int64 `json:"id"`
	// VChannel and Partition are where its inserts come from.
	VChannel  string `json:"vchannel"`
	Partition int64  `json:"partition"`
	// State is "growing", "sealed" or "flushed".
	State string `json:"state"`
	// Rows is its row count, nil when unknown: a flushed segment the
	// metadata no longer lists (its manifest counts messages, not rows).
	Rows *uint64 `json:"rows"`
	// Messages is the count of insert messages a flushed segment's
	// manifest holds (0 for the others).
	Messages int `json:"messages,omitempty"`
	// Bytes is the size of its inserts' payloads.
	Bytes uint64 `json:"bytes"`
	// FirstID, LastID, FirstTimeTick and LastTimeTick bound its inserts
	// (zero while it has none).
	FirstID       messages.MessageID `json:"first_id"`
	LastID        messages.MessageID `json:"last_id"`
	FirstTimeTick messages.TimeTick  `json:"first_timetick"`
	LastTimeTick  messages.TimeTick  `json:"last_timetick"`
	// Reason is why it was sealed ("" while growing).
	Reason string `json:"reason,omitempty"`
	// Source is where it was read: SourceObjectStore for a flushed
	// segment whose manifest is stored, SourceMetadata otherwise.
	Source string `json:"source"`
}

// Segments lists v's segments by ID: the growing and sealed ones as its
// PChannel's owner last persisted them, and the flushed ones from their
// manifests in the object store. A segment the metadata says is flushed
// but whose manifest is missing is listed from the metadata.
func (c *Client) Segments(ctx context.Context, v streamwal.VChannel) ([]SegmentInfo, error) {
	if v.IsZero() {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "segments of no vchannel")
	}
	var meta []shard.Segment
	store, err := c.recoveryStore(ctx)
	if err != nil {
		return nil, err
	}
	if store != nil {
		if meta, _, err = readSegments(ctx, store, v.PChannel()); err != nil {
			return nil, err
		}
	}
	tiers, exists, err := c.tiers(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tiers.Close() }()
	var manifests []jetstream.SegmentManifest
	if exists {
		if manifests, err = tiers.Segments(ctx, v); err != nil {
			return nil, err
		}
	}
	return mergeSegments(v, meta, manifests), nil
}

// mergeSegments lists the manifests of v, then the segments of v in meta
// that have none, sorted by ID.
func mergeSegments(v streamwal.VChannel, meta []shard.Segment, manifests []jetstream.SegmentManifest) []SegmentInfo {
	byID := map[int64]shard.Segment{}
	for _, s := range meta {
		if s.VChannel == v {
			byID[s.ID] = s
		}
	}
	var out []SegmentInfo
	for _, m := range manifests {
		info := manifestInfo(m)
		if s, ok := byID[m.Segment]; ok {
			info.Rows = &s.Rows
			delete(byID, m.Segment)
		}
		out = append(out, info)
	}
	for _, s := range byID {
		out = append(out, metaInfo(s))
	}
	slices.SortFunc(out, func(a, b SegmentInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// manifestInfo describes a flushed segment by its manifest.
func manifestInfo(m jetstream.SegmentManifest) SegmentInfo {
	return SegmentInfo{ID: m.Segment, VChannel: m.VChannel, Partition: m.Partition, State: shard.Flushed.String(),
		Messages: m.Count, Bytes: m.Bytes, FirstID: m.FirstID, LastID: m.LastID, FirstTimeTick: m.FirstTimeTick,
		LastTimeTick: m.LastTimeTick, Reason: m.Reason, Source: SourceObjectStore}
}

// metaInfo describes a segment by its metadata.
func metaInfo(s shard.Segment) SegmentInfo {
	rows := s.Rows
	return SegmentInfo{ID: s.ID, VChannel: s.VChannel.String(), Partition: s.Partition, State: s.State.String(),
		Rows: &rows, Bytes: s.Bytes, FirstID: s.First, LastID: s.Last, FirstTimeTick: s.FirstTT, LastTimeTick: s.LastTT,
		Reason: string(s.Reason), Source: SourceMetadata}
}

// CollectionVChannels returns the VChannels the coordinator allocated to
// collection id, allocating nothing. A collection that was dropped or
// never created has none: a streamwal.ErrLifecycle error.
func (c *Client) CollectionVChannels(ctx context.Context, id int64) ([]streamwal.VChannel, error) {
	col := Collection{ID: id}
	vs, dropped, err := c.lookup(ctx, col)
	switch {
	case err != nil:
		return nil, err
	case dropped:
		return nil, streamwal.Errorf(streamwal.CodeLifecycle, "collection %d: %w", id, streamwal.ErrCollectionDropped)
	case len(vs) == 0:
		return nil, notFound(col)
	}
	return vs, nil
}

// LossAccepted is an operator's consent, recorded in recovery storage, to
// serve a PChannel whose stream lost history (see AcceptLoss).
type LossAccepted struct {
	// Above is the MessageID above which the stream is served as it is.
	Above messages.MessageID `json:"above"`
	// By names the operator.
	By string `json:"by,omitempty"`
	// At is when the consent was given.
	At time.Time `json:"at"`
}

// AcceptLoss records an operator's consent (by names the operator) to
// serve p although its stream lost history that its checkpoint says was
// handed out: at its next open the owner continues p above the highest
// MessageID ever handed out, and the lost messages stay lost. The record
// stays until an owner's open uses it. Above is the highest MessageID the
// checkpoint says was handed out (0 without a checkpoint).
func (c *Client) AcceptLoss(ctx context.Context, p streamwal.PChannel, by string) (LossAccepted, error) {
	if err := c.CheckPChannel(ctx, p); err != nil {
		return LossAccepted{}, err
	}
	store, err := c.recoveryStore(ctx)
	if err != nil {
		return LossAccepted{}, err
	}
	if store == nil {
		return LossAccepted{}, streamwal.Errorf(streamwal.CodeInvalidArgument,
			"cluster %s has no recovery storage (no bucket %s): nothing of %s can have been lost", c.opts.cluster,
			c.opts.cluster.BucketName(streamwal.BucketCheckpoints), p)
	}
	cp, err := readCheckpoint(ctx, store, p)
	if err != nil {
		return LossAccepted{}, err
	}
	a := recovery.AcceptLoss{By: by, At: time.Now().UTC()}
	if cp != nil {
		a.Above = max(cp.Reached, cp.Consumed)
	}
	if err := recovery.WriteAcceptLoss(ctx, store, p, a); err != nil {
		return LossAccepted{}, err
	}
	return LossAccepted(a), nil
}
