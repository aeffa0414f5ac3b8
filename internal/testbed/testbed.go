// Package testbed is the fixture that the tests of the backend, and of
// what is built right on it, share instead of each rebuilding it: one
// embedded NATS server with JetStream (file storage under the test's
// temporary directory, as embedded.StartTest gives it), a connection to
// it, a codec and a jetstream backend on that connection, all closed when
// the test ends, in the reverse order of their start.
//
// A test that needs another shape (a cluster, several connections, a
// server restarted under its clients) takes the parts it needs from a Bed
// and builds the rest itself.
package testbed

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// DefaultCluster is the codec's cluster when a Config names none.
const DefaultCluster streamwal.Cluster = "test"

// Config shapes a Bed; the zero Config is a plain one.
type Config struct {
	// Cluster is the codec's cluster name (DefaultCluster if empty).
	Cluster streamwal.Cluster
	// Backend is the backend's options.
	Backend jetstream.Options
	// Server adjusts the server's options before it starts (see
	// embedded.StartTest).
	Server []func(*embedded.Options)
}

// Bed is a started server with a connection, a codec and a backend.
type Bed struct {
	Server  *embedded.Server
	Conn    *nats.Conn
	Codec   *messages.Codec
	Backend *jetstream.JetStream
}

// Start starts a Bed for t, shaped by cfg, and stops it when t ends. It
// fails t if any part does not start.
func Start(t testing.TB, cfg Config) *Bed {
	t.Helper()
	srv := embedded.StartTest(t, cfg.Server...)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatalf("testbed: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	cluster := cfg.Cluster
	if cluster == "" {
		cluster = DefaultCluster
	}
	codec, err := messages.NewCodec(cluster, nil)
	if err != nil {
		t.Fatalf("testbed: codec of cluster %q: %v", cluster, err)
	}
	be, err := jetstream.New(nc, codec, cfg.Backend)
	if err != nil {
		t.Fatalf("testbed: backend: %v", err)
	}
	t.Cleanup(func() { _ = be.Close() })
	return &Bed{Server: srv, Conn: nc, Codec: codec, Backend: be}
}
