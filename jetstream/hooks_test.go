package jetstream_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/internal/testbed"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
)

// unitCounter is a telemetry.UnitHook that adds up what it is told.
type unitCounter struct {
	mu                   sync.Mutex
	units, batches, msgs uint64
	pchannels            map[streamwal.PChannel]bool
}

func (c *unitCounter) OnUnit(e telemetry.UnitEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.units++
	c.msgs += uint64(e.Messages)
	if e.Batch {
		c.batches++
	}
	c.pchannels[e.PChannel] = true
}

// TestWriterHooksFeedUnits: the writer's units reach its backend's hooks,
// exactly as its Stats count them.
func TestWriterHooksFeedUnits(t *testing.T) {
	hook := &unitCounter{pchannels: map[streamwal.PChannel]bool{}}
	tb := testbed.Start(t, testbed.Config{Cluster: "c1", Backend: jetstream.Options{Hooks: telemetry.Hooks{hook}}})
	b, codec := tb.Backend, tb.Codec
	p, _ := streamwal.NewPChannel("pchan", 0)
	v, _ := p.VChannel(1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := b.OpenWriter(ctx, p, 1)
	require.NoError(t, err)
	defer w.Close()
	msg := func() *messages.MutableMessage {
		m, err := codec.New(messages.TypeInsert, v, []byte("x"))
		require.NoError(t, err)
		return m
	}
	for range 5 {
		_, err := w.Append(ctx, msg())
		require.NoError(t, err)
	}
	_, err = w.Append(ctx, msg(), msg(), msg())
	require.NoError(t, err)
	st := w.Stats()
	hook.mu.Lock()
	defer hook.mu.Unlock()
	require.Equal(t, st.Units, hook.units)
	require.Equal(t, st.Batches, hook.batches)
	require.Equal(t, st.Messages, hook.msgs)
	require.GreaterOrEqual(t, hook.msgs, uint64(8), "8 messages were appended")
	require.GreaterOrEqual(t, hook.batches, uint64(1), "the 3-message append is an atomic batch")
	require.Equal(t, map[streamwal.PChannel]bool{p: true}, hook.pchannels)
}
