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
)

func TestSmokeAppendRead(t *testing.T) {
	tb := testbed.Start(t, testbed.Config{Cluster: "c1"})
	b, codec := tb.Backend, tb.Codec
	p, _ := streamwal.NewPChannel("pchan", 0)
	v, _ := p.VChannel(1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := b.OpenWriter(ctx, p, 1)
	require.NoError(t, err)
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[messages.MessageID]bool{}
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				m, err := codec.New(messages.TypeInsert, v, []byte("x"))
				require.NoError(t, err)
				ids, err := w.Append(ctx, m)
				require.NoError(t, err)
				mu.Lock()
				require.False(t, seen[ids[0]])
				seen[ids[0]] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("appends took %v", time.Since(start))
	start = time.Now()
	require.Len(t, seen, 3200)
	sc, err := b.Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	require.NoError(t, err)
	n := 0
	var last messages.MessageID
	for m, err := range sc.All(ctx) {
		require.NoError(t, err)
		require.Greater(t, m.ID(), last)
		last = m.ID()
		if m.Type() == messages.TypeInsert {
			require.True(t, seen[m.ID()])
			n++
		}
		if n == 3200 {
			break
		}
	}
	require.NoError(t, sc.Close())
	t.Logf("read took %v", time.Since(start))
	start = time.Now()
	w2, err := b.OpenWriter(ctx, p, 2)
	require.NoError(t, err)
	m, _ := codec.New(messages.TypeInsert, v, []byte("y"))
	_, err = w.Append(ctx, m)
	require.ErrorIs(t, err, streamwal.ErrFenced)
	<-w.Done()
	t.Logf("fence took %v", time.Since(start))
	_, err = w2.Append(ctx, m)
	require.NoError(t, err)
	require.NoError(t, w2.Close())
	require.NoError(t, w.Close())
}
