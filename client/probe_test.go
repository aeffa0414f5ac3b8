package client_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node"
)

// Ping answers for the cluster the server has, and fails at once, naming
// the cluster, the server and the clusters it has, for one it has not
// (within the minute of testCtx, where a wait would end in another error).
func TestPing(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	require.NoError(t, newClient(t, s).Ping(ctx))

	c := newClient(t, s, client.WithCluster("locl"))
	err := c.Ping(ctx)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.Equal(t, fmt.Sprintf(`UNAVAILABLE: no coordinator answers for cluster "locl" on %s: the server has no streamwal cluster of that name (it has "local")`,
		s.Server.ClientURL()), err.Error())
	require.NoError(t, ctx.Err())
}

// MaxPayload is the codec's limit on a server that carries more, and
// what the server's max_payload leaves otherwise; a payload of that size
// is appended, a larger one refused before anything is sent.
func TestMaxPayload(t *testing.T) {
	s := newSystem(t)
	c := newClient(t, s)
	require.Equal(t, c.Codec().MaxPayload(), c.MaxPayload(), "the embedded server carries 8 MiB")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	small, err := system.Start(ctx, system.Options{ServerOptions: embedded.Options{StoreDir: t.TempDir(), MaxPayload: 256 << 10},
		Node: node.Config{SyncInterval: syncInterval}})
	require.NoError(t, err)
	t.Cleanup(small.Close)
	_, err = small.WaitServing(ctx, false)
	require.NoError(t, err)
	sc := newClient(t, small)
	limit := sc.MaxPayload()
	require.Less(t, limit, 256<<10, "the server's max_payload bounds it")
	require.Greater(t, limit, 200<<10, "with little taken for headers and framing")

	_, v := createCollection(t, ctx, sc)
	res, err := sc.Append(ctx, insert(t, sc, v, strings.Repeat("x", limit)))
	require.NoError(t, err, "a payload of MaxPayload bytes")
	require.NotZero(t, res[0].ID)
	m, err := sc.Codec().New(messages.TypeInsert, v, []byte(strings.Repeat("x", limit+16<<10)))
	require.NoError(t, err, "within the codec's limit")
	_, err = sc.Append(ctx, m)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "beyond what a request carries")
}
