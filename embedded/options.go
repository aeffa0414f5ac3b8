package embedded

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"
)

// ErrInvalidOptions is returned (wrapped) by [Options.Validate],
// [ClusterOptions.Validate], [Start] and [StartCluster] when the options are
// invalid. Test for it with errors.Is.
var ErrInvalidOptions = errors.New("embedded: invalid options")

// Defaults applied to zero-valued [Options] fields.
const (
	// DefaultHost is the listen address used when Options.Host is empty.
	DefaultHost = "127.0.0.1"
	// DefaultMaxPayload is the maximum message payload (8 MiB) used when
	// Options.MaxPayload is zero. It leaves ample room for a 1 MiB record plus
	// headers and is the largest value nats-server accepts without warning.
	DefaultMaxPayload = 8 << 20
	// MaxMaxPayload is the largest accepted Options.MaxPayload (64 MiB, the
	// nats-server per-client pending limit a payload must not exceed).
	MaxMaxPayload = 64 << 20
	// DefaultStartTimeout bounds how long [Start] waits for the server to
	// become ready when Options.StartTimeout is zero.
	DefaultStartTimeout = 10 * time.Second
)

// Options configures an embedded server. The zero value of every field
// except StoreDir selects a documented default.
type Options struct {
	// StoreDir is the directory JetStream keeps its file storage in
	// (nats-server creates a "jetstream" subdirectory). Required: an empty
	// StoreDir is an error, never silently a temporary directory. Reuse the
	// same directory to recover the data of a previous run.
	StoreDir string

	// Host is the IP address or host name to listen on for clients.
	// Default "127.0.0.1" ([DefaultHost]).
	Host string

	// Port is the client port. 0 picks a free port (the chosen port is then
	// kept across [Server.Restart]); valid range 0..65535.
	Port int

	// HTTPPort turns on nats-server's HTTP monitoring endpoint (/varz,
	// /jsz, /connz, ...) on Host: 0 (the default) leaves it off, -1 picks
	// a free port (then kept across [Server.Restart]); valid range
	// -1..65535. [Server.MonitorURL] is its address.
	HTTPPort int

	// SyncAlways makes JetStream fsync every write before acknowledging it
	// (nats-server option SyncAlways, configuration "sync_interval: always").
	// When false, writes reach the operating system before the ack and are
	// fsynced every two minutes: acknowledged data survives a process crash
	// but not a machine crash. See the package documentation.
	SyncAlways bool

	// ServerName is the nats-server name. Default "streamwal-" plus random
	// hex digits. Must not contain whitespace.
	ServerName string

	// MaxPayload is the maximum payload of a single message in bytes.
	// Default 8 MiB ([DefaultMaxPayload]); at most 64 MiB ([MaxMaxPayload]).
	MaxPayload int

	// JetStreamMaxMemory limits the bytes held by memory-storage streams.
	// 0 lets nats-server choose (75% of system memory).
	JetStreamMaxMemory int64

	// JetStreamMaxStore limits the bytes held by file-storage streams.
	// 0 lets nats-server choose (75% of the free space of StoreDir's disk).
	JetStreamMaxStore int64

	// StartTimeout bounds how long [Start] and [Server.Restart] wait for the
	// server to accept connections with JetStream enabled. Default 10 s
	// ([DefaultStartTimeout]).
	StartTimeout time.Duration

	// Logger receives nats-server's log output with the field
	// component=nats-server. The zero value means zerolog.Nop(). nats-server
	// debug and trace output is enabled when the logger's level allows it.
	Logger zerolog.Logger

	// Users, when not empty, are the only clients the server accepts: nkey
	// users with their permissions (package auth derives streamwal's roles
	// and reads them from an auth.conf). Empty accepts every client with
	// every permission.
	Users []*server.NkeyUser

	// TLS, when set, makes the client port require TLS.
	TLS *TLS

	// SystemUser, when set, is the public key of an nkey user of the
	// server's system account ($SYS), the account whose users may make
	// nats-server's own requests ($SYS.REQ.>): `nats server report
	// jetstream`, `nats server list` and the like. Every other client
	// stays in the global account ($G), where JetStream keeps its data
	// (StoreDir/jetstream/$G), so a store written without SystemUser is
	// served as before: the users of Users, or, without Users, every
	// client that gives no credentials, with every permission (as the
	// server's no_auth_user). It must be no key of Users.
	SystemUser string
}

