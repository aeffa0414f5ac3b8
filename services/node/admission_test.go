package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node"
)

// TestAdmissionRefusesWhenFull: with the node's admission bound (per
// PChannel, or node-wide) at one byte, a request is admitted only while
// nothing else is being appended; while the backend holds one append, a
// second request and a local append are refused whole, after the
// admission wait, with the retriable streamwal.ErrResourceExhausted and
// write nothing; once the held append lands, appends are admitted again.
func TestAdmissionRefusesWhenFull(t *testing.T) {
	for _, c := range []struct {
		name string
		opts node.AdmissionOptions
	}{
		{"PerPChannel", node.AdmissionOptions{PerPChannel: 1, Wait: 20 * time.Millisecond}},
		{"Total", node.AdmissionOptions{Total: 1, Wait: 20 * time.Millisecond}},
	} {
		t.Run(c.name, func(t *testing.T) { testAdmissionRefusesWhenFull(t, c.opts) })
	}
}

// testAdmissionRefusesWhenFull is one case of TestAdmissionRefusesWhenFull.
func testAdmissionRefusesWhenFull(t *testing.T, opts node.AdmissionOptions) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := startFaultyNode(t, ctx, nil, func(c *node.Config) { c.Admission = opts })
	p := f.serving(ctx)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	require.Nil(t, f.createCollection(ctx, v).Error)

	open, results := f.holdAppend(ctx, t, v)
	_, err = f.request(ctx, p, f.insert(v, "refused"))
	require.ErrorIs(t, err, streamwal.ErrResourceExhausted)
	require.True(t, streamwal.IsRetriableWithID(err))
	_, errs, served := f.node().AppendLocal(ctx, f.sys.Codec.Cluster(), p, []*messages.MutableMessage{f.insert(v, "refused")})
	require.True(t, served)
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], streamwal.ErrResourceExhausted)

	open()
	got := <-results
	require.NoError(t, got.err)
	require.Nil(t, got.reply.Results[0].Error, "the held append landed")
	reply, err := f.request(ctx, p, f.insert(v, "after"))
	require.NoError(t, err, "admitted again once the held append was answered")
	require.Nil(t, reply.Results[0].Error)
	out, errs, _ := f.node().AppendLocal(ctx, f.sys.Codec.Cluster(), p, []*messages.MutableMessage{f.insert(v, "last")})
	require.NoError(t, errs[0])

	sc, err := f.fb.Unwrap().Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	require.NoError(t, err)
	defer func() { require.NoError(t, sc.Close()) }()
	var inserts []string
	for {
		m, err := sc.Next(ctx)
		require.NoError(t, err)
		if m.Type() == messages.TypeInsert {
			inserts = append(inserts, string(m.Payload()))
		}
		if m.ID() >= out[0].ID() {
			break
		}
	}
	require.Equal(t, []string{"held", "after", "last"}, inserts, "nothing refused was written")
}
