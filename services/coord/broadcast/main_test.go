package broadcast_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: every
// broadcaster is closed, and Close stops everything it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
