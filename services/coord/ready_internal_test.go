package coord

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReadyNeedsAnAnsweredLeaseRound: a coordinator that is not active is
// ready only while its lease rounds are answered.
func TestReadyNeedsAnAnsweredLeaseRound(t *testing.T) {
	c := &Coordinator{cfg: Config{ID: "c1", LeaseTTL: time.Second}}
	require.ErrorIs(t, c.Ready(), ErrNotReady, "never answered")
	c.noteAnswered(nil)
	require.NoError(t, c.Ready())
	c.answered.Store(time.Now().Add(-2 * time.Second).UnixNano())
	require.ErrorIs(t, c.Ready(), ErrNotReady, "unanswered for longer than the lease")
}
