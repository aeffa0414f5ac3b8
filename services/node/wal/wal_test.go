package wal_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
)

func TestAppendAndReadBack(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	create := e.createCollection(w, v, 1)
	require.Greater(t, create.TimeTick(), w.Barrier().TimeTick())

	a, err := w.Append(ctx, e.insert(v, "a"))
	require.NoError(t, err)
	tc, err := w.BeginTxn(ctx, v, 0)
	require.NoError(t, err)
	b, err := w.Append(ctx, e.insert(v, "b", messages.WithTxn(tc)))
	require.NoError(t, err)
	require.LessOrEqual(t, b.LastConfirmed(), messages.MessageID(a.ID()+1), "the open txn's begin bounds LastConfirmed")
	c, err := w.Append(ctx, e.insert(v, "c"))
	require.NoError(t, err)
	commit, err := w.CommitTxn(ctx, v, tc)
	require.NoError(t, err)
	require.Greater(t, commit.TimeTick(), c.TimeTick())

	got := e.readUntil(e.scan(v, read.Earliest()), commit.ID())
	var types []string
	for _, m := range got {
		types = append(types, m.Type().Name)
	}
	require.Equal(t, []string{"CreateCollection", "Insert", "Insert", "Txn"}, types)
	require.Len(t, got[3].TxnBody(), 1)
	require.Equal(t, "b", string(got[3].TxnBody()[0].Payload()))
	for i := 1; i < len(got); i++ {
		require.Greater(t, got[i].TimeTick(), got[i-1].TimeTick())
	}
}
