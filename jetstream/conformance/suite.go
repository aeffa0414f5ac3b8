package conformance

import (
	"os"
	"strconv"
	"testing"
)

// DefaultFenceIterations is how many rounds the fencing test runs unless
// the harness or STREAMWAL_FENCE_ITERATIONS says otherwise.
const DefaultFenceIterations = 30

// DefaultParallelMessages is how many messages the appenders of one
// PChannel write under each term in ParallelAppendRead unless the harness
// says otherwise.
const DefaultParallelMessages = 1200

// FenceIterationsEnv overrides Harness.FenceIterations (to raise the
// rounds of the fencing test in a long run).
const FenceIterationsEnv = "STREAMWAL_FENCE_ITERATIONS"

// Run runs the conformance suite against the backends h makes. Every check
// is a subtest:
//
//   - ParallelAppendRead: three PChannels in parallel, three terms each,
//     concurrent single- and multi-message appenders and two scanners from
//     Earliest: strictly increasing IDs, read set = acknowledged set (each
//     once, at its MessageID, with its message ID), appends contiguous, one
//     barrier per term matching Writer.Barrier.
//   - StartPositions: Earliest, Latest, From, After, From below the first
//     message after truncation.
//   - Filters: VChannel and PChannel-level filters.
//   - HeadersOnly: every message in order with its properties and payload
//     size, the types asked for whole with their payloads, filtered too,
//     across the archive after a truncation.
//   - TruncateReopen: truncation keeps the newest barrier, reopening under
//     a higher term works, the old writer is fenced, State reports what is
//     kept.
//   - IdempotentRetry: an append repeated with stored message IDs writes
//     nothing and answers the original MessageIDs.
//   - Fencing: a writer under load is fenced by a newer one opened from
//     another connection: nothing of the old term lands after the new
//     barrier, acknowledged appends are there, fenced ones are not.
//   - Faults: appenders with idempotent retries while the harness restarts
//     the server or drops connections: no acknowledged append lost or
//     duplicated.
//   - BadArguments: every invalid call fails with a typed error and writes
//     nothing.
//   - Lifecycle: Close and context cancellation stop blocked scanners
//     promptly; writers resolve queued appends on Close; a closed backend
//     refuses new work.
//   - Archive (only with Harness.Archive): after rounds of appends,
//     truncations and reopens under higher terms, Earliest delivers every
//     message ever appended, once, in order, filtered too; reads from
//     inside the archive and at its end continue on the stream without a
//     gap or a repeat, also while truncations move that end; State reports
//     the truncation; Get reaches archived messages.
//
// With Harness.Archive, the checks that truncate expect the truncated
// messages to be read back instead of skipped.
func Run(t *testing.T, h Harness) {
	if h.New == nil || h.Codec == nil {
		t.Fatal("conformance: the harness needs New and Codec")
	}
	if n, err := strconv.Atoi(os.Getenv(FenceIterationsEnv)); err == nil && n > 0 {
		h.FenceIterations = n
	}
	if h.FenceIterations <= 0 {
		h.FenceIterations = DefaultFenceIterations
	}
	if h.ParallelMessages <= 0 {
		h.ParallelMessages = DefaultParallelMessages
	}
	e := &env{h: h, codec: h.Codec}
	t.Run("ParallelAppendRead", e.testParallelAppendRead)
	t.Run("StartPositions", e.testStartPositions)
	t.Run("Filters", e.testFilters)
	t.Run("HeadersOnly", e.testHeadersOnly)
	t.Run("TruncateReopen", e.testTruncateReopen)
	t.Run("IdempotentRetry", e.testIdempotentRetry)
	t.Run("Fencing", e.testFencing)
	t.Run("Faults", func(t *testing.T) {
		t.Run("RestartServer", func(t *testing.T) {
			if h.RestartServer == nil {
				t.Skip("the harness cannot restart the server")
			}
			e.testFaults(t, faultRestart)
		})
		t.Run("DropConnections", func(t *testing.T) {
			if h.DropConnections == nil {
				t.Skip("the harness cannot drop connections")
			}
			e.testFaults(t, faultDrop)
		})
	})
	t.Run("BadArguments", e.testBadArguments)
	t.Run("Lifecycle", e.testLifecycle)
	t.Run("Archive", e.testArchive)
}
