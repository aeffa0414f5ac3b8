package jetstream_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/jetstream/conformance"
	"github.com/streamwal/streamwal/messages"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks).
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }

// TestConformance runs the conformance suite against the JetStream backend
// on an embedded file-storage server: once with default options, once with
// group commit on a server that fsyncs every write, once with an archive
// of small objects (so that truncations write several and merge them);
// and on a three-server cluster with every stream at 3 replicas (see
// TestConformanceReplicas). The archive changes nothing a writer does, so
// its run fences in a few rounds only (fence) and its parallel appenders
// write a third of the messages (parallel; for both, 0 is the suite's
// default): what it adds is on the read side, which the fewer messages
// still take through the archive's hand-off under three terms. The runs
// are independent (each has its own server, store directory and
// backends) and mostly wait for the server's acknowledgements, so they
// run in parallel with each other and with TestConformanceReplicas, as
// many at once as go test's -parallel lets (GOMAXPROCS by default).
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		sync     bool
		opts     jetstream.Options
		fence    int
		parallel int
	}{
		{"default", false, jetstream.Options{}, 0, 0},
		{"groupcommit-syncalways", true, jetstream.Options{GroupCommit: true}, 0, 0},
		{"archive", false, jetstream.Options{Archive: true, ArchiveObjectBytes: 2048}, 5, conformance.DefaultParallelMessages / 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := jetStreamHarness(t, c.sync, c.opts)
			h.FenceIterations, h.ParallelMessages = c.fence, c.parallel
			conformance.Run(t, h)
		})
	}
}

// TestConformanceReplicas runs the conformance suite on a three-server
// JetStream cluster with every stream at 3 replicas, with dropped
// connections as its fault. (Stopping and restarting a member under the
// suite's scanner once left that scanner without a message for 50 s on
// a machine loaded far past its cores; until that is understood, the
// member restart is covered by cmd/streamwal's TestClusterProcessesUnderFaults,
// which restarts a server under the whole system.) Its writers are those
// of TestConformance's default run: it fences in a few rounds only, and
// its parallel appenders write a third of the messages. It runs in
// parallel with TestConformance's runs (its own cluster of servers).
func TestConformanceReplicas(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a three-server cluster")
	}
	cl := embedded.StartTestCluster(t)
	h := harness(t, func(opts ...nats.Option) (*nats.Conn, error) { return cl.Connect(opts...) }, jetstream.Options{Replicas: 3})
	h.FenceIterations, h.ParallelMessages = 5, conformance.DefaultParallelMessages/3
	conformance.Run(t, h)
}

// jetStreamHarness starts an embedded server for one run of the suite.
func jetStreamHarness(t *testing.T, syncAlways bool, opts jetstream.Options) conformance.Harness {
	srv := embedded.StartTest(t, func(o *embedded.Options) { o.SyncAlways = syncAlways })
	h := harness(t, srv.Connect, opts)
	h.RestartServer = func(t *testing.T) {
		if err := srv.Restart(); err != nil {
			t.Fatalf("restart: %v", err)
		}
	}
	return h
}

// harness is a harness whose backends connect with dial and opts.
func harness(t *testing.T, dial func(...nats.Option) (*nats.Conn, error), opts jetstream.Options) conformance.Harness {
	codec, err := messages.NewCodec("conformance", nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []*nats.Conn
	connect := func(t *testing.T, opts jetstream.Options) jetstream.Backend {
		t.Helper()
		nc, err := dial(nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0),
			// The faults the suite injects make writes fail on purpose.
			nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		conns = append(conns, nc)
		mu.Unlock()
		t.Cleanup(nc.Close)
		b, err := jetstream.New(nc, codec, opts)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return conformance.Harness{
		New:     func(t *testing.T) jetstream.Backend { return connect(t, opts) },
		Codec:   codec,
		Archive: opts.Archive,
		DropConnections: func(t *testing.T) {
			mu.Lock()
			defer mu.Unlock()
			for _, nc := range conns {
				if !nc.IsClosed() {
					if err := nc.ForceReconnect(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
						t.Errorf("force reconnect: %v", err)
					}
				}
			}
		},
		NewRestricted: func(t *testing.T, allowed []streamwal.PChannel) jetstream.Backend {
			o := opts
			o.PChannels = allowed
			return connect(t, o)
		},
	}
}
