package read_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
)

// TestAtTimeTickLocates checks the binary search of a TimeTick start on a
// stream with a RecoveryBarrier whose TimeTick is out of order (a newer
// owner drew it before the earlier owner's last messages landed) and with
// its head truncated: for every TimeTick, the scanner's first message is
// the first message of the stream at or above it.
func TestAtTimeTickLocates(t *testing.T) {
	e := newWAL(t)
	var all []written
	for range 40 {
		all = append(all, e.one(e.insert(e.v1)))
	}
	// A newer owner whose barrier carries a TimeTick below the last ones.
	barrier := e.pbody(messages.TypeRecoveryBarrier, messages.RecoveryBarrierBody{Term: 2})
	barrier.SetTimeTick(all[len(all)-5].TimeTick + 1)
	w2, err := e.be.OpenWriter(context.Background(), e.p, 2, jetstream.WithBarrier(barrier))
	require.NoError(t, err)
	t.Cleanup(func() { _ = w2.Close() })
	e.w = w2
	for range 40 {
		all = append(all, e.one(e.insert(e.v1)))
	}
	require.NoError(t, e.be.Truncate(context.Background(), e.p, all[10].ID))
	all = all[10:]
	last := all[len(all)-1]

	probes := []messages.TimeTick{0, all[0].TimeTick, barrier.TimeTick(), last.TimeTick}
	for _, w := range all {
		probes = append(probes, w.TimeTick-1, w.TimeTick, w.TimeTick+1)
	}
	for _, tt := range probes {
		var want []messages.MessageID
		for _, w := range all {
			if w.TimeTick >= tt {
				want = append(want, w.ID)
			}
		}
		if len(want) == 0 {
			continue
		}
		s := e.open(read.Options{Start: read.AtTimeTick(tt)})
		got := readUntil(t, s, last.ID)
		require.Equal(t, want, ids(got), "start at timetick %s", tt)
		require.NoError(t, s.Close())
	}
}
