package auth_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/auth"
)

// spec is a small spec of cluster c.
func spec(t *testing.T, c streamwal.Cluster, pchannels int) auth.Spec {
	t.Helper()
	s, err := auth.NewSpec(c, "pchan", pchannels)
	require.NoError(t, err)
	return s
}

// Init writes a seed per role (0600) in a new 0700 directory and an
// auth.conf that nats-server's own parser reads back as exactly the
// permissions the spec derives, one user per seed.
func TestInitWritesWhatTheServerReads(t *testing.T) {
	d := auth.Dir(filepath.Join(t.TempDir(), "creds"))
	s := spec(t, "local", 4)
	w, err := auth.Init(d, s, false)
	require.NoError(t, err)
	require.Equal(t, d.Conf(), w.Conf)

	info, err := os.Stat(string(d))
	require.NoError(t, err)
	require.Equal(t, auth.DirMode, info.Mode().Perm())
	users, err := auth.LoadUsers(d.Conf())
	require.NoError(t, err)
	require.Len(t, users, len(auth.Roles))
	for _, r := range auth.Roles {
		require.Equal(t, d.Seed(r), w.Seeds[r])
		info, err := os.Stat(d.Seed(r))
		require.NoError(t, err)
		require.Equal(t, auth.SeedMode, info.Mode().Perm(), r)
		pub, err := d.PublicKey(r)
		require.NoError(t, err)
		require.Equal(t, w.PublicKeys[r], pub)
		require.True(t, nkeys.IsValidPublicUserKey(pub))

		u := userOf(t, users, pub)
		want, err := s.Permissions(r)
		require.NoError(t, err)
		require.Equal(t, want.Publish.Allow, u.Permissions.Publish.Allow, r)
		require.Equal(t, want.Subscribe.Allow, u.Permissions.Subscribe.Allow, r)
		require.Empty(t, u.Permissions.Publish.Deny, r)
		if want.Response == nil {
			require.Nil(t, u.Permissions.Response, r)
		} else {
			require.Equal(t, *want.Response, *u.Permissions.Response, r)
		}
	}
	_, err = d.Users(s, auth.Roles...)
	require.NoError(t, err)
}

// userOf is the user of pub in users.
func userOf(t *testing.T, users []*server.NkeyUser, pub string) *server.NkeyUser {
	t.Helper()
	for _, u := range users {
		if u.Nkey == pub {
			return u
		}
	}
	t.Fatalf("no user %s", pub)
	return nil
}

// A second Init refuses to replace credentials and leaves them as they
// are; --force replaces every one of them.
func TestInitRefusesToOverwrite(t *testing.T) {
	d := auth.Dir(t.TempDir())
	s := spec(t, "local", 2)
	first, err := auth.Init(d, s, false)
	require.NoError(t, err)
	before := readAll(t, d)

	_, err = auth.Init(d, s, false)
	require.ErrorIs(t, err, auth.ErrExists)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Equal(t, before, readAll(t, d), "a refused Init changes nothing")

	// One file is enough to refuse.
	require.NoError(t, os.Remove(d.Conf()))
	_, err = auth.Init(d, s, false)
	require.ErrorIs(t, err, auth.ErrExists)

	again, err := auth.Init(d, s, true)
	require.NoError(t, err)
	for _, r := range auth.Roles {
		require.NotEqual(t, first.PublicKeys[r], again.PublicKeys[r], r)
	}
	entries, err := os.ReadDir(string(d))
	require.NoError(t, err)
	require.Len(t, entries, len(auth.Roles)+1, "no temporary file left behind")
}

// readAll reads every file of d by name.
func readAll(t *testing.T, d auth.Dir) map[string]string {
	t.Helper()
	out := map[string]string{}
	entries, err := os.ReadDir(string(d))
	require.NoError(t, err)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(string(d), e.Name()))
		require.NoError(t, err)
		out[e.Name()] = string(data)
	}
	return out
}

// Bad input is an invalid argument and creates nothing.
func TestInitRefusesBadInput(t *testing.T) {
	base := t.TempDir()
	d := auth.Dir(filepath.Join(base, "creds"))
	_, err := auth.Init(d, auth.Spec{Cluster: "bad name"}, false)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, err = auth.Init(d, auth.Spec{Cluster: "local"}, false)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, err = os.Stat(string(d))
	require.True(t, errors.Is(err, os.ErrNotExist), "nothing created: %v", err)

	file := filepath.Join(base, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	_, err = auth.Init(auth.Dir(file), spec(t, "local", 1), false)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)

	_, err = auth.NewSpec("local", "pchan", 0)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, err = auth.ParseRole("root")
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	r, err := auth.ParseRole("client")
	require.NoError(t, err)
	require.Equal(t, auth.RoleClient, r)
	_, err = spec(t, "local", 1).Permissions("root")
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, err = spec(t, "local", 1).Conf(map[auth.Role]string{auth.RoleCoordinator: "not a key"})
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

// Users refuses a directory that does not fit the cluster a server is
// about to serve: another cluster, more PChannels, a seed that is no user
// of auth.conf.
func TestUsersChecksTheDirectoryFitsTheCluster(t *testing.T) {
	d := auth.Dir(t.TempDir())
	s := spec(t, "local", 4)
	_, err := auth.Init(d, s, false)
	require.NoError(t, err)

	_, err = d.Users(spec(t, "other", 4), auth.RoleNode)
	require.ErrorIs(t, err, auth.ErrNotCovered)
	_, err = d.Users(spec(t, "local", 5), auth.RoleNode)
	require.ErrorIs(t, err, auth.ErrNotCovered)
	_, err = d.Users(spec(t, "local", 3), auth.RoleNode, auth.RoleCoordinator, auth.RoleClient)
	require.NoError(t, err, "fewer PChannels are covered")

	other := auth.Dir(t.TempDir())
	_, err = auth.Init(other, s, false)
	require.NoError(t, err)
	seed, err := os.ReadFile(other.Seed(auth.RoleClient))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(d.Seed(auth.RoleClient), seed, auth.SeedMode))
	_, err = d.Users(s, auth.RoleClient)
	require.ErrorIs(t, err, auth.ErrNotAUser)

	require.NoError(t, os.WriteFile(d.Seed(auth.RoleNode), []byte("not a seed\n"), auth.SeedMode))
	_, err = d.Users(s, auth.RoleNode)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, err = d.Option(auth.RoleNode)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)

	require.NoError(t, os.WriteFile(d.Conf(), []byte("authorization { users = [ { nkey: "), 0o600))
	_, err = auth.LoadUsers(d.Conf())
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

// TestNewSeedFile: NewSeedFile writes a user seed the nkeys parser takes,
// with mode SeedMode, returns what it wrote, replaces a file at the path,
// and leaves no temporary file behind.
func TestNewSeedFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sys.nk")
	first, err := auth.NewSeedFile(path)
	require.NoError(t, err)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, first, got)
	kp, err := nkeys.FromSeed(bytes.TrimSpace(got))
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	require.True(t, nkeys.IsValidPublicUserKey(pub))
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, auth.SeedMode, info.Mode().Perm())
	second, err := auth.NewSeedFile(path)
	require.NoError(t, err)
	require.NotEqual(t, first, second)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file is left")
	_, err = auth.NewSeedFile(filepath.Join(dir, "missing", "x.nk"))
	require.Error(t, err)
}
