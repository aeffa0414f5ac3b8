package testbed_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/internal/testbed"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks):
// a Bed stops everything it started.
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }

// TestStartServesAppends: a plain Bed's backend takes an append on its
// connection and finds it again.
func TestStartServesAppends(t *testing.T) {
	b := testbed.Start(t, testbed.Config{})
	require.Equal(t, testbed.DefaultCluster, b.Codec.Cluster())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := streamwal.NewPChannel("pchan", 0)
	require.NoError(t, err)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	w, err := b.Backend.OpenWriter(ctx, p, 1)
	require.NoError(t, err)
	m, err := b.Codec.New(messages.TypeInsert, v, []byte("x"))
	require.NoError(t, err)
	ids, err := w.Append(ctx, m)
	require.NoError(t, err)
	last, err := b.Backend.Last(ctx, p)
	require.NoError(t, err)
	require.Equal(t, ids[len(ids)-1], last)
	require.True(t, b.Conn.IsConnected())
}

// TestStartShapedByConfig: the cluster name, the backend's options and
// the server's adjustments reach their parts.
func TestStartShapedByConfig(t *testing.T) {
	var adjusted bool
	b := testbed.Start(t, testbed.Config{
		Cluster: "shaped",
		Backend: jetstream.Options{Archive: true},
		Server:  []func(*embedded.Options){func(*embedded.Options) { adjusted = true }},
	})
	require.Equal(t, "shaped", b.Codec.Cluster().String())
	require.True(t, b.Backend.Options().Archive)
	require.True(t, adjusted)
}

// TestStartRefusesABadCluster: a cluster name the codec refuses fails
// the test that asked for it.
func TestStartRefusesABadCluster(t *testing.T) {
	ft := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testbed.Start(ft, testbed.Config{Cluster: "not a name"})
	}()
	<-done
	require.Contains(t, ft.fatal, "not a name")
}

// fatalT records a Fatalf and ends its goroutine, as testing.T does.
type fatalT struct {
	testing.TB
	fatal string
}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
