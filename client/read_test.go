package client_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
)

// newSmallSystem starts a cluster of one PChannel, so that every
// collection's VChannel shares it.
func newSmallSystem(t *testing.T) *system.System { return newSystemOf(t, 1) }

// newSystemOf starts a cluster of pchannels PChannels (and so collections
// of up to that many shards).
func newSystemOf(t *testing.T, pchannels int) *system.System {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := system.Start(ctx, system.Options{ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Coord: coord.Config{PChannels: pchannels}, Node: node.Config{SyncInterval: syncInterval}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	_, err = s.WaitServing(ctx, false)
	require.NoError(t, err)
	return s
}

// payloads are the Insert payloads of msgs, and the bodies of their Txns.
func payloads(msgs []*messages.ImmutableMessage) []string {
	var out []string
	for _, m := range msgs {
		switch m.Type() {
		case messages.TypeInsert:
			out = append(out, string(m.Payload()))
		case messages.TypeTxn:
			for _, b := range m.TxnBody() {
				out = append(out, string(b.Payload()))
			}
		}
	}
	return out
}

// readAll reads with UntilNow until the read ends.
func readAll(t *testing.T, ctx context.Context, c *client.Client, o client.ReadOptions) []*messages.ImmutableMessage {
	t.Helper()
	o.UntilNow = true
	s, err := c.Read(ctx, o)
	require.NoError(t, err)
	defer s.Close()
	var out []*messages.ImmutableMessage
	for m, err := range s.All(ctx) {
		require.NoError(t, err)
		out = append(out, m)
	}
	_, err = s.Next(ctx)
	require.ErrorIs(t, err, io.EOF, "a read to now stays ended")
	return out
}

// TestReadUntilNow: a read with UntilNow returns what the VChannel held
// when it opened and then ends, though the last message of the stream
// belongs to another VChannel, though appends go on meanwhile, and at
// once for a VChannel with nothing to deliver; a transaction still open
// at the start is not delivered.
func TestReadUntilNow(t *testing.T) {
	s := newSmallSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	_, v := createCollection(t, ctx, c)
	_, other := createCollection(t, ctx, c)
	require.Equal(t, v.PChannel(), other.PChannel())

	require.Empty(t, payloads(readAll(t, ctx, c, client.ReadOptions{VChannel: v})), "only the DDL so far")
	_, err := c.AppendBytes(ctx, v, []byte("a"), []byte("b"))
	require.NoError(t, err)
	txn, err := c.BeginTxn(ctx, v, time.Minute)
	require.NoError(t, err)
	_, err = txn.Append(ctx, insert(t, c, v, "in-txn"))
	require.NoError(t, err)
	_, err = c.AppendBytes(ctx, v, []byte("c"))
	require.NoError(t, err)
	_, err = c.AppendBytes(ctx, other, []byte("elsewhere"))
	require.NoError(t, err)

	// Appends go on while the reads run: a read ends at its own start.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := c.AppendBytes(ctx, v, fmt.Appendf(nil, "later-%d", i)); err != nil {
				return
			}
		}
	}()
	got := payloads(readAll(t, ctx, c, client.ReadOptions{VChannel: v}))
	close(stop)
	wg.Wait()
	require.GreaterOrEqual(t, len(got), 3)
	require.Equal(t, []string{"a", "b", "c"}, got[:3], "in order, the open transaction left out")
	for i, p := range got[3:] {
		require.Equal(t, fmt.Sprintf("later-%d", i), p, "only appends that landed before the read opened")
	}

	require.Equal(t, []string{"elsewhere"}, payloads(readAll(t, ctx, c, client.ReadOptions{VChannel: other})))
	require.Empty(t, readAll(t, ctx, c, client.ReadOptions{VChannel: v, Start: client.Latest()}), "latest to now is nothing")
	whole := payloads(readAll(t, ctx, c, client.ReadOptions{PChannel: v.PChannel()}))
	require.Contains(t, whole, "elsewhere")
	require.Contains(t, whole, "a")

	_, err = txn.Commit(ctx)
	require.NoError(t, err)
	got = payloads(readAll(t, ctx, c, client.ReadOptions{VChannel: v}))
	require.Equal(t, "in-txn", got[len(got)-1], "committed, the transaction is read whole")

	_, err = c.Read(ctx, client.ReadOptions{UntilNow: true})
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

