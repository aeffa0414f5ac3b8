package system_test

import (
	"testing"

	"github.com/streamwal/streamwal/embedded"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks).
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }
