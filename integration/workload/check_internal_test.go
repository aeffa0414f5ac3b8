package workload

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// TestBarrierBehindIsToleratedOnlyWhenAskedAndOnlyForBarriers feeds the
// stream check an insert at TimeTick 100 (term 1), a RecoveryBarrier of
// term 2 at 90, and an insert of term 2 at 95: strict, the barrier and
// the insert after it are violations; tolerating barriers behind, the
// barrier is counted apart and the insert, still not above 100, is a
// violation all the same.
func TestBarrierBehindIsToleratedOnlyWhenAskedAndOnlyForBarriers(t *testing.T) {
	codec, err := messages.NewCodec("wl", nil)
	require.NoError(t, err)
	v, err := streamwal.ParseVChannel("pchan-0_1v0")
	require.NoError(t, err)
	p := v.PChannel()
	at := func(m *messages.MutableMessage, err error, id messages.MessageID, term uint64, tt messages.TimeTick) *messages.ImmutableMessage {
		require.NoError(t, err)
		m.SetTerm(term)
		m.SetTimeTick(tt)
		return m.Freeze(id)
	}
	insert := func(id messages.MessageID, term uint64, tt messages.TimeTick) *messages.ImmutableMessage {
		m, err := codec.New(messages.TypeInsert, v, []byte("x"))
		return at(m, err, id, term, tt)
	}
	m, err := codec.NewPChannelBody(messages.TypeRecoveryBarrier, p, messages.RecoveryBarrierBody{Term: 2})
	stream := []*messages.ImmutableMessage{insert(1, 1, 100), at(m, err, 2, 2, 90), insert(3, 2, 95)}

	for _, tolerate := range []bool{false, true} {
		c := &checker{tolerateBarrier: tolerate}
		var top *messages.ImmutableMessage
		for _, m := range stream {
			top = c.checkTimeTick(p, top, m)
		}
		require.Equal(t, stream[0], top, "the largest TimeTick stays the top")
		if tolerate {
			require.Len(t, c.report.BarriersBehind, 1)
			require.Contains(t, c.report.BarriersBehind[0], "TimeTick 90 of RecoveryBarrier 2 (term 2) not above 100 of Insert 1 (term 1)")
			require.Len(t, c.report.Violations, 1)
		} else {
			require.Empty(t, c.report.BarriersBehind)
			require.Len(t, c.report.Violations, 2)
			require.Contains(t, c.report.Violations[0], "TimeTick 90 of RecoveryBarrier 2")
		}
		require.Contains(t, c.report.Violations[len(c.report.Violations)-1], "TimeTick 95 of Insert 3 (term 2) not above 100 of Insert 1")
	}
}
