package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
)

// dataTypes are the types the subscription tests follow: inserts and
// committed transactions.
var dataTypes = client.SubscribeTypes(messages.TypeInsert, messages.TypeTxn)

// receive takes n deliveries.
func receive(t *testing.T, ctx context.Context, s *client.Subscription, n int) []*client.Delivery {
	t.Helper()
	out := make([]*client.Delivery, 0, n)
	for len(out) < n {
		d, err := s.Next(ctx)
		require.NoError(t, err, "after %d of %d deliveries", len(out), n)
		out = append(out, d)
	}
	return out
}

// delivered renders deliveries as payloads (see payloads).
func delivered(ds []*client.Delivery) []string {
	msgs := make([]*messages.ImmutableMessage, len(ds))
	for i, d := range ds {
		msgs[i] = d.Message
	}
	return payloads(msgs)
}

// appendNumbered appends payloads prefix-from .. prefix-(to-1) to v.
func appendNumbered(t *testing.T, ctx context.Context, c *client.Client, v streamwal.VChannel, prefix string, from, to int) []client.AppendResult {
	t.Helper()
	var ps [][]byte
	for i := from; i < to; i++ {
		ps = append(ps, fmt.Appendf(nil, "%s-%d", prefix, i))
	}
	res, err := c.AppendBytes(ctx, v, ps...)
	require.NoError(t, err)
	return res
}

