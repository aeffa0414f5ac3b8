package embedded_test

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
)

// newUser is a fresh nkey user: its public key and the connection option
// that authenticates as it.
func newUser(t *testing.T) (string, nats.Option) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	return pub, nats.Nkey(pub, kp.Sign)
}

// jszPing is the part of a server's answer to the system request
// streamwal.ServerJSZPing the tests look at.
type jszPing struct {
	Data *struct {
		Streams  int `json:"streams"`
		Messages int `json:"messages"`
	} `json:"data"`
	Error *struct {
		Description string `json:"description"`
	} `json:"error"`
}

// pingJSZ makes the request `nats server report jetstream` makes, as the
// connection's user, and returns the answer.
func pingJSZ(t *testing.T, nc *nats.Conn) jszPing {
	t.Helper()
	msg, err := nc.Request(streamwal.ServerJSZPing, []byte(`{}`), waitFor)
	require.NoError(t, err, "the system request gets no answer")
	var r jszPing
	require.NoError(t, json.Unmarshal(msg.Data, &r), "%s", msg.Data)
	require.Nil(t, r.Error, "%s", msg.Data)
	require.NotNil(t, r.Data, "%s", msg.Data)
	return r
}

// A store written by a server without a system user is served by one
// with it: clients without credentials still find the stream and append
// to it (in the global account), the system user's JSZ request is
// answered with that stream, across a restart; a key that is no user is
// refused.
func TestSystemUserKeepsTheGlobalAccountsStore(t *testing.T) {
	dir := t.TempDir()
	before, err := embedded.Start(embedded.Options{StoreDir: dir})
	require.NoError(t, err)
	_, js := connectJS(t, before.Connect)
	createStream(t, js, 1)
	publish(t, js, "before")
	before.Shutdown()

	sysKey, asSys := newUser(t)
	srv, err := embedded.Start(embedded.Options{StoreDir: dir, SystemUser: sysKey})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	for i := range 2 {
		nc, js := connectJS(t, srv.Connect)
		require.Equal(t, uint64(2+i), publish(t, js, "after"), "the anonymous client appends after the old messages")
		nc.Close()

		sys, err := srv.Connect(asSys)
		require.NoError(t, err)
		r := pingJSZ(t, sys)
		assert.Equal(t, 1, r.Data.Streams)
		sys.Close()
		require.NoError(t, srv.Restart())
	}
	_, asStranger := newUser(t)
	_, err = srv.Connect(asStranger, nats.NoReconnect())
	require.ErrorIs(t, err, nats.ErrAuthorization, "a key that is no user is refused")
}

// With users, the system user is one more: clients without credentials
// are refused, the users keep their permissions and JetStream, and only
// the system user's system request is answered.
func TestSystemUserBesideUsers(t *testing.T) {
	userKey, asUser := newUser(t)
	sysKey, asSys := newUser(t)
	srv := embedded.StartTest(t, func(o *embedded.Options) {
		o.Users = []*server.NkeyUser{{Nkey: userKey}}
		o.SystemUser = sysKey
	})
	_, err := srv.Connect(nats.NoReconnect())
	require.ErrorIs(t, err, nats.ErrAuthorization, "a client without a key is refused")

	_, js := connectJS(t, func(opts ...nats.Option) (*nats.Conn, error) { return srv.Connect(append(opts, asUser)...) })
	createStream(t, js, 1)
	publish(t, js, "x")
	user, err := srv.Connect(asUser)
	require.NoError(t, err)
	defer user.Close()
	_, err = user.Request(streamwal.ServerJSZPing, []byte(`{}`), waitFor/10)
	require.ErrorIs(t, err, nats.ErrNoResponders, "a user of the global account gets no system answers")

	sys, err := srv.Connect(asSys)
	require.NoError(t, err)
	defer sys.Close()
	assert.Equal(t, 1, pingJSZ(t, sys).Data.Streams)
}

// A system user that is no user key, or that is one of Users too, is
// refused before anything starts.
func TestSystemUserIsValidated(t *testing.T) {
	userKey, _ := newUser(t)
	for name, o := range map[string]embedded.Options{
		"not a key":        {SystemUser: "sys"},
		"an account key":   {SystemUser: accountKey(t)},
		"one of the users": {SystemUser: userKey, Users: []*server.NkeyUser{{Nkey: userKey}}},
	} {
		o.StoreDir = t.TempDir()
		require.ErrorIs(t, o.Validate(), embedded.ErrInvalidOptions, name)
		_, err := embedded.Start(o)
		require.ErrorIs(t, err, embedded.ErrInvalidOptions, name)
	}
}
