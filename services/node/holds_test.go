package node

import (
	"bytes"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// TestSubscriptionHolds: a PChannel is held at the smallest From of the
// live positions on its VChannels (an earliest position at 1), not by
// those of other PChannels, and everything is held until the positions
// were read; an idle position past its expiry (its own, or the node's)
// stops holding, and says so once in the log.
func TestSubscriptionHolds(t *testing.T) {
	var logs bytes.Buffer
	h := newSubscriptionHolds("c", time.Hour, zerolog.New(&logs))
	p0, err := streamwal.NewPChannel("pchan", 0)
	require.NoError(t, err)
	p1, err := streamwal.NewPChannel("pchan", 1)
	require.NoError(t, err)
	v0, err := p0.VChannel(1, 0)
	require.NoError(t, err)
	w0, err := p0.VChannel(2, 0)
	require.NoError(t, err)
	v1, err := p1.VChannel(1, 1)
	require.NoError(t, err)
	now := time.Now()

	require.Equal(t, messages.MessageID(1), h.For(p0)(), "nothing read yet: everything held")
	h.replace(map[string]wire.SubscriptionPosition{
		streamwal.SubscriptionPositionKey("a", v0): {VChannel: v0.String(), From: 40, Acked: now},
		streamwal.SubscriptionPositionKey("b", w0): {VChannel: w0.String(), From: 25, Acked: now.Add(-2 * time.Minute), Expiry: time.Minute},
		streamwal.SubscriptionPositionKey("c", w0): {VChannel: w0.String(), From: 30, Acked: now.Add(-30 * time.Minute)},
		streamwal.SubscriptionPositionKey("d", v1): {VChannel: v1.String(), From: 0, Acked: now},
		streamwal.SubscriptionPositionKey("e", v0): {VChannel: v0.String(), From: 5, Acked: now.Add(-2 * time.Hour)},
	})
	require.Equal(t, messages.MessageID(30), h.hold(p0, now), "b idle past its own expiry, e past the node's")
	require.Equal(t, messages.MessageID(1), h.hold(p1, now), "an earliest position holds everything")
	require.Equal(t, messages.MessageID(30), h.hold(p0, now))
	require.Equal(t, 2, bytes.Count(logs.Bytes(), []byte("no longer holds the log")), "each expiry logged once")

	never := newSubscriptionHolds("c", -1, zerolog.Nop())
	never.replace(map[string]wire.SubscriptionPosition{
		streamwal.SubscriptionPositionKey("e", v0): {VChannel: v0.String(), From: 5, Acked: now.Add(-1000 * time.Hour)},
	})
	require.Equal(t, messages.MessageID(5), never.hold(p0, now), "a negative expiry never expires")
	p2, err := streamwal.NewPChannel("pchan", 2)
	require.NoError(t, err)
	require.Zero(t, never.hold(p2, now), "a PChannel without positions is not held")
}
