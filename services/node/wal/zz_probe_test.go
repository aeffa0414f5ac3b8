package wal_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

func TestZZProbeDup(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w := e.open(1)
	v := e.vchannel(42)
	m, err := e.codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: v.String(), CollectionID: v.CollectionID()},
		VChannels:     []string{v.String()},
	}, messages.WithMsgID("cc-42"))
	require.NoError(t, err)
	r := m.Clone()
	cc, err := w.Append(ctx, m)
	require.NoError(t, err)
	t.Logf("cc=%d", cc.ID())
	x, err := w.Append(ctx, r)
	t.Logf("retry: %v err=%v code=%s werr=%v tail=%d", x, err, streamwal.CodeOf(err), w.Err(), ruleTail(t, e))
	i1, err := w.Append(ctx, e.insert(v, "a", messages.WithMsgID("ins-1")))
	require.NoError(t, err)
	i2, err := w.Append(ctx, e.insert(v, "a", messages.WithMsgID("ins-1")))
	t.Logf("i1=%d dup: %v err=%v werr=%v tail=%d", i1.ID(), i2, err, w.Err(), ruleTail(t, e))
	i3, err := w.Append(ctx, e.insert(v, "b"))
	t.Logf("i3=%v err=%v", i3, err)
	tc, err := w.BeginTxn(ctx, v, 0)
	require.NoError(t, err)
	b1, err := w.Append(ctx, e.insert(v, "a", messages.WithMsgID("ins-1"), messages.WithTxn(tc)))
	t.Logf("dup body: %v err=%v", b1, err)
	_, err = w.CommitTxn(ctx, v, tc)
	t.Logf("commit after dup body: err=%v", err)
	out, err := w.AppendTxn(ctx, v, 0, e.insert(v, "z"), e.insert(v, "a", messages.WithMsgID("ins-1")))
	t.Logf("apptxn dup: %v err=%v werr=%v tail=%d", out, err, w.Err(), ruleTail(t, e))
	i4, err := w.Append(ctx, e.insert(v, "c"))
	t.Logf("i4=%v err=%v", i4, err)
}
