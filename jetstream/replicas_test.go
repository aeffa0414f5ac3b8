package jetstream_test

import (
	"context"
	"sync"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/internal/testbed"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// TestProvisionNeverScalesDown: on a three-server cluster, a backend
// keeping 1 replica refuses to provision a PChannel whose stream has 3
// (a node started with the default on a cluster), with an error naming
// both counts, and the stream keeps its 3; one keeping 3 provisions it.
func TestProvisionNeverScalesDown(t *testing.T) {
	cl, ctx, codec, p := startReplicated(t, "scale")
	backend := func(replicas int) *jetstream.JetStream {
		nc, err := cl.Connect()
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		b, err := jetstream.New(nc, codec, jetstream.Options{Replicas: replicas})
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	require.NoError(t, backend(3).Provision(ctx, p))
	err := backend(1).Provision(ctx, p)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Contains(t, err.Error(), "has 3 replicas and this backend keeps 1")
	require.NoError(t, backend(3).Provision(ctx, p))
	js := clusterJS(t, cl)
	s, err := js.Stream(ctx, codec.Cluster().StreamName(p))
	require.NoError(t, err)
	require.Equal(t, 3, s.CachedInfo().Config.Replicas)
}

// startReplicated starts a three-server cluster for t (skipped with
// -short) and returns it with a 30 s deadline, a codec of cluster and its
// PChannel pchan-0.
func startReplicated(t *testing.T, cluster streamwal.Cluster) (*embedded.Cluster, context.Context, *messages.Codec, streamwal.PChannel) {
	t.Helper()
	if testing.Short() {
		t.Skip("a three-server cluster")
	}
	cl := embedded.StartTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	codec, err := messages.NewCodec(cluster, nil)
	require.NoError(t, err)
	p, err := streamwal.NewPChannel("pchan", 0)
	require.NoError(t, err)
	return cl, ctx, codec, p
}

// clusterJS is a JetStream context on a connection of its own to cl.
func clusterJS(t *testing.T, cl *embedded.Cluster) njs.JetStream {
	t.Helper()
	nc, err := cl.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := njs.New(nc)
	require.NoError(t, err)
	return js
}

// TestLastNeedsNoConsumer: Last is 0 for a PChannel without a stream
// (and creates none), then the last MessageID written, and leaves no
// consumer behind.
func TestLastNeedsNoConsumer(t *testing.T) {
	tb := testbed.Start(t, testbed.Config{Cluster: "last"})
	nc, codec, b := tb.Conn, tb.Codec, tb.Backend
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := streamwal.NewPChannel("pchan", 0)
	require.NoError(t, err)
	last, err := b.Last(ctx, p)
	require.NoError(t, err)
	require.Zero(t, last)
	js, err := njs.New(nc)
	require.NoError(t, err)
	_, err = js.Stream(ctx, codec.Cluster().StreamName(p))
	require.ErrorIs(t, err, njs.ErrStreamNotFound, "Last creates no stream")

	w, err := b.OpenWriter(ctx, p, 1)
	require.NoError(t, err)
	defer func() { _ = w.Close() }()
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	m, err := codec.New(messages.TypeInsert, v, []byte("x"))
	require.NoError(t, err)
	ids, err := w.Append(ctx, m, m.Clone())
	require.NoError(t, err)
	last, err = b.Last(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ids[1], last)
	s, err := js.Stream(ctx, codec.Cluster().StreamName(p))
	require.NoError(t, err)
	require.Zero(t, s.CachedInfo().State.Consumers)
}

// TestCreationsRaceOnACluster: two backends keeping 3 replicas, connected
// to different servers of a three-server cluster, create the object store
// and a PChannel's stream at the same moment, as two nodes started
// together do, or a writer and a reader: one provisions the stream
// (OpenWriter does) while the other creates it as a reader does, and both
// provision a second PChannel's. Every call returns well within its
// deadline (nats-server 2.15.2 often answers neither of two equal
// creations of a replicated stream that arrive together, or refuses one
// as a name already in use while the other is under way; without a bound
// per attempt, both waited out their deadline).
func TestCreationsRaceOnACluster(t *testing.T) {
	cl, ctx, codec, p := startReplicated(t, "race")
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	p2, err := streamwal.NewPChannel("pchan", 1)
	require.NoError(t, err)
	errs := make([]error, 6)
	var wg sync.WaitGroup
	for i := range 2 {
		nc, err := cl.Servers()[i+1].Connect()
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		b, err := jetstream.New(nc, codec, jetstream.Options{Replicas: 3})
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		wg.Go(func() { _, errs[3*i] = b.Segments(ctx, v) })
		if i == 0 {
			wg.Go(func() { errs[3*i+1] = b.Provision(ctx, p) })
		} else {
			wg.Go(func() { _, errs[3*i+1] = b.State(ctx, p) })
		}
		wg.Go(func() { errs[3*i+2] = b.Provision(ctx, p2) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "call %d", i)
	}
	require.NoError(t, ctx.Err(), "the creations took the whole deadline")
	js := clusterJS(t, cl)
	s, err := js.Stream(ctx, codec.Cluster().StreamName(p))
	require.NoError(t, err)
	require.Equal(t, 3, s.CachedInfo().Config.Replicas)
	s2, err := js.Stream(ctx, codec.Cluster().StreamName(p2))
	require.NoError(t, err)
	require.Equal(t, 3, s2.CachedInfo().Config.Replicas)
	obs, err := js.ObjectStore(ctx, codec.Cluster().ObjectStoreName(streamwal.ObjectStoreSegments))
	require.NoError(t, err)
	st, err := obs.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, st.Replicas())
}
