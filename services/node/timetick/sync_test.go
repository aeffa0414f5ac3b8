package timetick_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/timetick"
)

func TestSyncerRounds(t *testing.T) {
	s := timetick.NewSyncer(5)
	a, covers := s.Decide(0)
	require.Equal(t, timetick.SyncLive, a, "right after the barrier")
	require.Equal(t, messages.MessageID(5), covers)

	s.Landed(6, false)
	a, _ = s.Decide(0)
	require.Equal(t, timetick.SyncPersist, a)
	a, _ = s.Decide(1)
	require.Equal(t, timetick.SyncNothing, a, "the tick is in flight and the tail is data")
	s.Failed()
	a, _ = s.Decide(0)
	require.Equal(t, timetick.SyncPersist, a, "a failed tick is retried")
	s.Landed(7, true)
	a, covers = s.Decide(0)
	require.Equal(t, timetick.SyncLive, a)
	require.Equal(t, messages.MessageID(7), covers)
	a, _ = s.Decide(2)
	require.Equal(t, timetick.SyncNothing, a, "no live tick while appends are in flight")

	// A tick whose ack is processed after a later message's is not the tail.
	s.Landed(9, false)
	s.Landed(8, true)
	a, _ = s.Decide(0)
	require.Equal(t, timetick.SyncPersist, a)
	a, _ = s.Decide(0)
	require.Equal(t, timetick.SyncNothing, a, "the tail (9) is data")
}

// TestSyncerModel checks that a live tick always covers the largest
// MessageID landed, and only when that message is a tick or the barrier.
func TestSyncerModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := timetick.NewSyncer(1)
		kinds := map[messages.MessageID]bool{1: true} // id -> is a tick
		tail := messages.MessageID(1)
		dataSinceTick := false
		for range rapid.IntRange(1, 100).Draw(t, "steps") {
			if rapid.Bool().Draw(t, "land") {
				id := tail + messages.MessageID(rapid.IntRange(-2, 3).Draw(t, "offset"))
				if _, seen := kinds[id]; seen || id < 1 {
					continue
				}
				tick := rapid.Bool().Draw(t, "tick")
				kinds[id] = tick
				tail = max(tail, id)
				s.Landed(id, tick)
				dataSinceTick = dataSinceTick || !tick
				continue
			}
			a, covers := s.Decide(rapid.IntRange(0, 2).Draw(t, "inflight"))
			switch a {
			case timetick.SyncLive:
				require.Equal(t, tail, covers)
				require.True(t, kinds[covers], "a live tick covers a tick or barrier")
				require.False(t, dataSinceTick)
			case timetick.SyncPersist:
				require.True(t, dataSinceTick)
				dataSinceTick = false
			}
		}
	})
}
