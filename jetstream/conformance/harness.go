// Package conformance is the test suite every WAL backend must pass, in the
// style of Watermill's universal pub/sub tests: a backend supplies a
// [Harness] and calls [Run] from its own tests. The suite checks the
// invariants of DESIGN.md §4 under concurrency and faults: MessageIDs
// strictly increase on every scanner, the set read equals the set
// acknowledged (each exactly once), start positions behave as defined,
// truncation keeps the log usable, a fenced writer lands nothing after its
// successor's barrier, and injected failures neither lose nor duplicate an
// acknowledged append. With an archive, truncation loses nothing: every
// message ever appended stays readable, once, in order.
package conformance

import (
	"testing"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// Harness is what a backend gives the suite.
type Harness struct {
	// New returns a fresh backend with its own connection. The suite closes
	// it. Backends made by New share one store, so tests use distinct
	// PChannels.
	New func(t *testing.T) jetstream.Backend
	// Codec is the codec the backends use.
	Codec *messages.Codec
	// RestartServer stops and restarts the store (for JetStream: the
	// nats-server, keeping its data); nil if the backend has no server.
	RestartServer func(t *testing.T)
	// DropConnections drops the network connections of every backend made
	// by New, which then reconnect; nil if not applicable.
	DropConnections func(t *testing.T)
	// FenceIterations is how many rounds the fencing test runs (default 30).
	FenceIterations int
	// ParallelMessages is how many messages the appenders of one PChannel
	// write under each term in ParallelAppendRead (default
	// DefaultParallelMessages): a run whose backend writes as another run
	// of the same writer does may write fewer.
	ParallelMessages int
	// Archive says that the backends keep what Truncate removes readable
	// (for JetStream: Options.Archive): a read from below the truncation
	// point delivers the truncated messages first, and the Archive checks
	// run.
	Archive bool
	// NewRestricted, if set, returns a fresh backend like New that serves
	// only the allowed PChannels (for JetStream: Options.PChannels); nil
	// skips the checks that need it.
	NewRestricted func(t *testing.T, allowed []streamwal.PChannel) jetstream.Backend
}
