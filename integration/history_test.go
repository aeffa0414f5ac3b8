package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/wire"
)

// Shape of the history tests.
const (
	hlMessages   = 200 // acknowledged before the damage
	hlPad        = 160 // payload padding, so that a few KiB hold a few dozen messages
	hlCut        = 4 << 10
	hlCollection = 55
)

// hlOptions are those of a one-node cluster on srv that never truncates
// (every acknowledged message stays in the stream's files) and persists
// its checkpoint every 50 ms.
func hlOptions(srv *embedded.Server, cluster streamwal.Cluster) system.Options {
	return system.Options{Cluster: cluster, Server: srv, Nodes: 1, Coord: coord.Config{PChannels: 2},
		Node: node.Config{Recovery: node.RecoveryOptions{NoTruncation: true,
			Cadence: recovery.Cadence{Interval: 50 * time.Millisecond}}}}
}

// hlRun is one history test: a cluster that acknowledged hlMessages
// inserts on v, whose PChannel p's stream files are then damaged while
// everything is down.
type hlRun struct {
	t     *testing.T
	srv   *embedded.Server
	o     system.Options
	c     *client.Client
	v     streamwal.VChannel
	p     streamwal.PChannel
	acked map[messages.MessageID]string // every MessageID ever acknowledged, and its payload's name
	names map[string]messages.MessageID
	top   messages.MessageID // the largest acknowledged
	kept  messages.MessageID // the last acknowledged message the damage left stored
}

// hlStart starts a cluster named cluster (each test names its own, see
// trCluster), appends hlMessages inserts, waits until the checkpoint
// covers them and stops everything, server included.
func hlStart(t *testing.T, cluster streamwal.Cluster) *hlRun {
	srv := embedded.StartTest(t)
	r := &hlRun{t: t, srv: srv, o: hlOptions(srv, cluster), acked: map[messages.MessageID]string{}, names: map[string]messages.MessageID{}}
	s := startOn(t, r.o)
	r.c = reconnectingClient(t, srv, cluster)
	ctx := testContext(t)
	vs, err := r.c.CreateCollection(ctx, client.Collection{DBName: "db", Name: "history", ID: hlCollection})
	require.NoError(t, err)
	r.v, r.p = vs[0], vs[0].PChannel()
	for i := 0; i < hlMessages; i += 4 {
		r.append(ctx, fmt.Sprintf("before-%04d", i), 4)
	}
	// The checkpoint covers every acknowledged message (a graceful close
	// persists a last round anyway).
	r.status(func(ch client.ChannelStatus) bool { return ch.Checkpoint != nil && ch.Checkpoint.Consumed >= r.top })
	stopNodes(s)
	s.Close()
	srv.Shutdown()
	return r
}

// hlPayload is the payload of the insert called name.
func hlPayload(name string) string { return name + " " + strings.Repeat("x", hlPad) }

// hlName is the name of an insert's payload.
func hlName(m *messages.ImmutableMessage) string {
	name, _, _ := strings.Cut(string(m.Payload()), " ")
	return name
}

// append appends n inserts named prefix-0 ... in one call and books them.
func (r *hlRun) append(ctx context.Context, prefix string, n int) {
	r.t.Helper()
	msgs := make([]*messages.MutableMessage, n)
	for i := range msgs {
		msgs[i] = clInsert(r.t, r.c, r.v, hlPayload(fmt.Sprintf("%s-%d", prefix, i)))
	}
	res, err := r.c.Append(ctx, msgs...)
	require.NoError(r.t, err)
	for i, a := range res {
		name := fmt.Sprintf("%s-%d", prefix, i)
		prev, reused := r.acked[a.ID]
		require.False(r.t, reused, "MessageID %d acknowledged for %s was acknowledged before for %s", a.ID, name, prev)
		r.acked[a.ID], r.names[name] = name, a.ID
		r.top = max(r.top, a.ID)
	}
}

// status waits until p's status satisfies ok and returns it.
func (r *hlRun) status(ok func(client.ChannelStatus) bool) client.ChannelStatus {
	r.t.Helper()
	var last client.ChannelStatus
	var lastErr error
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := r.c.Status(ctx)
		cancel()
		if err == nil {
			for _, ch := range st.Channels {
				if ch.PChannel == r.p.String() {
					if last = ch; ok(ch) {
						return ch
					}
				}
			}
		}
		lastErr = err
		if time.Now().After(deadline) {
			data, _ := json.Marshal(last)
			r.t.Fatalf("status of %s: not within 30s (last %s, error %v)", r.p, data, lastErr)
		}
		<-time.After(20 * time.Millisecond) // the polling period
	}
}

