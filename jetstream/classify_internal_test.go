package jetstream

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
)

// TestClassifyObjectReadTimeout: an object store read whose chunks stop
// arriving times out on its pipe ("read pipe: i/o timeout"); that is a
// busy server, worth a retry, not an internal error.
func TestClassifyObjectReadTimeout(t *testing.T) {
	r, w := net.Pipe()
	defer func() { _ = r.Close(); _ = w.Close() }()
	require.NoError(t, r.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err := r.Read(make([]byte, 1))
	require.Error(t, err)
	got := objectErr("log.p.index", err)
	require.ErrorIs(t, got, streamwal.ErrUnavailable)
	require.True(t, streamwal.IsRetriable(got), "%v", got)
	require.Contains(t, got.Error(), "log.p.index")
}
