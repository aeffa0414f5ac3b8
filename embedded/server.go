package embedded

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

const (
	// readyProbe is how long one server.ReadyForConnections call may take
	// while Start polls for readiness and for fatal errors.
	readyProbe = 50 * time.Millisecond
	// pollInterval is the pause between two evaluations of a polled
	// condition.
	pollInterval = 10 * time.Millisecond
)

// errBind marks a failure to bind a listening port, which is retried with
// fresh ports when this package picked them.
var errBind = errors.New("cannot bind port")

// Server is an embedded nats-server with JetStream enabled. It may be
// stopped with [Server.Shutdown] and started again with [Server.Restart] on
// the same port and store directory. Its methods are safe for concurrent
// use.
type Server struct {
	mu     sync.Mutex
	opts   Options       // defaults applied; Port pinned after the first start
	member *memberConfig // nil unless the server is a cluster member
	ns     *server.Server
}

// memberConfig is the cluster part of a cluster member's configuration.
type memberConfig struct {
	clusterName string
	routePort   int
	routes      []*url.URL
}

// Start validates opts, starts a server and waits until it accepts client
// connections and JetStream is enabled, or until opts.StartTimeout expires.
// Invalid options yield an error wrapping [ErrInvalidOptions].
func Start(opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts.withDefaults()}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startLocked()
}

// startLocked starts nats-server unless it is running. s.mu must be held.
func (s *Server) startLocked() error {
	if s.ns != nil {
		return nil
	}
	var ns *server.Server
	no, err := s.natsOptions()
	if err == nil {
		ns, err = server.NewServer(no)
	}
	if err != nil {
		return fmt.Errorf("embedded: configure nats-server %q: %w", s.opts.ServerName, err)
	}
	fatal := newFatalSink()
	logger := newNATSLogger(s.opts.Logger, s.opts.ServerName, fatal)
	debug, trace := logger.levels()
	ns.SetLoggerV2(logger, debug, trace, false)
	ns.Start()
	if err := waitReady(ns, fatal, s.opts.StartTimeout); err != nil {
		stopNATS(ns)
		return fmt.Errorf("embedded: start nats-server %q: %w", s.opts.ServerName, err)
	}
	s.ns = ns
	if addr, ok := ns.Addr().(*net.TCPAddr); ok {
		s.opts.Port = addr.Port // keep the chosen port across restarts
	}
	if addr := ns.MonitorAddr(); addr != nil {
		s.opts.HTTPPort = addr.Port // likewise the monitoring port
	}
	return nil
}

// natsOptions translates s's configuration into fresh nats-server options
// (nats-server mutates the options it is given, so they are never reused);
// the TLS files are loaded again at every start.
func (s *Server) natsOptions() (*server.Options, error) {
	port := s.opts.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	no := &server.Options{
		ServerName:             s.opts.ServerName,
		Host:                   s.opts.Host,
		Port:                   port,
		MaxPayload:             int32(s.opts.MaxPayload),
		JetStream:              true,
		StoreDir:               s.opts.StoreDir,
		SyncAlways:             s.opts.SyncAlways,
		JetStreamMaxMemory:     s.opts.JetStreamMaxMemory,
		JetStreamMaxStore:      s.opts.JetStreamMaxStore,
		HTTPHost:               s.opts.Host,
		HTTPPort:               s.opts.HTTPPort, // 0 off, -1 (RANDOM_PORT) a free one
		NoSigs:                 true,            // never install signal handlers in a library
		DisableJetStreamBanner: true,
	}
	if m := s.member; m != nil {
		no.Cluster = server.ClusterOpts{Name: m.clusterName, Host: s.opts.Host, Port: m.routePort}
		no.Routes = m.routes
	}
	no.Nkeys = slices.Clone(s.opts.Users)
	if err := s.addSystemUser(no); err != nil {
		return nil, err
	}
	if t := s.opts.TLS; t != nil {
		c, err := t.config()
		if err != nil {
			return nil, err
		}
		no.TLS, no.TLSConfig, no.TLSVerify = true, c, t.Verify
	}
	return no, nil
}

