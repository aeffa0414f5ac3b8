package coord

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
)

// record is what the store tests persist.
type record struct {
	Value string `json:"value"`
	Epoch uint64 `json:"epoch"`
}

// testCtx is a context bounded for one test step.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// connect connects to srv and closes the connection when the test ends.
func connect(t *testing.T, connect func(...nats.Option) (*nats.Conn, error)) *nats.Conn {
	t.Helper()
	nc, err := connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// testBucket creates a KV bucket with the given replicas.
func testBucket(t *testing.T, nc *nats.Conn, replicas int) njs.KeyValue {
	t.Helper()
	js, err := njs.New(nc)
	require.NoError(t, err)
	kv, err := js.CreateKeyValue(testCtx(t), njs.KeyValueConfig{Bucket: "store_test", History: 1, Replicas: replicas})
	require.NoError(t, err)
	return kv
}

// stored reads key's value as a record.
func stored(t *testing.T, kv njs.KeyValue, key string) (record, uint64) {
	t.Helper()
	e, err := kv.Get(testCtx(t), key)
	require.NoError(t, err)
	var r record
	require.NoError(t, json.Unmarshal(e.Value(), &r))
	return r, e.Revision()
}

// requireDeposed checks that err is the store's refusal.
func requireDeposed(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, errDeposed)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.True(t, streamwal.IsRetriable(err))
}

func TestStoreLoadAndPut(t *testing.T) {
	srv := embedded.StartTest(t)
	kv := testBucket(t, connect(t, srv.Connect), 1)
	ctx := testCtx(t)
	s := newStore(kv)

	var r record
	found, err := s.load(ctx, "k", &r)
	require.NoError(t, err)
	require.False(t, found)
	require.Zero(t, r)

	// put creates.
	require.NoError(t, s.put(ctx, "k", record{Value: "one", Epoch: 1}))
	got, rev := stored(t, kv, "k")
	require.Equal(t, record{Value: "one", Epoch: 1}, got)
	require.Equal(t, rev, s.revs["k"], "the store remembers the revision it wrote")

	// put updates with the remembered revision.
	require.NoError(t, s.put(ctx, "k", record{Value: "two", Epoch: 1}))
	got, rev2 := stored(t, kv, "k")
	require.Equal(t, "two", got.Value)
	require.Greater(t, rev2, rev)
	require.Equal(t, rev2, s.revs["k"])

	// load reads it back, in another store too.
	for _, st := range []*store{s, newStore(kv)} {
		var back record
		found, err = st.load(ctx, "k", &back)
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, record{Value: "two", Epoch: 1}, back)
		require.Equal(t, rev2, st.revs["k"])
	}

	// Keys are independent.
	require.NoError(t, s.put(ctx, "other", record{Value: "x"}))
	require.NoError(t, s.put(ctx, "k", record{Value: "three"}))
}

func TestStoreFencesAStaleWriter(t *testing.T) {
	srv := embedded.StartTest(t)
	kv := testBucket(t, connect(t, srv.Connect), 1)
	ctx := testCtx(t)
	a, b := newStore(kv), newStore(kv)

	var r record
	_, err := a.load(ctx, "k", &r)
	require.NoError(t, err)
	require.NoError(t, a.put(ctx, "k", record{Value: "a1", Epoch: 1}))

	// B takes over: it loads and rewrites the key.
	found, err := b.load(ctx, "k", &r)
	require.NoError(t, err)
	require.True(t, found)
	require.NoError(t, b.put(ctx, "k", record{Value: "b1", Epoch: 2}))

	// A's write is refused, and leaves B's in place.
	requireDeposed(t, a.put(ctx, "k", record{Value: "a2", Epoch: 1}))
	got, _ := stored(t, kv, "k")
	require.Equal(t, record{Value: "b1", Epoch: 2}, got)
	// And stays refused (a refused write does not refresh the revision).
	requireDeposed(t, a.put(ctx, "k", record{Value: "a3", Epoch: 1}))

	// B goes on writing.
	require.NoError(t, b.put(ctx, "k", record{Value: "b2", Epoch: 2}))

	// After A re-loads, its writes work again (and fence B in turn).
	found, err = a.load(ctx, "k", &r)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "b2", r.Value)
	require.NoError(t, a.put(ctx, "k", record{Value: "a4", Epoch: 3}))
	requireDeposed(t, b.put(ctx, "k", record{Value: "b3", Epoch: 2}))
}

