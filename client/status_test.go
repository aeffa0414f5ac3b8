package client_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
)

// storageSystem starts a cluster whose node persists a round at every
// consumed message, seals segments at 3 rows and truncates at once what
// is flushed and checkpointed.
func storageSystem(t *testing.T) *system.System {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := system.Start(ctx, system.Options{ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		// A short duplicate window: truncation never passes it.
		Node: node.Config{SyncInterval: syncInterval, Backend: jetstream.Options{DuplicateWindow: time.Second}, Recovery: node.RecoveryOptions{
			Cadence: recovery.Cadence{Interval: 20 * time.Millisecond, Dirty: 1},
			Shard:   shard.Config{MaxRows: 3}, Retain: node.RetainNothing, TruncateInterval: 50 * time.Millisecond}}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	_, err = s.WaitServing(ctx, false)
	require.NoError(t, err)
	return s
}

// channelStatus waits until the status of p satisfies ok and returns it.
func channelStatus(t *testing.T, c *client.Client, p streamwal.PChannel, ok func(client.ChannelStatus) bool) client.ChannelStatus {
	t.Helper()
	var got client.ChannelStatus
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var st client.Status
		if st, err = c.Status(testCtx(t)); err != nil {
			continue
		}
		if got = find(st, p); ok(got) {
			return got
		}
	}
	t.Fatalf("status of %s never got there; last: %s (%v)", p, jsonOf(got), err)
	return got
}

// jsonOf is v in JSON.
func jsonOf(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}

// find is p's status in st (zero if st has none).
func find(st client.Status, p streamwal.PChannel) client.ChannelStatus {
	for _, ch := range st.Channels {
		if ch.PChannel == p.String() {
			return ch
		}
	}
	return client.ChannelStatus{}
}

// A node without recovery storage persists nothing: status shows no
// checkpoint and no segments (null in JSON), not zeros, and the stream's
// first message.
func TestStatusWithoutRecoveryStorage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := system.Start(ctx, system.Options{ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		// A short duplicate window: truncation never passes it.
		Node: node.Config{SyncInterval: syncInterval, Backend: jetstream.Options{DuplicateWindow: time.Second}, Recovery: node.RecoveryOptions{Off: true}}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	_, err = s.WaitServing(ctx, false)
	require.NoError(t, err)
	c := newClient(t, s)

	st, err := c.Status(testCtx(t))
	require.NoError(t, err)
	require.NotEmpty(t, st.Channels)
	for _, ch := range st.Channels {
		require.Nil(t, ch.Checkpoint, ch.PChannel)
		require.Nil(t, ch.Segments, ch.PChannel)
		require.Empty(t, ch.Error, ch.PChannel)
		require.Empty(t, ch.StorageError, ch.PChannel)
		require.Equal(t, messages.MessageID(1), ch.FirstID, "%s: its barrier is its first message", ch.PChannel)
	}
	data, err := json.Marshal(st.Channels[0])
	require.NoError(t, err)
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(data, &raw))
	require.JSONEq(t, "null", string(raw["checkpoint"]))
	require.JSONEq(t, "null", string(raw["segments"]))
	require.JSONEq(t, "1", string(raw["first_message_id"]))
	require.NotContains(t, raw, "error")
}

// Status reports what the owner persisted, as it persisted it: the
// checkpoint (equal to the stored value), its age, the segments by state,
// and the first message the stream keeps once truncation cut below it.
// Segments lists the VChannel's segments: flushed ones from the object
// store, the others from the metadata.
func TestStatusShowsRecoveryStorage(t *testing.T) {
	s := storageSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	col, v := createCollection(t, ctx, c)
	p := v.PChannel()
	var last client.AppendResult
	for i := range 7 {
		// One row each, said explicitly (see the report: the replayed
		// count takes a missing row count as 0, the live count as 1).
		r, err := c.Append(ctx, insert(t, c, v, string(rune('a'+i)), messages.WithDML(0, 1)))
		require.NoError(t, err)
		last = r[0]
	}
	// 7 inserts at 3 rows a segment: two sealed (and flushed), one growing.
	ch := channelStatus(t, c, p, func(ch client.ChannelStatus) bool {
		return ch.Checkpoint != nil && ch.Checkpoint.Consumed >= last.ID && ch.Segments != nil &&
			ch.Segments.Flushed == 2 && ch.Segments.Growing == 1 && ch.FirstID > 1
	})
	require.Equal(t, client.SegmentCounts{Growing: 1, Sealed: 0, Flushed: 2}, *ch.Segments)
	require.Empty(t, ch.StorageError)
	require.True(t, ch.Serving)

	// The checkpoint is the stored one (once rounds settle).
	var got *client.CheckpointStatus
	require.Eventually(t, func() bool {
		stored := storedCheckpoint(s, p)
		st, err := c.Status(ctx)
		if err != nil {
			return false
		}
		got = find(st, p).Checkpoint
		return got != nil && got.Written.Equal(stored.Written) && got.MessageID == stored.MessageID &&
			got.TimeTick == stored.TimeTick && got.Consumed == stored.Consumed && got.Term == stored.Term
	}, 20*time.Second, 10*time.Millisecond)
	require.GreaterOrEqual(t, got.Age, 0.0)
	require.Less(t, got.Age, 60.0)
	require.LessOrEqual(t, got.MessageID, got.Consumed+1)
	require.NotZero(t, got.TimeTick)

	// FirstID is the stream's own word.
	be, err := jetstream.New(s.Conn(), s.Codec, jetstream.Options{Archive: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = be.Close() })
	state, err := be.State(ctx, p)
	require.NoError(t, err)
	st := channelStatus(t, c, p, func(client.ChannelStatus) bool { return true })
	if st.FirstID != state.First { // truncated in between: only ever up
		require.Greater(t, st.FirstID, state.First)
	}

	segs, err := c.Segments(ctx, v)
	require.NoError(t, err)
	require.Len(t, segs, 3, "%+v", segs)
	var rows uint64
	for i, sg := range segs {
		require.Equal(t, v.String(), sg.VChannel)
		if i > 0 {
			require.Less(t, segs[i-1].ID, sg.ID)
		}
		require.NotNil(t, sg.Rows)
		rows += *sg.Rows
		if i < 2 {
			require.Equal(t, "flushed", sg.State)
			require.Equal(t, client.SourceObjectStore, sg.Source)
			require.Equal(t, "rows", sg.Reason)
			require.Equal(t, 3, sg.Messages)
			require.Equal(t, uint64(3), *sg.Rows, "%+v", sg)
			require.NotZero(t, sg.FirstID)
			require.LessOrEqual(t, sg.FirstID, sg.LastID)
			require.LessOrEqual(t, sg.FirstTimeTick, sg.LastTimeTick)
			continue
		}
		require.Equal(t, "growing", sg.State)
		require.Equal(t, client.SourceMetadata, sg.Source)
	}
	require.Equal(t, uint64(7), rows)

	vs, err := c.CollectionVChannels(ctx, col.ID)
	require.NoError(t, err)
	require.Equal(t, []streamwal.VChannel{v}, vs)
	_, err = c.CollectionVChannels(ctx, 1<<40)
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
}

// storedCheckpoint reads p's checkpoint from the checkpoints bucket (the
// zero value if it cannot).
func storedCheckpoint(s *system.System, p streamwal.PChannel) recovery.Checkpoint {
	var cp recovery.Checkpoint
	js, err := s.Conn().JetStream()
	if err != nil {
		return cp
	}
	kv, err := js.KeyValue(s.Codec.Cluster().BucketName(streamwal.BucketCheckpoints))
	if err != nil {
		return cp
	}
	e, err := kv.Get(streamwal.CheckpointKey(p))
	if err != nil {
		return cp
	}
	_ = json.Unmarshal(e.Value(), &cp)
	return cp
}
