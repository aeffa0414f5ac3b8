package auth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"

	"github.com/streamwal/streamwal"
)

// File modes of what Init writes: the seeds are secrets, auth.conf holds
// public keys only.
const (
	DirMode  fs.FileMode = 0o700
	SeedMode fs.FileMode = 0o600
	ConfMode fs.FileMode = 0o644
)

// Written is what Init wrote: the paths of auth.conf and of each role's
// seed, and each role's public key.
type Written struct {
	Conf       string
	Seeds      map[Role]string
	PublicKeys map[Role]string
}

// Init writes a fresh nkey user per role into d: the seeds (mode 0600)
// and auth.conf with spec's permissions for their public keys, creating d
// (mode 0700) if it is missing. An existing seed or auth.conf is an
// ErrExists error unless force, which replaces them all. On an error
// nothing is left behind: the files are written aside and renamed into
// place together.
func Init(d Dir, spec Spec, force bool) (Written, error) {
	if err := spec.validate(); err != nil {
		return Written{}, err
	}
	w := Written{Conf: d.Conf(), Seeds: map[Role]string{}, PublicKeys: map[Role]string{}}
	if !force {
		if err := refuseExisting(d); err != nil {
			return Written{}, err
		}
	}
	created, err := makeDir(string(d))
	if err != nil {
		return Written{}, err
	}
	staged, err := stage(d, spec, &w)
	if err == nil {
		err = commit(staged)
	}
	if err != nil {
		for tmp := range staged {
			_ = os.Remove(tmp)
		}
		if created {
			_ = os.Remove(string(d))
		}
		return Written{}, err
	}
	return w, nil
}

// validate refuses a spec without a valid cluster or PChannels.
func (s Spec) validate() error {
	if _, err := streamwal.ParseCluster(string(s.Cluster)); err != nil {
		return err
	}
	if len(s.PChannels) == 0 {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: cluster %s needs at least one PChannel", s.Cluster)
	}
	return nil
}

// refuseExisting fails if any file Init writes exists in d.
func refuseExisting(d Dir) error {
	paths := []string{d.Conf()}
	for _, r := range Roles {
		paths = append(paths, d.Seed(r))
	}
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: %w: %s (use --force to replace every credential in %s)", ErrExists, p, d)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: %w", err)
		}
	}
	return nil
}

// makeDir creates dir with DirMode unless it exists; created says it did.
func makeDir(dir string) (created bool, err error) {
	info, err := os.Stat(dir)
	switch {
	case err == nil && !info.IsDir():
		return false, streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: %s is not a directory", dir)
	case err == nil:
		return false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return false, streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: %w", err)
	}
	if err := os.MkdirAll(dir, DirMode); err != nil {
		return false, streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: %w", err)
	}
	return true, nil
}

// stage writes every seed and auth.conf to temporary files in d and
// returns them, temporary path to final path; w gets the final paths and
// the public keys.
func stage(d Dir, spec Spec, w *Written) (map[string]string, error) {
	staged := map[string]string{}
	for _, r := range Roles {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return staged, fmt.Errorf("auth: create nkey of %s: %w", r, err)
		}
		pub, seed, err := keyOf(kp)
		if err != nil {
			return staged, fmt.Errorf("auth: nkey of %s: %w", r, err)
		}
		tmp, err := writeTemp(string(d), seed, SeedMode)
		clear(seed)
		if err != nil {
			return staged, err
		}
		staged[tmp] = d.Seed(r)
		w.Seeds[r], w.PublicKeys[r] = d.Seed(r), pub
	}
	conf, err := spec.Conf(w.PublicKeys)
	if err != nil {
		return staged, err
	}
	tmp, err := writeTemp(string(d), conf, ConfMode)
	if err != nil {
		return staged, err
	}
	staged[tmp] = d.Conf()
	return staged, nil
}

// keyOf returns kp's public key and a copy of its seed (with a final
// newline), and wipes kp.
func keyOf(kp nkeys.KeyPair) (string, []byte, error) {
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return "", nil, err
	}
	seed, err := kp.Seed() // kp's own memory, which Wipe clears
	return pub, append(append([]byte(nil), seed...), '\n'), err
}

// NewSeedFile writes the seed of a new nkey user to path (mode SeedMode),
// whole or not at all (a synced temporary file beside it, renamed), and
// returns the seed. It replaces a file at path.
func NewSeedFile(path string) ([]byte, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	_, seed, err := keyOf(kp)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	tmp, err := writeTemp(filepath.Dir(path), seed, SeedMode)
	if err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("auth: %w", err)
	}
	return seed, nil
}

// writeTemp writes data to a new temporary file in dir with mode and
// syncs it.
func writeTemp(dir string, data []byte, mode fs.FileMode) (string, error) {
	f, err := os.CreateTemp(dir, ".auth-*")
	if err != nil {
		return "", fmt.Errorf("auth: %w", err)
	}
	err = f.Chmod(mode)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", fmt.Errorf("auth: write %s: %w", filepath.Join(dir, filepath.Base(f.Name())), err)
	}
	return f.Name(), nil
}

// commit renames every staged file into place.
func commit(staged map[string]string) error {
	for tmp, final := range staged {
		if err := os.Rename(tmp, final); err != nil {
			return fmt.Errorf("auth: %w", err)
		}
	}
	return nil
}
