package recovery

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks).
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }

// testCluster is the cluster of the tests' buckets.
const testCluster streamwal.Cluster = "c1"

// testCtx is a context bounded for one test.
func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pch returns PChannel pchan-<i>.
func pch(t testing.TB, i int) streamwal.PChannel {
	t.Helper()
	p, err := streamwal.NewPChannel(streamwal.DefaultPChannelPrefix, i)
	require.NoError(t, err)
	return p
}

// testJetStream starts an embedded server with file storage under
// t.TempDir() and returns a JetStream context on it.
func testJetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	srv := embedded.StartTest(t)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// natsStores returns a constructor of stores over fresh checkpoint
// buckets (one cluster each) of one embedded server.
func natsStores(t testing.TB) func() Store {
	t.Helper()
	js := testJetStream(t)
	var n atomic.Int64
	return func() Store {
		c := streamwal.Cluster(fmt.Sprintf("t%d", n.Add(1)))
		kv, err := OpenBucket(testCtx(t), js, c)
		require.NoError(t, err)
		return NewKV(kv)
	}
}

// natsStore returns a store over the checkpoints bucket of testCluster on
// a fresh embedded server.
func natsStore(t testing.TB) Store {
	t.Helper()
	kv, err := OpenBucket(testCtx(t), testJetStream(t), testCluster)
	require.NoError(t, err)
	return NewKV(kv)
}

// testCtxCancelled returns a context and its cancel function.
func testCtxCancelled(t testing.TB) (context.Context, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx, cancel
}
