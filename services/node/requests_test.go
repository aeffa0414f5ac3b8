package node_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/wire"
)

// TestOpenAndCloseRefuseBadNames: an open or a close whose PChannel is
// malformed, or missing, is refused with INVALID_ARGUMENT before anything
// is opened or closed; a close of what the node does not serve is
// answered with an empty envelope, as before the typed handlers.
func TestOpenAndCloseRefuseBadNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const cluster = streamwal.Cluster("requests")
	srv := embedded.StartTest(t)
	nc, err := srv.Connect()
	require.NoError(t, err)
	defer nc.Close()
	js, err := njs.New(nc)
	require.NoError(t, err)
	_, err = coord.Provision(ctx, js, cluster, 1, time.Second)
	require.NoError(t, err)
	codec, err := messages.NewCodec(cluster, nil)
	require.NoError(t, err)
	n, err := node.Start(ctx, node.Config{Conn: nc, Codec: codec, ID: "n1"})
	require.NoError(t, err)
	defer n.Close()

	for _, op := range []streamwal.NodeOp{streamwal.NodeOpen, streamwal.NodeClose} {
		subject := cluster.NodeSubject("n1", op)
		for _, bad := range []string{`[]`, `{"term":1}`, `{"pchannel":"","term":1}`, `{"pchannel":"nope_0","term":1}`, `{"pchannel":"pchan-01","term":1}`, `{"pchannel":7}`} {
			err := wire.Call(ctx, nc, subject, json.RawMessage(bad), nil)
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "%s %s", op, bad)
		}
	}
	_, serves := n.WAL(mustPChannel(t, "pchan-0"))
	require.False(t, serves)

	reply, err := nc.RequestWithContext(ctx, cluster.NodeSubject("n1", streamwal.NodeClose), []byte(`{"pchannel":"pchan-0","term":1}`))
	require.NoError(t, err)
	require.Equal(t, `{}`, string(reply.Data))
}

func mustPChannel(t *testing.T, name string) streamwal.PChannel {
	t.Helper()
	p, err := streamwal.ParsePChannel(name)
	require.NoError(t, err)
	return p
}
