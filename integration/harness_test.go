// Package integration holds whole-system tests: a real embedded
// nats-server with coordinators and nodes in process (package
// embedded/system), driven only through NATS request subjects and read
// back through the read pipeline.
package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
	"github.com/streamwal/streamwal/services/wire"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks).
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }

// startSystem starts an in-process cluster on a fresh server.
func startSystem(t *testing.T, coords, nodes int) *system.System {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := system.Start(ctx, system.Options{Cluster: "it", Coordinators: coords, Nodes: nodes,
		ServerOptions: embedded.Options{StoreDir: t.TempDir()}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

// waitServing waits until every PChannel is served (and balanced).
func waitServing(t *testing.T, s *system.System, balanced bool) wire.View {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := s.WaitServing(ctx, balanced)
	require.NoError(t, err)
	return v
}

// call sends a request and decodes its reply.
func call(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	return wire.Call(ctx, nc, subject, req, reply)
}

// appendOne appends one message through its PChannel's append subject,
// retrying retriable errors with the same message ID until ctx ends.
// Every non-retriable error is returned; so is the number of retries.
func appendOne(ctx context.Context, nc *nats.Conn, codec *messages.Codec, m *messages.MutableMessage) (wire.AppendResult, int, error) {
	nm, err := codec.Encode(m)
	if err != nil {
		return wire.AppendResult{}, 0, err
	}
	req := wire.AppendRequest{Messages: []wire.Message{{Subject: nm.Subject, Header: nm.Header, Data: nm.Data}}}
	subject := codec.Cluster().AppendSubject(m.PChannel())
	delay := 10 * time.Millisecond
	for retries := 0; ; retries++ {
		var reply wire.AppendReply
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := call(callCtx, nc, subject, req, &reply)
		cancel()
		if err == nil && len(reply.Results) == 1 {
			err = reply.Results[0].Error.Err()
		}
		if err == nil {
			return reply.Results[0], retries, nil
		}
		if !streamwal.IsRetriableWithID(err) {
			return wire.AppendResult{}, retries, err
		}
		select {
		case <-ctx.Done():
			return wire.AppendResult{}, retries, fmt.Errorf("gave up after %d retries: %w", retries, err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// writer appends inserts to one VChannel per PChannel from several
// goroutines, retrying through failures, and records what was
// acknowledged and every error seen.
type writer struct {
	t       *testing.T
	nc      *nats.Conn
	codec   *messages.Codec
	vs      []streamwal.VChannel
	mu      sync.Mutex
	acked   map[string]messages.MessageID
	lastTT  map[streamwal.PChannel]messages.TimeTick
	retries int
	fatal   []error
	stop    chan struct{}
	wg      sync.WaitGroup
}

// newWriter allocates one single-shard collection per PChannel through the
// coordinator and creates it.
func newWriter(t *testing.T, s *system.System, collections int) *writer {
	w := &writer{t: t, nc: s.Conn(), codec: s.Codec, acked: map[string]messages.MessageID{},
		lastTT: map[streamwal.PChannel]messages.TimeTick{}, stop: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for id := int64(1); id <= int64(collections); id++ {
		var reply wire.AllocateReply
		require.NoError(t, call(ctx, w.nc, s.Codec.Cluster().CoordSubject(streamwal.CoordAllocate),
			wire.AllocateRequest{CollectionID: id, Shards: 1}, &reply))
		v, err := streamwal.ParseVChannel(reply.VChannels[0])
		require.NoError(t, err)
		m, err := s.Codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
			CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: fmt.Sprint(id), CollectionID: id},
			VChannels:     reply.VChannels}, messages.WithMsgID(fmt.Sprintf("create-%d", id)))
		require.NoError(t, err)
		_, _, err = appendOne(ctx, w.nc, w.codec, m)
		require.NoError(t, err)
		w.vs = append(w.vs, v)
	}
	return w
}

// start runs n goroutines appending until stop.
func (w *writer) start(n int) {
	for g := range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-w.stop:
					return
				default:
				}
				v := w.vs[(g+i)%len(w.vs)]
				w.appendInsert(v, fmt.Sprintf("g%d-i%d", g, i))
			}
		}()
	}
}

// appendInsert appends one insert and books the outcome.
func (w *writer) appendInsert(v streamwal.VChannel, name string) {
	m, err := w.codec.New(messages.TypeInsert, v, []byte(name), messages.WithMsgID(name))
	if err != nil {
		w.fail(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, retries, err := appendOne(ctx, w.nc, w.codec, m)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.retries += retries
	if err != nil {
		w.fatal = append(w.fatal, fmt.Errorf("%s: %w", name, err))
		return
	}
	w.acked[name] = res.ID
}

// fail records a fatal error.
func (w *writer) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fatal = append(w.fatal, err)
}

// count is how many appends were acknowledged.
func (w *writer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// waitFor waits until n more appends were acknowledged.
func (w *writer) waitFor(t *testing.T, n int) {
	t.Helper()
	target := w.count() + n
	require.Eventually(t, func() bool { return w.count() >= target }, 30*time.Second, 5*time.Millisecond,
		"the writer did not make progress")
}

// finish stops the writer and checks that it saw only retriable errors.
func (w *writer) finish(t *testing.T) {
	close(w.stop)
	w.wg.Wait()
	require.Empty(t, w.fatal, "the writer saw non-retriable errors")
	t.Logf("writer: %d appends acknowledged, %d retries", len(w.acked), w.retries)
}

// checkReadBack reads every VChannel back and checks that every
// acknowledged insert appears exactly once, at its MessageID, and that
// TimeTicks strictly increase.
func (w *writer) checkReadBack(t *testing.T, s *system.System) {
	be, err := jetstream.New(s.Conn(), s.Codec, jetstream.Options{})
	require.NoError(t, err)
	defer be.Close()
	seen := map[string]int{}
	for _, v := range w.vs {
		got := readAll(t, be, s.Codec, v)
		for i, m := range got {
			if i > 0 {
				require.Greater(t, m.TimeTick(), got[i-1].TimeTick(), "%s: timeticks must increase at %d", v, m.ID())
			}
			if m.Type() != messages.TypeInsert {
				continue
			}
			name := string(m.Payload())
			seen[name]++
			if id, ok := w.acked[name]; ok {
				require.Equal(t, id, m.ID(), "%s landed elsewhere than acknowledged", name)
			}
		}
	}
	for name := range w.acked {
		require.Equal(t, 1, seen[name], "acknowledged insert %s read %d times", name, seen[name])
	}
	for name, n := range seen {
		require.Equal(t, 1, n, "insert %s read %d times", name, n)
	}
}

// readAll reads a VChannel from the start to its current end.
func readAll(t *testing.T, be jetstream.Backend, codec *messages.Codec, v streamwal.VChannel) []*messages.ImmutableMessage {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	end, err := be.Read(ctx, v.PChannel(), jetstream.ReadOptions{Start: jetstream.Latest()})
	require.NoError(t, err)
	last := end.Start().ID
	require.NoError(t, end.Close())
	sc, err := read.Open(ctx, read.Options{Backend: be, Codec: codec, PChannel: v.PChannel(), VChannel: v,
		Start: read.Earliest(), Types: []*messages.Type{messages.TypeInsert, messages.TypeCreateCollection, messages.TypeTimeTick, messages.TypeRecoveryBarrier}})
	require.NoError(t, err)
	defer sc.Close()
	var out []*messages.ImmutableMessage
	for out == nil || out[len(out)-1].ID() < last {
		m, err := sc.Next(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("read %s: reached %d of %d", v, len(out), last)
		}
		require.NoError(t, err)
		out = append(out, m)
	}
	var kept []*messages.ImmutableMessage
	for _, m := range out {
		if m.Type() != messages.TypeTimeTick && m.Type() != messages.TypeRecoveryBarrier {
			kept = append(kept, m)
		}
	}
	return kept
}