// TestAppendBytes: payloads land as Inserts in order; one on a VChannel
// of no collection is refused with the reason's sentinel.
func TestAppendBytes(t *testing.T) {
	s := newSmallSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	_, v := createCollection(t, ctx, c)
	res, err := c.AppendBytes(ctx, v, []byte("x"), []byte("y"))
	require.NoError(t, err)
	require.Len(t, res, 2)
	require.Less(t, res[0].ID, res[1].ID)
	require.Equal(t, []string{"x", "y"}, payloads(readAll(t, ctx, c, client.ReadOptions{VChannel: v})))

	nowhere, err := v.PChannel().VChannel(999_999, 0)
	require.NoError(t, err)
	_, err = c.AppendBytes(ctx, nowhere, []byte("z"))
	require.ErrorIs(t, err, streamwal.ErrCollectionNotFound)
}

// TestRefusalReasonsCrossTheHop: lifecycle refusals match their reason's
// sentinel through NATS and through the local bypass alike.
func TestRefusalReasonsCrossTheHop(t *testing.T) {
	s := newSmallSystem(t)
	forModes(t, func(t *testing.T, m mode) {
		ctx := testCtx(t)
		c := newClient(t, s, m.opts...)
		col, v := createCollection(t, ctx, c)
		_, err := c.CreateCollection(ctx, col)
		require.NoError(t, err, "creating what exists is idempotent (the refusal is recognised by its reason)")
		require.NoError(t, c.CreatePartition(ctx, col, 5))
		require.NoError(t, c.CreatePartition(ctx, col, 5))

		nowhere, err := v.PChannel().VChannel(collectionIDs.Add(1)+500_000, 0)
		require.NoError(t, err)
		_, err = c.AppendBytes(ctx, nowhere, []byte("z"))
		require.ErrorIs(t, err, streamwal.ErrCollectionNotFound)
		require.ErrorIs(t, err, streamwal.ErrLifecycle)
		require.NotErrorIs(t, err, streamwal.ErrCollectionDropped)

		require.NoError(t, c.DropCollection(ctx, col))
		_, err = c.AppendBytes(ctx, v, []byte("late"))
		require.ErrorIs(t, err, streamwal.ErrCollectionDropped)
		_, err = c.CreateCollection(ctx, col)
		require.ErrorIs(t, err, streamwal.ErrCollectionDropped)
		_, err = c.CollectionVChannels(ctx, col.ID)
		require.ErrorIs(t, err, streamwal.ErrCollectionDropped)
	})
}

// TestLocalBypassIsInjected: a client given the system's nodes appends
// without a request on the append subject; a client without them (the
// default) sends one.
func TestLocalBypassIsInjected(t *testing.T) {
	s := newSmallSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	_, v := createCollection(t, ctx, c)
	mo := watchAppends(t, s, c, v.PChannel())

	_, err := c.AppendBytes(ctx, v, []byte("local"))
	require.NoError(t, err)
	require.Empty(t, mo.requests(t), "WithLocal: the node's WAL is called directly")

	plain, err := client.New(connect(t, s))
	require.NoError(t, err)
	defer func() { require.NoError(t, plain.Close()) }()
	_, err = plain.AppendBytes(ctx, v, []byte("remote"))
	require.NoError(t, err)
	require.Len(t, mo.requests(t), 1, "without WithLocal the append goes through NATS")
	require.Equal(t, []string{"local", "remote"}, payloads(readAll(t, ctx, c, client.ReadOptions{VChannel: v})))
}