// addSystemUser gives no the system account with Options.SystemUser as
// its user. With Options.Users, those stay the only other users; without,
// an anonymous user of the global account is added, which clients without
// credentials connect as (its seed is thrown away: no one can
// authenticate as it otherwise).
func (s *Server) addSystemUser(no *server.Options) error {
	if s.opts.SystemUser == "" {
		return nil
	}
	sys := server.NewAccount(server.DEFAULT_SYSTEM_ACCOUNT)
	no.Accounts = []*server.Account{sys}
	no.SystemAccount = sys.Name
	no.Nkeys = append(no.Nkeys, &server.NkeyUser{Nkey: s.opts.SystemUser, Account: sys})
	if len(s.opts.Users) > 0 {
		// Declare the users, as a configuration file does with an
		// authorization block: without one, a server whose system account
		// has users gives the global account a no-auth user of its own,
		// letting in every client without credentials.
		if err := no.ProcessConfigString("authorization {}"); err != nil {
			return fmt.Errorf("declare the users: %w", err)
		}
		return nil
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return fmt.Errorf("create the anonymous user: %w", err)
	}
	defer kp.Wipe()
	anon, err := kp.PublicKey()
	if err != nil {
		return fmt.Errorf("create the anonymous user: %w", err)
	}
	no.Nkeys = append(no.Nkeys, &server.NkeyUser{Nkey: anon}) // no account: the global one
	no.NoAuthUser = anon
	return nil
}

// waitReady polls until ns accepts connections with JetStream enabled, a
// fatal error is logged, or timeout expires.
func waitReady(ns *server.Server, fatal *fatalSink, timeout time.Duration) error {
	err := poll(timeout, func() (bool, error) {
		if err := fatal.err(); err != nil {
			return false, err
		}
		return ns.ReadyForConnections(readyProbe) && ns.JetStreamEnabled(), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for client listener and JetStream: %w", err)
	}
	return nil
}

// poll evaluates cond every pollInterval until it returns true or an error,
// or until timeout expires.
func poll(timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", timeout)
		}
		<-tick.C
	}
}

func stopNATS(ns *server.Server) {
	ns.Shutdown()
	ns.WaitForShutdown()
}

// Shutdown stops the server and waits until it has shut down. It is
// idempotent; [Server.Restart] starts a shut-down server again.
func (s *Server) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *Server) stopLocked() {
	if s.ns == nil {
		return
	}
	stopNATS(s.ns)
	s.ns = nil
}

// Restart shuts the server down (if it is running) and starts it again on
// the same host, port and store directory, so JetStream data survives and
// clients can reconnect to the same URL. It waits for readiness like
// [Start].
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
	if err := s.startLocked(); err != nil {
		return fmt.Errorf("embedded: restart: %w", err)
	}
	return nil
}

// Running reports whether the server is started (not shut down).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns != nil
}

// NATSServer returns the underlying nats-server for advanced use, or nil
// while the server is shut down. A [Server.Restart] replaces it.
func (s *Server) NATSServer() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns
}

// Name returns the nats-server name.
func (s *Server) Name() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.ServerName
}

// StoreDir returns the JetStream store directory.
func (s *Server) StoreDir() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.StoreDir
}

// Port returns the client port. It does not change across restarts.
func (s *Server) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.Port
}

// Addr returns the host:port clients connect to. An unspecified listen
// address (0.0.0.0 or ::) is reported as the loopback address.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort(connectHost(s.opts.Host), strconv.Itoa(s.opts.Port))
}

// ClientURL returns the URL clients connect to: nats://host:port, or
// tls://host:port when the server requires TLS.
func (s *Server) ClientURL() string {
	s.mu.Lock()
	scheme := "nats://"
	if s.opts.TLS != nil {
		scheme = "tls://"
	}
	s.mu.Unlock()
	return scheme + s.Addr()
}

// MonitorURL returns the address of the HTTP monitoring endpoint,
// http://host:port, or "" when Options.HTTPPort left it off.
func (s *Server) MonitorURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.HTTPPort <= 0 {
		return ""
	}
	return "http://" + net.JoinHostPort(connectHost(s.opts.Host), strconv.Itoa(s.opts.HTTPPort))
}

// Connect connects a NATS client to the server.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	u := s.ClientURL()
	nc, err := nats.Connect(u, opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded: connect to %s: %w", u, err)
	}
	return nc, nil
}

func connectHost(host string) string {
	ip := net.ParseIP(host)
	switch {
	case ip == nil || !ip.IsUnspecified():
		return host
	case ip.To4() != nil:
		return "127.0.0.1"
	default:
		return "::1"
	}
}

// SyncAlways reports whether the server fsyncs every write before it
// acknowledges it.
func (s *Server) SyncAlways() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.SyncAlways
}
