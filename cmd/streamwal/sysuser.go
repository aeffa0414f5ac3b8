package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"

	"github.com/streamwal/streamwal/auth"
)

// sysSeedFile is the file of a data directory that keeps the seed of the
// embedded server's system-account user: the user `nats server ...`
// commands (nats-server's own $SYS requests) connect as.
const sysSeedFile = "sys.nk"

// sysSeedMode is the mode of the system user's seed: a secret's.
const sysSeedMode = auth.SeedMode

// systemUser is the embedded server's system-account user: its public key
// and the absolute path of its seed file.
type systemUser struct {
	publicKey string
	seedPath  string
}

// loadSystemUser reads the system user's seed from dataDir, writing a new
// one (mode 0600) at the first start, so that the same credentials serve
// every later start.
func loadSystemUser(dataDir string) (systemUser, error) {
	path, err := filepath.Abs(filepath.Join(dataDir, sysSeedFile))
	if err != nil {
		return systemUser{}, fmt.Errorf("system user: %w", err)
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		raw, err = auth.NewSeedFile(path)
	}
	if err != nil {
		return systemUser{}, fmt.Errorf("system user's seed %s: %w", path, err)
	}
	pub, err := userKey(raw)
	clear(raw)
	if err != nil {
		return systemUser{}, fmt.Errorf("system user's seed %s: %w (remove the file to get a new one)", path, err)
	}
	return systemUser{publicKey: pub, seedPath: path}, nil
}

// userKey is the public key of a user's seed.
func userKey(seed []byte) (string, error) {
	kp, err := nkeys.ParseDecoratedNKey(seed)
	if err != nil {
		return "", err
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return "", errors.New("holds no nkey user seed")
	}
	return pub, nil
}

// reportCommand is the nats CLI command that runs a JetStream report of
// the server at url as the system user.
func (u systemUser) reportCommand(url string) string {
	return fmt.Sprintf("nats --server %s --nkey %s server report jetstream", url, u.seedPath)
}