// TLS is the server side of TLS on the client port (PEM files).
type TLS struct {
	// CertFile and KeyFile are the server's certificate (chain) and
	// private key. Required.
	CertFile, KeyFile string
	// CAFile holds the CAs that client certificates must be signed by.
	// Required when Verify.
	CAFile string
	// Verify requires every client to present a certificate signed by a CA
	// of CAFile.
	Verify bool
}

// config builds the server's TLS configuration, loading the files.
func (t *TLS) config() (*tls.Config, error) {
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, invalid("TLS needs CertFile and KeyFile")
	}
	if t.Verify && t.CAFile == "" {
		return nil, invalid("TLS Verify needs CAFile")
	}
	c, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.CertFile, KeyFile: t.KeyFile, CaFile: t.CAFile, Verify: t.Verify})
	if err != nil {
		return nil, invalid("TLS: %v", err)
	}
	return c, nil
}

// Validate reports whether o is usable by [Start]. Zero values that select a
// default are valid. The returned error wraps [ErrInvalidOptions].
func (o Options) Validate() error {
	if o.StoreDir == "" {
		return invalid("StoreDir is required")
	}
	if err := validateHost(o.Host); err != nil {
		return err
	}
	if o.Port < 0 || o.Port > 65535 {
		return invalid("Port %d out of range 0..65535", o.Port)
	}
	if o.HTTPPort < -1 || o.HTTPPort > 65535 {
		return invalid("HTTPPort %d out of range -1..65535", o.HTTPPort)
	}
	if strings.ContainsAny(o.ServerName, " \t\r\n") {
		return invalid("ServerName %q contains whitespace", o.ServerName)
	}
	if o.MaxPayload < 0 || o.MaxPayload > MaxMaxPayload {
		return invalid("MaxPayload %d out of range 0..%d", o.MaxPayload, MaxMaxPayload)
	}
	if err := o.validateSecurity(); err != nil {
		return err
	}
	return o.validateLimits()
}

// validateSecurity checks the users and loads the TLS files.
func (o Options) validateSecurity() error {
	for i, u := range o.Users {
		if u == nil || !nkeys.IsValidPublicUserKey(u.Nkey) {
			return invalid("Users[%d] is not an nkey user", i)
		}
	}
	if o.TLS != nil {
		if _, err := o.TLS.config(); err != nil {
			return err
		}
	}
	return o.validateSystemUser()
}

// validateSystemUser checks that SystemUser, if set, is a user's key of
// its own.
func (o Options) validateSystemUser() error {
	if o.SystemUser == "" {
		return nil
	}
	if !nkeys.IsValidPublicUserKey(o.SystemUser) {
		return invalid("SystemUser %q is not an nkey user's public key", o.SystemUser)
	}
	for i, u := range o.Users {
		if u.Nkey == o.SystemUser {
			return invalid("SystemUser is Users[%d] too: a user belongs to one account", i)
		}
	}
	return nil
}

func (o Options) validateLimits() error {
	if o.JetStreamMaxMemory < 0 {
		return invalid("JetStreamMaxMemory %d is negative", o.JetStreamMaxMemory)
	}
	if o.JetStreamMaxStore < 0 {
		return invalid("JetStreamMaxStore %d is negative", o.JetStreamMaxStore)
	}
	if o.StartTimeout < 0 {
		return invalid("StartTimeout %s is negative", o.StartTimeout)
	}
	return nil
}

func validateHost(host string) error {
	if host == "" {
		return nil
	}
	if strings.ContainsAny(host, " \t\r\n/") {
		return invalid("Host %q is not an IP address or host name", host)
	}
	if _, _, err := net.SplitHostPort(host); err == nil {
		return invalid("Host %q must not include a port", host)
	}
	if strings.Contains(host, ":") && net.ParseIP(host) == nil {
		return invalid("Host %q is not an IP address or host name", host)
	}
	return nil
}

// withDefaults returns a copy of o with every zero-valued field replaced by
// its default.
func (o Options) withDefaults() Options {
	if o.Host == "" {
		o.Host = DefaultHost
	}
	if o.ServerName == "" {
		o.ServerName = "streamwal-" + randomHex(6)
	}
	if o.MaxPayload == 0 {
		o.MaxPayload = DefaultMaxPayload
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if reflect.ValueOf(o.Logger).IsZero() {
		o.Logger = zerolog.Nop()
	}
	return o
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error.
	return hex.EncodeToString(b)
}