// numbered are the payloads prefix-from .. prefix-(to-1).
func numbered(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// subscribe opens a subscription closed with the test.
func subscribe(t *testing.T, ctx context.Context, c *client.Client, name string, opts ...client.SubscribeOption) *client.Subscription {
	t.Helper()
	s, err := c.Subscribe(ctx, name, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// requireNothingMore checks that s delivers nothing for a short while
// (the live ticks keep the readers moving meanwhile).
func requireNothingMore(t *testing.T, s *client.Subscription) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	d, err := s.Next(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "unexpected delivery %v", d)
}

// TestSubscribeResumesAfterTheLastAck: a subscription resumes, on another
// client, right after its last acknowledged message: what was delivered
// and not acknowledged comes again, nothing acknowledged does; an ack
// covers every message delivered before it; an ack older than the
// position changes nothing.
func TestSubscribeResumesAfterTheLastAck(t *testing.T) {
	s := newSmallSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	_, v := createCollection(t, ctx, c)
	appendNumbered(t, ctx, c, v, "m", 0, 10)

	sub, err := c.Subscribe(ctx, "resume", client.SubscribeVChannel(v), dataTypes)
	require.NoError(t, err)
	got := receive(t, ctx, sub, 5)
	require.Equal(t, numbered("m", 0, 5), delivered(got))
	require.NoError(t, got[2].Ack(ctx))
	require.NoError(t, got[1].Ack(ctx), "an older ack is accepted and changes nothing")
	require.NoError(t, sub.Close())
	_, err = sub.Next(ctx)
	require.ErrorIs(t, err, streamwal.ErrClosed)

	other := newClient(t, s)
	sub = subscribe(t, ctx, other, "resume", client.SubscribeVChannel(v), dataTypes)
	got = receive(t, ctx, sub, 7)
	require.Equal(t, numbered("m", 3, 10), delivered(got), "redelivered: exactly what was not acknowledged")
	require.NoError(t, got[6].Ack(ctx))
	requireNothingMore(t, sub)
	appendNumbered(t, ctx, c, v, "m", 10, 12)
	require.Equal(t, numbered("m", 10, 12), delivered(receive(t, ctx, sub, 2)), "live appends follow")
	require.NoError(t, sub.Close())

	sub = subscribe(t, ctx, c, "resume", client.SubscribeVChannel(v), dataTypes)
	require.Equal(t, numbered("m", 10, 12), delivered(receive(t, ctx, sub, 2)))

	infos, err := c.Subscriptions(ctx)
	require.NoError(t, err)
	require.Len(t, infos, 1)
	require.Equal(t, "resume", infos[0].Name)
	require.Equal(t, v.String(), infos[0].VChannel)
	require.Len(t, infos[0].Positions, 1)
	pos := infos[0].Positions[0]
	require.Equal(t, v.String(), pos.VChannel)
	require.NotZero(t, pos.ID)
	require.GreaterOrEqual(t, pos.LastID, pos.ID)
}

// TestSubscribeSeesATransactionOpenAtItsPositionWhole: acknowledging a
// message while a transaction is open on the VChannel, then resuming
// after its commit, delivers the transaction whole.
func TestSubscribeSeesATransactionOpenAtItsPositionWhole(t *testing.T) {
	s := newSmallSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	_, v := createCollection(t, ctx, c)
	txn, err := c.BeginTxn(ctx, v, time.Minute)
	require.NoError(t, err)
	_, err = txn.Append(ctx, insert(t, c, v, "t-1"), insert(t, c, v, "t-2"))
	require.NoError(t, err)
	appendNumbered(t, ctx, c, v, "p", 0, 2)

	sub, err := c.Subscribe(ctx, "txn", client.SubscribeVChannel(v), dataTypes)
	require.NoError(t, err)
	got := receive(t, ctx, sub, 2)
	require.Equal(t, numbered("p", 0, 2), delivered(got))
	require.NoError(t, got[1].Ack(ctx))
	require.NoError(t, sub.Close())

	_, err = txn.Commit(ctx)
	require.NoError(t, err)
	appendNumbered(t, ctx, c, v, "p", 2, 3)
	sub = subscribe(t, ctx, c, "txn", client.SubscribeVChannel(v), dataTypes)
	got = receive(t, ctx, sub, 2)
	require.Equal(t, []string{"t-1", "t-2", "p-2"}, delivered(got), "the transaction begun before the ack, whole")
	require.Equal(t, messages.TypeTxn, got[0].Message.Type())
}

// TestSubscribeStarts: where a new subscription starts (latest, a
// TimeTick, a time, a MessageID), and that an existing one ignores it.
func TestSubscribeStarts(t *testing.T) {
	s := newSmallSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	_, v := createCollection(t, ctx, c)
	res := appendNumbered(t, ctx, c, v, "m", 0, 6)

	latest, err := c.Subscribe(ctx, "latest", client.SubscribeVChannel(v), dataTypes, client.SubscribeStart(client.Latest()))
	require.NoError(t, err)
	require.NoError(t, latest.Close(), "closed before reading: its start stays where it was created")
	appendNumbered(t, ctx, c, v, "m", 6, 8)
	latest = subscribe(t, ctx, c, "latest", client.SubscribeVChannel(v), dataTypes, client.SubscribeStart(client.Earliest()))
	require.Equal(t, numbered("m", 6, 8), delivered(receive(t, ctx, latest, 2)))

	at := subscribe(t, ctx, c, "at-tt", client.SubscribeVChannel(v), dataTypes, client.SubscribeStart(client.AtTimeTick(res[3].TimeTick)))
	require.Equal(t, numbered("m", 3, 8), delivered(receive(t, ctx, at, 5)))

	when := subscribe(t, ctx, c, "at-time", client.SubscribeVChannel(v), dataTypes, client.SubscribeStart(client.AtTime(time.Now().Add(-time.Hour))))
	require.Equal(t, numbered("m", 0, 8), delivered(receive(t, ctx, when, 8)))

	after := subscribe(t, ctx, c, "after", client.SubscribeVChannel(v), dataTypes, client.SubscribeStart(client.After(res[4].ID)))
	require.Equal(t, numbered("m", 5, 8), delivered(receive(t, ctx, after, 3)))
}

// TestSubscribeCollection: a subscription on a collection reads each of
// its VChannels in order and keeps a position per VChannel.
func TestSubscribeCollection(t *testing.T) {
	s := newSystemOf(t, 2)
	ctx := testCtx(t)
	c := newClient(t, s)
	col := client.Collection{DBName: "db", Name: "sharded", ID: collectionIDs.Add(1), Shards: 2}
	vs, err := c.CreateCollection(ctx, col)
	require.NoError(t, err)
	require.Len(t, vs, 2)
	for i, v := range vs {
		appendNumbered(t, ctx, c, v, fmt.Sprintf("v%d", i), 0, 3)
	}
	sub, err := c.Subscribe(ctx, "col", client.SubscribeCollection(col.ID), dataTypes)
	require.NoError(t, err)
	byV := map[streamwal.VChannel][]*client.Delivery{}
	for _, d := range receive(t, ctx, sub, 6) {
		byV[d.VChannel] = append(byV[d.VChannel], d)
	}
	for i, v := range vs {
		require.Equal(t, numbered(fmt.Sprintf("v%d", i), 0, 3), delivered(byV[v]), "%s in order", v)
	}
	require.NoError(t, byV[vs[0]][2].Ack(ctx))
	require.NoError(t, byV[vs[1]][0].Ack(ctx))
	require.Len(t, sub.Positions(), 2)
	require.NoError(t, sub.Close())

	sub = subscribe(t, ctx, c, "col", client.SubscribeCollection(col.ID), dataTypes)
	require.Equal(t, numbered("v1", 1, 3), delivered(receive(t, ctx, sub, 2)), "only the second VChannel's unacknowledged")
	requireNothingMore(t, sub)
}

// TestSubscribeRefusals: bad names and targets, a name reused for another
// target, and a subscription that does not exist, each a typed error that
// changes nothing.
func TestSubscribeRefusals(t *testing.T) {
	s := newSmallSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	col, v := createCollection(t, ctx, c)
	for _, tc := range []struct {
		name string
		opts []client.SubscribeOption
	}{
		{"a.b", []client.SubscribeOption{client.SubscribeVChannel(v)}},
		{"", []client.SubscribeOption{client.SubscribeVChannel(v)}},
		{"none", nil},
		{"both", []client.SubscribeOption{client.SubscribeVChannel(v), client.SubscribeCollection(col.ID)}},
		{"buffer", []client.SubscribeOption{client.SubscribeVChannel(v), client.SubscribeBuffer(0)}},
	} {
		_, err := c.Subscribe(ctx, tc.name, tc.opts...)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, tc.name)
	}
	_, err := c.Subscribe(ctx, "ghost", client.SubscribeCollection(collectionIDs.Add(1)))
	require.ErrorIs(t, err, streamwal.ErrCollectionNotFound)

	sub := subscribe(t, ctx, c, "taken", client.SubscribeVChannel(v))
	_, err = c.Subscribe(ctx, "taken", client.SubscribeCollection(col.ID))
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.ErrorContains(t, err, "exists for vchannel "+v.String())
	require.NoError(t, sub.Close())

	infos, err := c.Subscriptions(ctx)
	require.NoError(t, err)
	require.Len(t, infos, 1, "refused subscriptions leave nothing behind")
	require.NoError(t, c.DeleteSubscription(ctx, "taken"))
	require.ErrorIs(t, c.DeleteSubscription(ctx, "taken"), streamwal.ErrSubscriptionNotFound)
	infos, err = c.Subscriptions(ctx)
	require.NoError(t, err)
	require.Empty(t, infos)
}

// TestSubscribePositionLost: a position below the first message of the
// stream, which no archive holds, is refused with ErrPositionLost.
func TestSubscribePositionLost(t *testing.T) {
	s := newSmallSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	_, v := createCollection(t, ctx, c)
	appendNumbered(t, ctx, c, v, "m", 0, 4)
	sub, err := c.Subscribe(ctx, "lost", client.SubscribeVChannel(v), dataTypes)
	require.NoError(t, err)
	got := receive(t, ctx, sub, 2)
	require.NoError(t, got[0].Ack(ctx))
	require.NoError(t, sub.Close())

	res := appendNumbered(t, ctx, c, v, "m", 4, 6)
	purgeBelow(t, ctx, s, v.PChannel(), res[1].ID)
	_, err = c.Subscribe(ctx, "lost", client.SubscribeVChannel(v), dataTypes)
	require.ErrorIs(t, err, streamwal.ErrPositionLost)
	require.ErrorIs(t, err, streamwal.ErrUnrecoverable)
}

// purgeBelow removes the messages of p's stream below id, as a
// truncation that archives nothing would.
func purgeBelow(t *testing.T, ctx context.Context, s *system.System, p streamwal.PChannel, id messages.MessageID) {
	t.Helper()
	js, err := njs.New(s.Conn())
	require.NoError(t, err)
	st, err := js.Stream(ctx, s.Codec.Cluster().StreamName(p))
	require.NoError(t, err)
	require.NoError(t, st.Purge(ctx, njs.WithPurgeSequence(uint64(id))))
}