// blocks lists the message block files of p's stream, in order, and
// fails unless there is one.
func (r *hlRun) blocks() []string {
	r.t.Helper()
	dir := filepath.Join(r.srv.StoreDir(), "jetstream", "$G", "streams", r.o.Cluster.StreamName(r.p), "msgs")
	entries, err := os.ReadDir(dir)
	require.NoError(r.t, err, "the stream's files are at %s", dir)
	type blk struct {
		n    int
		path string
	}
	var out []blk
	var listing []string
	for _, e := range entries {
		info, err := e.Info()
		require.NoError(r.t, err)
		listing = append(listing, fmt.Sprintf("%s (%d bytes)", e.Name(), info.Size()))
		num, ok := strings.CutSuffix(e.Name(), ".blk")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(num)
		require.NoError(r.t, err, "block file %s", e.Name())
		out = append(out, blk{n, filepath.Join(dir, e.Name())})
	}
	r.t.Logf("%s: %s", dir, strings.Join(listing, ", "))
	require.NotEmpty(r.t, out, "no block file in %s", dir)
	sort.Slice(out, func(i, j int) bool { return out[i].n < out[j].n })
	paths := make([]string, len(out))
	for i, b := range out {
		paths[i] = b.path
	}
	return paths
}

// restart starts the server and the cluster again on the damaged files;
// it does not wait for p to be served.
func (r *hlRun) restart() *system.System {
	r.t.Helper()
	require.NoError(r.t, r.srv.Restart())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := system.Start(ctx, r.o)
	require.NoError(r.t, err)
	r.t.Cleanup(s.Close)
	r.t.Cleanup(func() { stopNodes(s) })
	return s
}

// assignment is p's assignment in the current view.
func (r *hlRun) assignment(s *system.System, what string, ok func(wire.Assignment) bool) wire.Assignment {
	r.t.Helper()
	v := viewWhen(r.t, s, what, func(v wire.View) bool {
		for _, a := range v.Channels {
			if a.PChannel == r.p.String() {
				return ok(a)
			}
		}
		return false
	})
	for _, a := range v.Channels {
		if a.PChannel == r.p.String() {
			return a
		}
	}
	return wire.Assignment{}
}

// requireRefused checks that p is refused with HISTORY_LOST and takes no
// append, while the cluster's other PChannels are served, and that the
// stream stays as the damage left it.
func (r *hlRun) requireRefused(s *system.System) {
	t := r.t
	t.Helper()
	ctx := testContext(t)
	a := r.assignment(s, "the open of "+r.p.String()+" refused with HISTORY_LOST", func(a wire.Assignment) bool {
		return strings.Contains(a.Error, string(streamwal.CodeHistoryLost))
	})
	require.False(t, a.Serving, "%s is refused, not served", r.p)
	t.Logf("assignment of %s: %s", r.p, a.Error)
	ch := r.status(func(ch client.ChannelStatus) bool { return ch.Error != "" })
	require.Contains(t, ch.Error, string(streamwal.CodeHistoryLost), "status shows why %s is not served", r.p)
	require.False(t, ch.Serving)
	viewWhen(t, s, "the other PChannels served", func(v wire.View) bool {
		for _, b := range v.Channels {
			if b.PChannel != r.p.String() && !b.Serving {
				return false
			}
		}
		return true
	})

	be := tiersOf(t, r.srv, r.c.Codec())
	st, err := be.State(ctx, r.p)
	require.NoError(t, err)
	// What the damage left: the last acknowledged message still stored.
	for id := r.top; id > 0 && r.kept == 0; id-- {
		if _, ok := r.acked[id]; !ok {
			continue
		}
		if _, err := be.Get(ctx, r.p, id); err == nil {
			r.kept = id
		} else {
			require.ErrorIs(t, err, jetstream.ErrNotStored, "get %d", id)
		}
	}
	t.Logf("%s's stream state after the damage: first %d, last %d, %d messages; acknowledged up to %d, of which up to %d still stored",
		r.p, st.First, st.Last, st.Messages, r.top, r.kept)
	// An append to the refused PChannel does not succeed, through the
	// client and straight on the append subject, even as the coordinator
	// tries to open it again and again under new terms.
	appendCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	res, err := r.c.Append(appendCtx, clInsert(t, r.c, r.v, hlPayload("refused-client")))
	cancel()
	require.Error(t, err, "an append to %s, refused, succeeded: %+v", r.p, res)
	m := clInsert(t, r.c, r.v, hlPayload("refused-raw"))
	appendCtx, cancel = context.WithTimeout(ctx, 2*time.Second)
	raw, _, err := appendOne(appendCtx, s.Conn(), s.Codec, m)
	cancel()
	require.Error(t, err, "an append to %s, refused, succeeded: %+v", r.p, raw)
	r.assignment(s, "more refused opens of "+r.p.String(), func(b wire.Assignment) bool {
		return b.Term >= a.Term+2 && !b.Serving && strings.Contains(b.Error, string(streamwal.CodeHistoryLost))
	})
	after, err := be.State(ctx, r.p)
	require.NoError(t, err)
	require.Equal(t, st.Last, after.Last, "a refused open writes nothing to %s", r.p)
}

