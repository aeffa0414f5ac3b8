package coord

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// scopedTSO asks for n TimeTicks for the WAL of p under term.
func (e *env) scopedTSO(p string, term uint64, n uint32) (messages.TimeTick, error) {
	var r wire.TSOReply
	err := e.call(streamwal.CoordTSO, map[string]any{"count": n, "pchannel": p, "term": term}, &r)
	return r.First, err
}

// Once a PChannel is reassigned under term 2, the oracle refuses
// TimeTicks to its owner of term 1 (fenced, naming the PChannel and both
// terms), already when the new owner hears of its assignment, while term
// 2 and unscoped requests are served above every TimeTick term 1 got.
func TestTSORefusesASupersededOwner(t *testing.T) {
	e := newEnv(t)
	e.waitActive(5*time.Second, e.start("a"))
	names := pchannelNames(t)
	p := names[0]

	n1 := e.node("n1")
	e.waitChannels(wire.Assigned, "n1", 1)
	old, err := e.scopedTSO(p, 1, 8)
	require.NoError(t, err)

	// What term 1 may still draw when the term-2 owner hears of its open.
	var mu sync.Mutex
	atOpen := map[string]error{}
	sub, err := e.nc.Subscribe(testCluster.NodeSubject("n2", streamwal.NodeOpen), func(m *nats.Msg) {
		var req wire.OpenRequest
		if wire.Decode(m.Data, &req) != nil || req.Term < 2 {
			return
		}
		_, err := e.scopedTSO(req.PChannel.String(), req.Term-1, 1)
		mu.Lock()
		atOpen[req.PChannel.String()] = err
		mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	n1.silence()
	e.waitChannels(wire.Unavailable, "", 1)
	e.node("n2")
	e.waitChannels(wire.Assigned, "n2", 2)
	// The observer answers nothing, so it may still be asking.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(atOpen) == len(names)
	}, 5*time.Second, poll)
	mu.Lock()
	for name, err := range atOpen {
		require.ErrorIs(t, err, streamwal.ErrFenced, "term 1 of %s when term 2's owner hears of it", name)
	}
	mu.Unlock()

	_, err = e.scopedTSO(p, 1, 1)
	require.ErrorIs(t, err, streamwal.ErrFenced)
	for _, want := range []string{p, "term 1", "term 2"} {
		require.Contains(t, err.Error(), want)
	}
	first, err := e.scopedTSO(p, 2, 1)
	require.NoError(t, err)
	require.Greater(t, first, old+7)
	// The other PChannels' terms and unscoped requests are served.
	_, err = e.scopedTSO(names[1], 2, 1)
	require.NoError(t, err)
	_, err = e.tso(1)
	require.NoError(t, err)
}

// A scoped request names both its PChannel and its term, and a PChannel
// of the cluster; otherwise it is refused as invalid.
func TestTSORefusesABadScope(t *testing.T) {
	e := newEnv(t)
	e.waitActive(5*time.Second, e.start("a"))
	p := pchannelNames(t)[0]
	for _, req := range []map[string]any{{"count": 1, "pchannel": p}, {"count": 1, "term": 1}, {"count": 1, "pchannel": "nope_0", "term": 1}} {
		var r wire.TSOReply
		require.ErrorIs(t, e.call(streamwal.CoordTSO, req, &r), streamwal.ErrInvalidArgument, "%+v", req)
	}
	// Unassigned yet (term 0): term 1 is not superseded.
	_, err := e.scopedTSO(p, 1, 1)
	require.NoError(t, err)
}
