package read_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines. The ignored ones are the embedded
// nats-server's own (see jetstream's TestMain).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*msgBlock).flushLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	)
}