func TestStoreFencesACreate(t *testing.T) {
	// Two stores that both found the key missing: the second create is
	// refused.
	srv := embedded.StartTest(t)
	kv := testBucket(t, connect(t, srv.Connect), 1)
	ctx := testCtx(t)
	a, b := newStore(kv), newStore(kv)
	var r record
	for _, s := range []*store{a, b} {
		found, err := s.load(ctx, "k", &r)
		require.NoError(t, err)
		require.False(t, found)
	}
	require.NoError(t, a.put(ctx, "k", record{Value: "a"}))
	requireDeposed(t, b.put(ctx, "k", record{Value: "b"}))
	got, _ := stored(t, kv, "k")
	require.Equal(t, "a", got.Value)
}

func TestStoreDeletedKey(t *testing.T) {
	srv := embedded.StartTest(t)
	kv := testBucket(t, connect(t, srv.Connect), 1)
	ctx := testCtx(t)
	s := newStore(kv)
	require.NoError(t, s.put(ctx, "k", record{Value: "one"}))

	// Somebody deletes the key behind the store's back: its write is
	// refused (the revision it remembers is gone).
	require.NoError(t, kv.Delete(ctx, "k"))
	requireDeposed(t, s.put(ctx, "k", record{Value: "two"}))

	// A load of a deleted key finds nothing, and the next put creates it.
	var r record
	found, err := s.load(ctx, "k", &r)
	require.NoError(t, err)
	require.False(t, found)
	require.NoError(t, s.put(ctx, "k", record{Value: "three"}))
	got, _ := stored(t, kv, "k")
	require.Equal(t, "three", got.Value)
}

func TestStoreLoadMalformed(t *testing.T) {
	srv := embedded.StartTest(t)
	kv := testBucket(t, connect(t, srv.Connect), 1)
	ctx := testCtx(t)
	_, err := kv.PutString(ctx, "k", "not json")
	require.NoError(t, err)
	var r record
	_, err = newStore(kv).load(ctx, "k", &r)
	require.ErrorIs(t, err, streamwal.ErrUnrecoverable)
}

func TestStoreUnencodable(t *testing.T) {
	srv := embedded.StartTest(t)
	kv := testBucket(t, connect(t, srv.Connect), 1)
	err := newStore(kv).put(testCtx(t), "k", make(chan int))
	require.Error(t, err)
	require.False(t, errors.Is(err, errDeposed))
}

func TestStoreUnavailable(t *testing.T) {
	// With the server gone, reads and writes fail as retriable, and are
	// not mistaken for a deposition.
	srv := embedded.StartTest(t)
	nc := connect(t, func(o ...nats.Option) (*nats.Conn, error) {
		return srv.Connect(append(o, nats.MaxReconnects(-1))...)
	})
	kv := testBucket(t, nc, 1)
	s := newStore(kv)
	require.NoError(t, s.put(testCtx(t), "k", record{Value: "one"}))
	srv.Shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var r record
	_, err := s.load(ctx, "k", &r)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	err = s.put(ctx, "k", record{Value: "two"})
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.False(t, errors.Is(err, errDeposed))
}

// TestStoreFencesAStaleWriterReplicated: on a bucket of three replicas
// (Config.Replicas 3, as on a NATS cluster) JetStream refuses a
// compare-and-set on a key that another write is in flight on with error
// code 10164 (JSErrCodeStreamWrongLastSequenceConstant) rather than 10071;
// the refusal of a stale writer racing its successor must still be a
// deposition.
func TestStoreFencesAStaleWriterReplicated(t *testing.T) {
	cl := embedded.StartTestCluster(t)
	require.NoError(t, cl.WaitHealthy(30*time.Second))
	kv := testBucket(t, connect(t, cl.Connect), 3)
	ctx := testCtx(t)

	a := newStore(kv)
	require.NoError(t, a.put(ctx, "k", record{Value: "a1"}))
	// The successor writes the key continuously, as an active coordinator
	// does.
	b := newStore(kv)
	var r record
	_, err := b.load(ctx, "k", &r)
	require.NoError(t, err)
	require.NoError(t, b.put(ctx, "k", record{Value: "b1"}))
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			wctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = b.put(wctx, "k", record{Value: "b"})
			cancel()
		}
	}()
	defer func() { close(stop); <-done }()

	for i := range 200 {
		err := a.put(ctx, "k", record{Value: "a"})
		require.ErrorIs(t, err, errDeposed, "stale write %d", i)
		require.ErrorIs(t, err, streamwal.ErrUnavailable)
	}
}
