package jetstream_test

import (
	"context"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/internal/testbed"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// TestScannerResumesAfterItsConsumerStalls: a scanner whose consumer
// stays silent while the stream grows (here paused on the server, as one
// of a replicated stream was seen to stall) starts it again after the
// last message it delivered, and reads on with no gap and no repeat;
// so does one whose filters let through only one VChannel's messages.
func TestScannerResumesAfterItsConsumerStalls(t *testing.T) {
	// Each waits out the scanner's first stall bound: side by side.
	t.Run("whole", func(t *testing.T) { t.Parallel(); testScannerResumes(t, false) })
	t.Run("filtered", func(t *testing.T) { t.Parallel(); testScannerResumes(t, true) })
}

// testScannerResumes is TestScannerResumesAfterItsConsumerStalls with or
// without a VChannel filter.
func testScannerResumes(t *testing.T, filtered bool) {
	tb := testbed.Start(t, testbed.Config{Cluster: "c1"})
	b, codec := tb.Backend, tb.Codec
	p, _ := streamwal.NewPChannel("pchan", 0)
	v, _ := p.VChannel(1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	w, err := b.OpenWriter(ctx, p, 1)
	require.NoError(t, err)
	var ids []messages.MessageID
	appendN := func(n int) {
		for range n {
			m, err := codec.New(messages.TypeInsert, v, []byte("x"))
			require.NoError(t, err)
			got, err := w.Append(ctx, m)
			require.NoError(t, err)
			ids = append(ids, got...)
		}
	}
	appendN(5)
	opts := jetstream.ReadOptions{Start: jetstream.Earliest()}
	if filtered {
		opts.Filters = codec.Cluster().VChannelFilter(v)
	}
	sc, err := b.Read(ctx, p, opts)
	require.NoError(t, err)
	defer sc.Close()
	var read []messages.MessageID
	for len(read) < 3 {
		m, err := sc.Next(ctx)
		require.NoError(t, err)
		if m.Type() == messages.TypeInsert {
			read = append(read, m.ID())
		}
	}

	// Pause every consumer of the stream: the scanner's goes silent.
	js, err := njs.New(tb.Conn)
	require.NoError(t, err)
	stream := codec.Cluster().StreamName(p)
	str, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	names := str.ConsumerNames(ctx)
	paused := 0
	for name := range names.Name() {
		_, err := js.PauseConsumer(ctx, stream, name, time.Now().Add(time.Hour))
		require.NoError(t, err)
		paused++
	}
	require.NoError(t, names.Err())
	require.Positive(t, paused)
	appendN(5)

	for len(read) < len(ids) {
		m, err := sc.Next(ctx)
		require.NoError(t, err, "read %d of %d", len(read), len(ids))
		if m.Type() == messages.TypeInsert {
			read = append(read, m.ID())
		}
	}
	require.Equal(t, ids, read)
}