// acceptLoss writes the operator's consent to serve p as it is.
func (r *hlRun) acceptLoss(s *system.System) recovery.AcceptLoss {
	t := r.t
	t.Helper()
	ctx := testContext(t)
	js, err := njs.New(s.Conn())
	require.NoError(t, err)
	kv, err := recovery.OpenBucket(ctx, js, r.o.Cluster)
	require.NoError(t, err)
	store := recovery.NewKV(kv)
	raw, _, err := store.Get(ctx, streamwal.CheckpointKey(r.p))
	require.NoError(t, err)
	var cp recovery.Checkpoint
	require.NoError(t, json.Unmarshal(raw, &cp))
	a := recovery.AcceptLoss{Above: max(cp.Reached, cp.Consumed), By: "integration test", At: time.Now().UTC()}
	require.GreaterOrEqual(t, a.Above, r.top, "the checkpoint knows every acknowledged MessageID")
	require.NoError(t, recovery.WriteAcceptLoss(ctx, store, r.p, a))
	return a
}

// requireServedAbove checks that p is served again, that new appends
// land above every MessageID acknowledged before, and that a reader from
// the start reads each message once, with the payload acknowledged at its
// MessageID, the new ones among them. It returns the MessageIDs
// acknowledged before that were not read: lost.
func (r *hlRun) requireServedAbove(s *system.System) (lost []messages.MessageID) {
	t := r.t
	t.Helper()
	ctx := testContext(t)
	a := r.assignment(s, r.p.String()+" served again", func(a wire.Assignment) bool { return a.Serving })
	require.Empty(t, a.Error, "the error of %s is cleared once it is served", r.p)
	before := r.top
	for i := range 5 {
		r.append(ctx, fmt.Sprintf("after-%d", i), 3)
	}
	for name, id := range r.names {
		if strings.HasPrefix(name, "after-") {
			require.Greater(t, id, before, "%s landed at %d, not above every MessageID acknowledged before (%d)", name, id, before)
		}
	}
	end := "end-" + r.v.String()
	r.append(ctx, end, 1)

	sc, err := r.c.Read(ctx, client.ReadOptions{VChannel: r.v, Start: client.Earliest(), Types: []*messages.Type{messages.TypeInsert}})
	require.NoError(t, err)
	defer sc.Close()
	seen := map[string]int{}
	var prev messages.MessageID
	survived := 0
	for m, err := range sc.All(ctx) {
		require.NoError(t, err, "read %s after %d inserts", r.v, len(seen))
		require.Greater(t, m.ID(), prev, "MessageIDs increase")
		prev = m.ID()
		name := hlName(m)
		if strings.HasPrefix(name, "refused-") {
			// An append refused while the PChannel was not served failed
			// with an unknown outcome; had it landed after all, it would
			// be above every MessageID acknowledged before.
			require.Greater(t, m.ID(), before, "%s, refused, landed at %d", name, m.ID())
			t.Logf("%s, refused, landed at %d", name, m.ID())
			continue
		}
		require.Equal(t, r.acked[m.ID()], name, "%d holds %s, not what was acknowledged there", m.ID(), name)
		seen[name]++
		require.Equal(t, 1, seen[name], "%s read twice", name)
		if name == end+"-0" {
			break
		}
	}
	require.Equal(t, 1, seen[end+"-0"], "the reader reached the last insert")
	for name, id := range r.names {
		switch {
		case !strings.HasPrefix(name, "before-"):
			require.Equal(t, 1, seen[name], "%s, acknowledged after the loss, read once", name)
		case seen[name] == 1:
			survived++
		default:
			lost = append(lost, id)
		}
	}
	slices.Sort(lost)
	shown := fmt.Sprint(lost)
	if len(lost) > 8 {
		shown = fmt.Sprintf("%v ... %v", lost[:4], lost[len(lost)-4:])
	}
	t.Logf("served again: %d of %d messages acknowledged before read back, %d lost %s; new appends from %d",
		survived, hlMessages, len(lost), shown, r.names["after-0-0"])
	return lost
}

