package client_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// TestAppendAsync: many appends in flight from one caller all land, each
// at its own MessageID; a bad message fails its future, not the others.
func TestAppendAsync(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		s := newSystem(t)
		ctx := testCtx(t)
		c := newClient(t, s, m.opts...)
		_, v := createCollection(t, ctx, c)
		var futures []*client.AppendFuture
		for i := range 200 {
			futures = append(futures, c.AppendAsync(ctx, insert(t, c, v, "async", messages.WithProperty("i", string(rune('a'+i%26))))))
		}
		bad := c.AppendAsync(ctx, nil)
		seen := map[messages.MessageID]bool{}
		for _, f := range futures {
			res, err := f.Wait()
			require.NoError(t, err)
			require.Len(t, res, 1)
			require.False(t, seen[res[0].ID], "message id %d twice", res[0].ID)
			seen[res[0].ID] = true
		}
		_, err := bad.Wait()
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	})
}
