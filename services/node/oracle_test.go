package node

import (
	"context"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/services/wire"
)

// A WAL's view of the node's oracle scopes its requests to its PChannel
// and term, and a fenced refusal comes back at once, not retried.
func TestWALOracleIsScopedAndNotRetriedWhenFenced(t *testing.T) {
	srv := embedded.StartTest(t)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	const cluster streamwal.Cluster = "nt"
	subject := cluster.CoordSubject(streamwal.CoordTSO)
	var mu sync.Mutex
	var got []wire.TSORequest
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		var req wire.TSORequest
		if err := wire.Decode(m.Data, &req); err != nil {
			_ = wire.Respond(m, nil, err)
			return
		}
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		if req.Term < 2 {
			_ = wire.Respond(m, nil, streamwal.Errorf(streamwal.CodeFenced, "%s under term %d: superseded by term 2", req.PChannel, req.Term))
			return
		}
		_ = wire.Respond(m, wire.TSOReply{First: 100}, nil)
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())

	p, err := streamwal.NewPChannel("p", 3)
	require.NoError(t, err)
	o := &remoteOracle{nc: nc, subject: subject}
	ctx := context.Background()
	_, err = o.For(p, 1).Allocate(ctx, 16)
	require.ErrorIs(t, err, streamwal.ErrFenced)
	first, err := o.For(p, 2).Allocate(ctx, 16)
	require.NoError(t, err)
	require.EqualValues(t, 100, first)

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []wire.TSORequest{{Count: 16, PChannel: p, Term: 1}, {Count: 16, PChannel: p, Term: 2}}, got)
}
