package assign

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/coord/balance"
)

// TestTakeoverSeedsOwnersOnceRewritten: the owners of the records a
// takeover finds count as alive from the moment their records are
// rewritten, not from the takeover's start, so that slow writes do not
// count against the node TTL (a coordinator took over on a loaded machine
// and declared its only node dead before it could hear from it).
func TestTakeoverSeedsOwnersOnceRewritten(t *testing.T) {
	m := New(Config{Epoch: 2, NodeTTL: time.Second, OpenTimeout: time.Minute, Policy: balance.DefaultPolicy()})
	p, err := streamwal.NewPChannel("p", 0)
	require.NoError(t, err)
	rec := Record{Node: "n1", Term: 3, State: streamwal.Assigned, Session: "s1", Version: 1, Serving: true}
	effects := m.Step(t0, Takeover{Channels: []Loaded{{PChannel: p, Record: rec}}})
	written := t0.Add(900 * time.Millisecond)
	var answer func([]Effect)
	answer = func(effects []Effect) {
		for _, e := range effects {
			switch e := e.(type) {
			case PersistAssignment:
				answer(m.Step(written, Persisted{Rev: e.Rev}))
			case PersistCollections:
				answer(m.Step(written, Persisted{Rev: e.Rev}))
			case PublishView:
				answer(m.Step(written, Persisted{Rev: e.Rev}))
			}
		}
	}
	answer(effects)
	require.NoError(t, m.checkInvariants())
	require.Contains(t, m.nodes, streamwal.NodeID("n1"))
	for _, e := range m.Step(t0.Add(1500*time.Millisecond), HealthCheck{}) {
		if l, ok := e.(Log); ok {
			require.NotEqual(t, "node dead", l.Msg, "lost within the node TTL of its record's rewrite")
		}
	}
	require.Contains(t, m.nodes, streamwal.NodeID("n1"))
	require.Equal(t, streamwal.Assigned, m.channels[0].rec.State)
}
