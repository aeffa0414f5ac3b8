package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
)

// newStorageCluster is newCluster whose node persists a round at every
// consumed message, seals segments at 3 rows and truncates at once what
// is flushed and checkpointed.
func newStorageCluster(t *testing.T) *cluster {
	t.Helper()
	return newRecoveryCluster(t, node.RecoveryOptions{Retain: node.RetainNothing, TruncateInterval: 50 * time.Millisecond})
}

// newRecoveryCluster is newCluster whose node persists a round at every
// consumed message and seals segments at 3 rows, with o's truncation.
func newRecoveryCluster(t *testing.T, o node.RecoveryOptions) *cluster {
	t.Helper()
	o.Cadence = recovery.Cadence{Interval: 20 * time.Millisecond, Dirty: 1}
	o.Shard = shard.Config{MaxRows: 3}
	// A short duplicate window: truncation never passes it.
	return newClusterWith(t, node.Config{SyncInterval: testSyncInterval, Recovery: o,
		Backend: jetstream.Options{DuplicateWindow: time.Second}})
}

// statusOf waits until `status --json` shows p as ok wants it and
// returns that.
func (c *cluster) statusOf(t *testing.T, p string, ok func(client.ChannelStatus) bool) client.ChannelStatus {
	t.Helper()
	var last client.ChannelStatus
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var out string
		if out, err = c.run(t, "", "status", "--json"); err != nil {
			continue
		}
		var st client.Status
		require.NoError(t, json.Unmarshal([]byte(out), &st))
		for _, ch := range st.Channels {
			if ch.PChannel == p {
				if last = ch; ok(ch) {
					return ch
				}
			}
		}
	}
	data, _ := json.Marshal(last)
	t.Fatalf("status never showed %s as wanted; last: %s (%v)", p, data, err)
	return last
}

// segmentsOf waits until `segments --json` of v satisfies ok.
func (c *cluster) segmentsOf(t *testing.T, v streamwal.VChannel, ok func([]client.SegmentInfo) bool) []client.SegmentInfo {
	t.Helper()
	var last []client.SegmentInfo
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var res struct {
			VChannel string               `json:"vchannel"`
			Segments []client.SegmentInfo `json:"segments"`
		}
		out := c.mustRun(t, "", "segments", "--vchannel", v.String(), "--json")
		require.NoError(t, json.Unmarshal([]byte(out), &res), out)
		require.Equal(t, v.String(), res.VChannel)
		require.NotNil(t, res.Segments, "an empty list is [], not null: %s", out)
		if last = res.Segments; ok(last) {
			return last
		}
	}
	data, _ := json.Marshal(last)
	t.Fatalf("segments of %s never as wanted; last: %s", v, data)
	return last
}

// insertRows appends n one-row inserts to v through the command.
func (c *cluster) insertRows(t *testing.T, v streamwal.VChannel, n int) []messages.MessageID {
	t.Helper()
	cl := c.client(t)
	var ids []messages.MessageID
	for i := range n {
		m, err := cl.Codec().New(messages.TypeInsert, v, []byte(fmt.Sprint("row-", i)), messages.WithDML(0, 1))
		require.NoError(t, err)
		res, err := cl.Append(context.Background(), m)
		require.NoError(t, err)
		ids = append(ids, res[0].ID)
	}
	return ids
}