// TestHistoryLostIsRefusedUntilAccepted: the tail of a PChannel's stream
// file is cut while the server is down (and, in a second run, the
// stream's index file removed too, so that the server rebuilds the
// stream's state from what the block holds and would hand the lost
// MessageIDs out again). The PChannel is not served: its open fails with
// HISTORY_LOST, which the coordinator's view and the client's status
// show, and appends to it do not succeed, so no MessageID acknowledged
// before is handed out again. Once an operator accepts the loss, it is
// served again above every MessageID acknowledged before, and a reader
// from the start reads each surviving message once.
func TestHistoryLostIsRefusedUntilAccepted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		cluster     streamwal.Cluster
		removeIndex bool
	}{
		{"tail cut", "hlcut", false},
		{"tail cut and index removed", "hlcutidx", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := hlStart(t, tc.cluster)
			blocks := r.blocks()
			last := blocks[len(blocks)-1]
			info, err := os.Stat(last)
			require.NoError(t, err)
			cut := min(int64(hlCut), info.Size()/2)
			require.NoError(t, os.Truncate(last, info.Size()-cut))
			t.Logf("cut %d bytes off %s (%d bytes)", cut, filepath.Base(last), info.Size())
			if tc.removeIndex {
				index := filepath.Join(filepath.Dir(last), "index.db")
				require.NoError(t, os.Remove(index))
				t.Logf("removed %s", index)
			}

			s := r.restart()
			r.requireRefused(s)
			require.Less(t, r.kept, r.top, "the cut took acknowledged messages off the stream")
			r.acceptLoss(s)
			lost := r.requireServedAbove(s)
			require.NotEmpty(t, lost)
			for _, id := range lost {
				require.Greater(t, id, r.kept, "%d, which the stream kept, is lost", id)
			}
		})
	}
}

// TestCorruptBlockNeverReusesIDs: bytes in the middle of a PChannel's
// stream file are overwritten while the server is down. Whatever the
// server makes of it, the PChannel is either refused cleanly with
// HISTORY_LOST (and served again once an operator accepts the loss) or
// served; either way no MessageID acknowledged before is handed out
// again, and no reader reads another payload at an acknowledged
// MessageID. (A server that keeps counting a record it cannot deliver,
// below the last message consumed, is served with that message missing:
// see the log line the test writes then.)
func TestCorruptBlockNeverReusesIDs(t *testing.T) {
	t.Parallel()
	r := hlStart(t, "hlcorrupt")
	blocks := r.blocks()
	last := blocks[len(blocks)-1]
	f, err := os.OpenFile(last, os.O_RDWR, 0)
	require.NoError(t, err)
	info, err := f.Stat()
	require.NoError(t, err)
	garbage := bytes.Repeat([]byte{0xa5}, 256)
	off := info.Size() / 2
	_, err = f.WriteAt(garbage, off)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	t.Logf("overwrote %d bytes at %d of %s (%d bytes)", len(garbage), off, filepath.Base(last), info.Size())

	s := r.restart()
	a := r.assignment(s, r.p.String()+" served or refused with HISTORY_LOST", func(a wire.Assignment) bool {
		return a.Serving || strings.Contains(a.Error, string(streamwal.CodeHistoryLost))
	})
	if a.Serving {
		t.Logf("%s is served despite the corruption", r.p)
	} else {
		t.Logf("%s is refused: %s", r.p, a.Error)
		r.requireRefused(s)
		r.acceptLoss(s)
	}
	lost := r.requireServedAbove(s)
	be := tiersOf(t, r.srv, r.c.Codec())
	ctx := testContext(t)
	st, err := be.State(ctx, r.p)
	require.NoError(t, err)
	t.Logf("%s's stream now: first %d, last %d, %d messages", r.p, st.First, st.Last, st.Messages)
	for _, id := range lost[:min(len(lost), 3)] {
		_, err := be.Get(ctx, r.p, id)
		t.Logf("acknowledged message %d (%s) is not read back; get: %v", id, r.acked[id], err)
	}
	if a.Serving && len(lost) > 0 {
		// The server kept counting a record it can no longer deliver,
		// below the last message consumed: the open's checks (the tail,
		// the count of messages above the truncation point, the digest of
		// the last message consumed) cannot see it without reading the
		// whole stream. No ID was reused (requireServedAbove checked it);
		// the loss is a known limit, recorded here rather than hidden.
		t.Logf("KNOWN LIMIT: %s is served although %d acknowledged messages cannot be read back", r.p, len(lost))
	}
}
