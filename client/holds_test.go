package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	wjs "github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
)

// newTruncatingSystem starts a cluster of one PChannel whose node
// truncates as far as it may at once: every row count of 3 seals a
// segment, checkpoints follow every message, and only the 1 s duplicate
// window is kept.
func newTruncatingSystem(t *testing.T) *system.System {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := system.Start(ctx, system.Options{ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Coord: coord.Config{PChannels: 1},
		Node: node.Config{SyncInterval: syncInterval, Backend: wjs.Options{DuplicateWindow: time.Second},
			Recovery: node.RecoveryOptions{Cadence: recovery.Cadence{Interval: 20 * time.Millisecond, Dirty: 1},
				Shard: shard.Config{MaxRows: 3}, Retain: node.RetainNothing, TruncateInterval: 50 * time.Millisecond}}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	_, err = s.WaitServing(ctx, false)
	require.NoError(t, err)
	return s
}

// firstID is the first message p's stream keeps.
func firstID(t *testing.T, ctx context.Context, c *client.Client, p streamwal.PChannel) messages.MessageID {
	t.Helper()
	st, err := c.Status(ctx)
	require.NoError(t, err)
	for _, ch := range st.Channels {
		if ch.PChannel == p.String() {
			return ch.FirstID
		}
	}
	t.Fatalf("no %s in the status", p)
	return 0
}

// TestPositionsHoldTheLog: the owner's truncation stops at the position
// of a durable subscription that is open (which keeps it alive however
// short its expiry), not at one closed and idle past its expiry (listed as
// expired), and passes it once the subscription is deleted.
func TestPositionsHoldTheLog(t *testing.T) {
	s := newTruncatingSystem(t)
	ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Second)
	defer cancel()
	c := newClient(t, s)
	_, v := createCollection(t, ctx, c)
	appendNumbered(t, ctx, c, v, "m", 0, 3)
	appendNumbered(t, ctx, c, v, "m", 3, 6) // a call of its own: its LastConfirmed is above the first's

	idle := subscribe(t, ctx, c, "idle", client.SubscribeVChannel(v), dataTypes, client.SubscribeExpiry(200*time.Millisecond))
	require.NoError(t, receive(t, ctx, idle, 1)[0].Ack(ctx))
	idleFrom := idle.Positions()[0].From
	require.NoError(t, idle.Close())
	holder := subscribe(t, ctx, c, "holder", client.SubscribeVChannel(v), dataTypes, client.SubscribeExpiry(time.Second))
	got := receive(t, ctx, holder, 4)
	require.NoError(t, got[3].Ack(ctx))
	held := holder.Positions()[0].From
	require.Equal(t, got[3].Message.LastConfirmed(), held, "a position holds the log from its LastConfirmed")
	require.Greater(t, held, idleFrom)

	// Truncation goes on up to the holder, past the idle subscription,
	// and never beyond.
	for i := 0; ; i++ {
		appendNumbered(t, ctx, c, v, "n", 3*i, 3*i+3)
		first := firstID(t, ctx, c, v.PChannel())
		require.LessOrEqual(t, first, held, "truncation passed a held position")
		if first == held {
			break
		}
		require.NoError(t, ctx.Err(), "truncation never reached the holder's position (first %d, held %d)", first, held)
	}
	infos, err := c.Subscriptions(ctx)
	require.NoError(t, err)
	require.Len(t, infos, 2)
	require.Equal(t, "idle", infos[1].Name, "sorted by name")
	require.True(t, infos[1].Positions[0].Expired, "an idle position past its expiry is listed as expired")
	require.False(t, infos[0].Positions[0].Expired)

	require.NoError(t, holder.Close())
	require.NoError(t, c.DeleteSubscription(ctx, "holder"))
	require.Eventually(t, func() bool {
		appendNumbered(t, ctx, c, v, "late", 0, 3)
		return firstID(t, ctx, c, v.PChannel()) > held
	}, 20*time.Second, 50*time.Millisecond, "a deleted subscription stops holding the log")

	// The idle one now resumes below the stream: from the archive.
	idle = subscribe(t, ctx, c, "idle", client.SubscribeVChannel(v), dataTypes)
	require.Equal(t, []string{"m-1", "m-2"}, delivered(receive(t, ctx, idle, 2)), "read from the archive")
}
