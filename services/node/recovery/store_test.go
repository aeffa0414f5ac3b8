package recovery

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
)

func TestStoreMemory(t *testing.T) {
	testStore(t, func() Store { return NewMemory() })
}

func TestStoreKV(t *testing.T) {
	testStore(t, natsStores(t))
}

func TestStoreFaultyWithoutFaults(t *testing.T) {
	testStore(t, func() Store { return &Faulty{Store: NewMemory()} })
}

// testStore checks the Store contract on stores made by newStore, one per
// subtest.
func testStore(t *testing.T, newStore func() Store) {
	key := streamwal.CheckpointKey(pch(t, 0))
	other := streamwal.VChannelMetaKey(pch(t, 0))

	t.Run("absent", func(t *testing.T) {
		s, ctx := newStore(), testCtx(t)
		_, _, err := s.Get(ctx, key)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = s.Put(ctx, key, []byte("v"), 7)
		require.ErrorIs(t, err, ErrConflict, "an update of an absent key")
		require.NoError(t, s.Delete(ctx, key), "deleting an absent key")
	})

	t.Run("create, update, conflicts", func(t *testing.T) {
		s, ctx := newStore(), testCtx(t)
		r1, err := s.Put(ctx, key, []byte("one"), 0)
		require.NoError(t, err)
		require.Positive(t, r1)
		v, rev, err := s.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, "one", string(v))
		require.Equal(t, r1, rev)

		_, err = s.Put(ctx, key, []byte("again"), 0)
		require.ErrorIs(t, err, ErrConflict, "a create of an existing key")
		_, err = s.Put(ctx, key, []byte("wrong"), r1+100)
		require.ErrorIs(t, err, ErrConflict, "an update at another revision")

		r2, err := s.Put(ctx, key, []byte("two"), r1)
		require.NoError(t, err)
		require.Greater(t, r2, r1)
		_, err = s.Put(ctx, key, []byte("stale"), r1)
		require.ErrorIs(t, err, ErrConflict, "an update at a stale revision")
		v, rev, err = s.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, "two", string(v), "refused writes changed nothing")
		require.Equal(t, r2, rev)
	})

	t.Run("revisions grow across keys", func(t *testing.T) {
		s, ctx := newStore(), testCtx(t)
		r1, err := s.Put(ctx, key, []byte("a"), 0)
		require.NoError(t, err)
		r2, err := s.Put(ctx, other, []byte("b"), 0)
		require.NoError(t, err)
		require.Greater(t, r2, r1)
		_, err = s.Put(ctx, other, []byte("c"), r1)
		require.ErrorIs(t, err, ErrConflict, "another key's revision")
	})

	t.Run("delete", func(t *testing.T) {
		s, ctx := newStore(), testCtx(t)
		r1, err := s.Put(ctx, key, []byte("a"), 0)
		require.NoError(t, err)
		require.NoError(t, s.Delete(ctx, key))
		_, _, err = s.Get(ctx, key)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = s.Put(ctx, key, []byte("b"), r1)
		require.ErrorIs(t, err, ErrConflict, "an update of a deleted key")
		r2, err := s.Put(ctx, key, []byte("b"), 0)
		require.NoError(t, err, "a create after a delete")
		require.Greater(t, r2, r1)
		v, _, err := s.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, "b", string(v))
	})

	t.Run("values are copied", func(t *testing.T) {
		s, ctx := newStore(), testCtx(t)
		in := []byte("abc")
		_, err := s.Put(ctx, key, in, 0)
		require.NoError(t, err)
		in[0] = 'x'
		out, _, err := s.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, "abc", string(out))
		out[0] = 'y'
		again, _, err := s.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, "abc", string(again))
	})

	t.Run("concurrent compare-and-set", func(t *testing.T) {
		s, ctx := newStore(), testCtx(t)
		r1, err := s.Put(ctx, key, []byte("base"), 0)
		require.NoError(t, err)
		var won, lost atomic.Int32
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				_, err := s.Put(ctx, key, []byte("mine"), r1)
				switch {
				case err == nil:
					won.Add(1)
				case errors.Is(err, ErrConflict):
					lost.Add(1)
				default:
					t.Errorf("put: %v", err)
				}
			})
		}
		wg.Wait()
		require.EqualValues(t, 1, won.Load())
		require.EqualValues(t, 15, lost.Load())
	})

	t.Run("cancelled context", func(t *testing.T) {
		s := newStore()
		ctx, cancel := testCtxCancelled(t)
		cancel()
		_, _, err := s.Get(ctx, key)
		require.Error(t, err)
		require.NotErrorIs(t, err, ErrNotFound)
		_, err = s.Put(ctx, key, []byte("v"), 0)
		require.Error(t, err)
		require.NotErrorIs(t, err, ErrConflict)
	})
}

