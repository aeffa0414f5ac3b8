package client_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
)

// TestConnectAppliesNATSOptions checks that Connect opens its connection
// with the options WithNATSOptions gives, after its own defaults: the
// server sees the connection under the name given, not the default one.
func TestConnectAppliesNATSOptions(t *testing.T) {
	srv := embedded.StartTest(t)
	c, err := client.Connect(srv.ClientURL(), client.WithNATSOptions(nats.Name("named-by-test")))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	connz, err := srv.NATSServer().Connz(&server.ConnzOptions{})
	require.NoError(t, err)
	var names []string
	for _, ci := range connz.Conns {
		names = append(names, ci.Name)
	}
	require.Contains(t, names, "named-by-test")
	require.NotContains(t, names, "streamwal-client")
}

// TestConnectFailsOnABadNATSOption checks that an option the connection
// cannot apply (credentials from a file that does not exist) fails
// Connect with an error that names the cause.
func TestConnectFailsOnABadNATSOption(t *testing.T) {
	srv := embedded.StartTest(t)
	missing := filepath.Join(t.TempDir(), "missing.creds")
	_, err := client.Connect(srv.ClientURL(), client.WithNATSOptions(nats.UserCredentials(missing)))
	require.Error(t, err)
	require.True(t, errors.Is(err, streamwal.ErrUnavailable), "%v", err)
	require.Contains(t, err.Error(), "missing.creds")
}
