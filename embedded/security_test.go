package embedded_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/embedded"
)

// Users and TLS settings a server cannot use are invalid options, refused
// before anything starts.
func TestSecurityOptionsAreValidated(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	for name, o := range map[string]embedded.Options{
		"tls without files":  {TLS: &embedded.TLS{}},
		"tls missing files":  {TLS: &embedded.TLS{CertFile: missing, KeyFile: missing}},
		"verify without ca":  {TLS: &embedded.TLS{CertFile: missing, KeyFile: missing, Verify: true}},
		"nil user":           {Users: []*server.NkeyUser{nil}},
		"not an nkey user":   {Users: []*server.NkeyUser{{Nkey: "alice"}}},
		"an account not one": {Users: []*server.NkeyUser{{Nkey: accountKey(t)}}},
	} {
		o.StoreDir = dir
		require.ErrorIs(t, o.Validate(), embedded.ErrInvalidOptions, name)
		_, err := embedded.Start(o)
		require.ErrorIs(t, err, embedded.ErrInvalidOptions, name)
	}
}

// accountKey is a valid nkey that is no user's.
func accountKey(t *testing.T) string {
	kp, err := nkeys.CreateAccount()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	return pub
}

// A server with users accepts only them, across a restart, each with its
// permissions.
func TestUsersAreTheOnlyClients(t *testing.T) {
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	perms := &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{"allowed"}}}
	srv := embedded.StartTest(t, func(o *embedded.Options) {
		o.Users = []*server.NkeyUser{{Nkey: pub, Permissions: perms}}
	})
	as := nats.Nkey(pub, kp.Sign)
	for range 2 {
		_, err = srv.Connect(nats.NoReconnect())
		require.ErrorIs(t, err, nats.ErrAuthorization, "a client without a key is refused")
		nc, err := srv.Connect(as)
		require.NoError(t, err)
		errs := make(chan error, 1)
		nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
		require.NoError(t, nc.Publish("denied", nil))
		select {
		case err := <-errs:
			require.ErrorIs(t, err, nats.ErrPermissionViolation)
		case <-time.After(waitFor):
			t.Fatal("no permission violation")
		}
		nc.Close()
		require.NoError(t, srv.Restart())
	}
}