func TestFaultyHooks(t *testing.T) {
	ctx := testCtx(t)
	key := streamwal.CheckpointKey(pch(t, 0))
	boom := errors.New("boom")
	mem := NewMemory()
	f := &Faulty{Store: mem, Fail: func(op, k string) error {
		if op == OpPut && k == key {
			return boom
		}
		return nil
	}}
	_, err := f.Put(ctx, key, []byte("v"), 0)
	require.ErrorIs(t, err, boom)
	_, _, err = mem.Get(ctx, key)
	require.ErrorIs(t, err, ErrNotFound, "Fail stops the operation")

	f = &Faulty{Store: mem, After: func(op, k string) error { return boom }}
	_, err = f.Put(ctx, key, []byte("v"), 0)
	require.ErrorIs(t, err, boom)
	v, _, err := mem.Get(ctx, key)
	require.NoError(t, err, "After lets the operation take effect")
	require.Equal(t, "v", string(v))
	_, _, err = f.Get(ctx, key)
	require.ErrorIs(t, err, boom)
	require.ErrorIs(t, f.Delete(ctx, key), boom)
	_, _, err = mem.Get(ctx, key)
	require.ErrorIs(t, err, ErrNotFound)
}

func TestOpenBucket(t *testing.T) {
	ctx := testCtx(t)
	js := testJetStream(t)
	kv, err := OpenBucket(ctx, js, testCluster)
	require.NoError(t, err)
	require.Equal(t, testCluster.BucketName(streamwal.BucketCheckpoints), kv.Bucket())
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.History())
	info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
	require.Equal(t, jetstream.FileStorage, info.Config.Storage)

	_, err = kv.Put(ctx, "k", []byte("v"))
	require.NoError(t, err)
	again, err := OpenBucket(ctx, js, testCluster, WithReplicas(1))
	require.NoError(t, err, "opening an existing bucket")
	e, err := again.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(e.Value()))
}

func TestKVErrors(t *testing.T) {
	s := natsStore(t)
	ctx := testCtx(t)
	_, err := s.Put(ctx, "bad key*", []byte("v"), 0)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, _, err = s.Get(ctx, "bad key*")
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

// TestOpenBucketConcurrentlyOnACluster opens a new cluster's checkpoints
// bucket at 3 replicas from two nodes at once, connected to different
// servers of a three-server cluster, as two nodes started together do:
// both finish well within their deadline, and the bucket has 3 replicas.
// (nats-server 2.15.2 often answers neither of two equal creations of one
// replicated stream that arrive together; without a bound per attempt,
// both waited out their start timeout.)
func TestOpenBucketConcurrentlyOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-server cluster")
	}
	cl := embedded.StartTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range errs {
		nc, err := cl.Servers()[i+1].Connect()
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		wg.Go(func() { _, errs[i] = OpenBucket(ctx, js, "open", WithReplicas(3)) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "node %d", i)
	}
	nc, err := cl.Connect()
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, streamwal.Cluster("open").BucketName(streamwal.BucketCheckpoints))
	require.NoError(t, err)
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas)
}
