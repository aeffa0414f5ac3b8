package auth

import (
	"errors"
	"os"
	"path/filepath"
	"slices"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/streamwal/streamwal"
)

// ConfName is the base name of the nats-server include Init writes.
const ConfName = "auth.conf"

// Errors of a directory that does not fit (each also matches
// streamwal.ErrInvalidArgument).
var (
	// ErrExists: Init would overwrite a seed or auth.conf.
	ErrExists = errors.New("credentials exist")
	// ErrNotAUser: a seed's public key is no user of auth.conf.
	ErrNotAUser = errors.New("seed is not a user of the configuration")
	// ErrNotCovered: a role's user lacks permissions the spec needs.
	ErrNotCovered = errors.New("permissions do not cover the cluster")
)

// Dir is a directory of credentials as Init writes it: auth.conf and one
// seed file per role.
type Dir string

// Conf is the path of d's auth.conf.
func (d Dir) Conf() string { return filepath.Join(string(d), ConfName) }

// Seed is the path of r's seed file, "<d>/<r>.nk".
func (d Dir) Seed(r Role) string { return filepath.Join(string(d), string(r)+".nk") }

// Option is the NATS connection option that authenticates as r with r's
// seed (read again at every reconnect, never kept in memory).
func (d Dir) Option(r Role) (nats.Option, error) {
	o, err := nats.NkeyOptionFromSeed(d.Seed(r))
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: seed of %s: %w", r, err)
	}
	return o, nil
}

// PublicKey is the public key of r's seed.
func (d Dir) PublicKey(r Role) (string, error) {
	raw, err := os.ReadFile(d.Seed(r))
	if err != nil {
		return "", streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: seed of %s: %w", r, err)
	}
	kp, err := nkeys.ParseDecoratedNKey(raw)
	clear(raw)
	if err != nil {
		return "", streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: seed of %s in %s: %w", r, d.Seed(r), err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return "", streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: %s holds no nkey user seed", d.Seed(r))
	}
	return pub, nil
}

// Users loads the users of d's auth.conf and checks, for each of roles,
// that its seed in d is one of them and that its permissions give it what
// spec needs: a directory written for another cluster, for fewer
// PChannels or by an older streamwal is refused with ErrNotCovered.
func (d Dir) Users(spec Spec, roles ...Role) ([]*server.NkeyUser, error) {
	users, err := LoadUsers(d.Conf())
	if err != nil {
		return nil, err
	}
	for _, r := range roles {
		pub, err := d.PublicKey(r)
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(users, func(u *server.NkeyUser) bool { return u.Nkey == pub })
		if i < 0 {
			return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: %w: %s (%s) in %s", ErrNotAUser, d.Seed(r), pub, d.Conf())
		}
		if err := spec.check(r, users[i].Permissions); err != nil {
			return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: %s in %s: %w", r, d.Conf(), err)
		}
	}
	return users, nil
}