// status --json carries, per PChannel, the first message its stream
// keeps, its owner's checkpoint with its age, and its segments by state;
// the table has FIRST and CKPT AGE columns.
func TestStatusShowsCheckpointFirstMessageAndSegments(t *testing.T) {
	c := newStorageCluster(t)
	vs := c.createCollection(t, "shop", "orders", 1, 1)
	v := vs[0]
	ids := c.insertRows(t, v, 4) // one segment sealed at 3 rows, one growing
	ch := c.statusOf(t, v.PChannel().String(), func(ch client.ChannelStatus) bool {
		return ch.Checkpoint != nil && ch.Checkpoint.Consumed >= ids[3] && ch.Segments != nil &&
			*ch.Segments == client.SegmentCounts{Growing: 1, Flushed: 1} && ch.FirstID > ids[0]
	})
	require.LessOrEqual(t, ch.FirstID, ids[3], "the growing segment's insert is kept")
	require.GreaterOrEqual(t, ch.Checkpoint.Age, 0.0)
	require.False(t, ch.Checkpoint.Written.IsZero())
	require.NotZero(t, ch.Checkpoint.TimeTick)
	require.Empty(t, ch.Error)

	out := c.mustRun(t, "", "status", "--json")
	var raw struct {
		Channels []map[string]json.RawMessage `json:"channels"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	for _, ch := range raw.Channels {
		for _, key := range []string{"first_message_id", "checkpoint", "segments"} {
			require.Contains(t, ch, key)
		}
		var cp map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(ch["checkpoint"], &cp))
		if cp != nil {
			for _, key := range []string{"message_id", "timetick", "consumed", "age", "written"} {
				require.Contains(t, cp, key)
			}
		}
	}

	out = c.mustRun(t, "", "status")
	rows := tableRow.FindAllStringSubmatch(out, -1)
	require.Len(t, rows, testPChannels, out)
	row := regexp.MustCompile(`(?m)^\| ` + v.PChannel().String() + ` .*$`).FindString(out)
	m := tableRow.FindStringSubmatch(row)
	require.NotNil(t, m, row)
	require.NotEqual(t, "1", m[7], "FIRST moved with truncation")
	require.Regexp(t, `^\d+s$`, m[10], "CKPT AGE")
	require.NotContains(t, out, "error:")
}

// collection flush appends a ManualFlush to every VChannel of the
// collection; its owners seal and flush the growing segments, which
// segments then lists as flushed with the reason "manual".
func TestCollectionFlushSealsEveryVChannel(t *testing.T) {
	c := newRecoveryCluster(t, node.RecoveryOptions{NoTruncation: true}) // tail reads the stream only
	vs := c.createCollection(t, "shop", "orders", 7, 2)
	for _, v := range vs {
		c.insertRows(t, v, 1)
		c.segmentsOf(t, v, func(s []client.SegmentInfo) bool { return len(s) == 1 && s[0].State == "growing" })
	}

	out := c.mustRun(t, "", "collection", "flush", "--id", "7")
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.Len(t, lines, 2, out)
	for i, v := range vs {
		require.Regexp(t, `^flush of collection 7 on `+regexp.QuoteMeta(v.String())+` appended at \d+ \(\S+\)$`, lines[i])
	}
	for _, v := range vs {
		segs := c.segmentsOf(t, v, func(s []client.SegmentInfo) bool { return len(s) == 1 && s[0].State == "flushed" })
		require.Equal(t, "manual", segs[0].Reason)
		require.Equal(t, client.SourceObjectStore, segs[0].Source)
		require.Equal(t, 1, segs[0].Messages)
	}
	// Each VChannel holds the ManualFlush the command appended.
	for _, v := range vs {
		tail := c.mustRun(t, "", "tail", "--vchannel", v.String(), "--from-start", "--limit", "20", "--timeout", "3s")
		require.Contains(t, tail, " ManualFlush "+v.String()+` "{\"collection_id\":7}"`)
	}

	out = c.mustRun(t, "", "collection", "flush", "--id", "7", "--json")
	for i, l := range jsonLines[map[string]any](t, out) {
		require.Equal(t, 7.0, l["flushed"])
		require.Equal(t, vs[i].String(), l["vchannel"])
		require.NotZero(t, l["id"])
	}

	_, err := c.run(t, "", "collection", "flush", "--id", "99")
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
	require.Contains(t, err.Error(), "not found")
	_, err = c.run(t, "", "collection", "flush")
	require.ErrorContains(t, err, "--id")
	c.mustRun(t, "", "collection", "drop", "--db", "shop", "--name", "orders", "--id", "7")
	_, err = c.run(t, "", "collection", "flush", "--id", "7")
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
	require.Contains(t, err.Error(), "dropped")
}

// segments prints a table of a VChannel's segments: flushed ones from the
// object store, growing ones from the metadata.
func TestSegmentsListsAVChannelsSegments(t *testing.T) {
	c := newStorageCluster(t)
	vs := c.createCollection(t, "shop", "orders", 3, 1)
	v := vs[0]
	require.Equal(t, v.String()+" has no segments\n", c.mustRun(t, "", "segments", "--vchannel", v.String()))
	c.insertRows(t, v, 7)
	segs := c.segmentsOf(t, v, func(s []client.SegmentInfo) bool {
		return len(s) == 3 && s[0].State == "flushed" && s[1].State == "flushed" && s[2].State == "growing"
	})
	for i, s := range segs {
		require.NotNil(t, s.Rows)
		want := uint64(3)
		if i == 2 {
			want = 1
		}
		require.Equal(t, want, *s.Rows, "segment %d", i)
	}

	out := c.mustRun(t, "", "segments", "--vchannel", v.String())
	require.Regexp(t, `\| +ID \| PARTITION \| STATE +\| ROWS \| BYTES \| MESSAGEIDS +\| TIMETICKS +\| REASON \| SOURCE +\|`, out)
	row := regexp.MustCompile(`(?m)^\| +(\d+) \| +0 \| (\w+) +\| +(\d+) \| +(\d+) \| (\d+)-(\d+) +\| (\S+)\.\.(\S+) +\| (\S+) +\| (\S+) +\|$`)
	rows := row.FindAllStringSubmatch(out, -1)
	require.Len(t, rows, 3, out)
	require.Equal(t, []string{"flushed", "flushed", "growing"}, []string{rows[0][2], rows[1][2], rows[2][2]})
	require.Equal(t, []string{"rows", "rows", "-"}, []string{rows[0][9], rows[1][9], rows[2][9]})
	require.Equal(t, []string{"object_store", "object_store", "metadata"}, []string{rows[0][10], rows[1][10], rows[2][10]})

	_, err := c.run(t, "", "segments")
	require.ErrorContains(t, err, "--vchannel")
	_, err = c.run(t, "", "segments", "--vchannel", "pchan-99_1v0")
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

// A PChannel whose stream lost acknowledged history is refused by its
// node (HISTORY_LOST), and status says so; accept-loss records the
// operator's consent, and the owner then continues the PChannel above
// every MessageID handed out.
func TestAcceptLossServesAPChannelThatLostHistory(t *testing.T) {
	c := newStorageCluster(t)
	vs := c.createCollection(t, "shop", "orders", 5, 1)
	v := vs[0]
	p := v.PChannel().String()
	ids := c.insertRows(t, v, 2)
	c.statusOf(t, p, func(ch client.ChannelStatus) bool {
		return ch.Checkpoint != nil && ch.Checkpoint.Consumed >= ids[1]
	})

	// The stream is lost while the node is down.
	nodes := c.sys.Nodes()
	require.Len(t, nodes, 1)
	id := nodes[0].ID()
	c.sys.StopNode(id, false)
	require.NoError(t, c.js.DeleteStream(c.sys.Codec.Cluster().StreamName(v.PChannel())))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.sys.StartNode(ctx, id)
	require.NoError(t, err)

	ch := c.statusOf(t, p, func(ch client.ChannelStatus) bool { return strings.Contains(ch.Error, "HISTORY_LOST") })
	require.False(t, ch.Serving)
	out := c.mustRun(t, "", "status")
	require.Regexp(t, `(?m)^error: +`+p+`: HISTORY_LOST: .*accept-loss.*$`, out)
	require.Regexp(t, fmt.Sprintf(`(?m)^serving: +%d of %d PChannels; NOT SERVING \(appends to them wait\): `, testPChannels-1, testPChannels)+p+`$`, out)

	out = c.mustRun(t, "", "pchannel", "accept-loss", p, "--by", "ops@test")
	require.Contains(t, out, "recorded the consent of ops@test to serve "+p)
	require.Contains(t, out, "the owner will continue the PChannel above the highest MessageID ever handed out at its next open; messages lost stay lost")
	require.NotContains(t, out, "note:")

	ch = c.statusOf(t, p, func(ch client.ChannelStatus) bool { return ch.Serving })
	require.Empty(t, ch.Error)
	require.NotContains(t, c.mustRun(t, "", "status"), "error:")
	after := c.insertRows(t, v, 1)
	require.Greater(t, after[0], ids[1], "no MessageID is handed out twice")
}

// accept-loss refuses a malformed PChannel name and one the cluster does
// not have, and tells when the PChannel is not refused for lost history.
func TestAcceptLossRefusesBadPChannels(t *testing.T) {
	c := newStorageCluster(t)
	for _, bad := range []string{"pchan", "pchan-x", "pchan-1_1v0", "pchan-01", ""} {
		_, err := c.run(t, "", "pchannel", "accept-loss", bad)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "%q", bad)
		require.ErrorContains(t, err, fmt.Sprintf("pchannel %q", bad))
	}
	_, err := c.run(t, "", "pchannel", "accept-loss", "pchan-99")
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.ErrorContains(t, err, "has no pchannel pchan-99")
	_, err = c.run(t, "", "pchannel", "accept-loss")
	require.ErrorContains(t, err, "accepts 1 arg")

	out := c.mustRun(t, "", "pchannel", "accept-loss", "pchan-3", "--json")
	var res struct {
		PChannel    string              `json:"pchannel"`
		Accepted    recovery.AcceptLoss `json:"accepted"`
		OpenError   string              `json:"open_error"`
		Consequence string              `json:"consequence"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, "pchan-3", res.PChannel)
	require.Empty(t, res.OpenError)
	require.NotEmpty(t, res.Accepted.By)
	require.WithinDuration(t, time.Now(), res.Accepted.At, time.Minute)
	require.Contains(t, res.Consequence, "messages lost stay lost")
	out = c.mustRun(t, "", "pchannel", "accept-loss", "pchan-3")
	require.Contains(t, out, "note: pchan-3 is not refused with HISTORY_LOST now")
}

// Every new command explains itself.
func TestStorageCommandsHaveHelp(t *testing.T) {
	for _, args := range [][]string{
		{"collection", "flush", "--help"},
		{"segments", "--help"},
		{"pchannel", "accept-loss", "--help"},
	} {
		out, err := runCmd(t, "", args...)
		require.NoError(t, err, args)
		require.Contains(t, out, "Usage:", args)
		require.Contains(t, out, "--json", args)
	}
	out, err := runCmd(t, "", "pchannel", "accept-loss", "--help")
	require.NoError(t, err)
	require.Contains(t, out, "messages lost stay lost")
	require.Contains(t, out, "HISTORY_LOST")
}
