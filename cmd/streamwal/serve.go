package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/logging"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/wal"
	"github.com/streamwal/streamwal/services/wire"
)

// serveFlags are the flags of `streamwal serve`.
type serveFlags struct {
	// natsFlags are the existing servers to run on (--server and its
	// credentials); none runs the embedded server.
	natsFlags
	dataDir    string
	host       string
	port       int
	httpPort   int
	authDir    string
	syncAlways bool
	cluster    string
	pchannels  int
	logLevel   string
	retain     time.Duration
	dupWindow  time.Duration
	nodeTTL    time.Duration
	// intervals are the node's checkpoint and truncation intervals.
	intervals storageIntervals
	// id, replicas and groupCommit are for existing servers only.
	id          string
	replicas    int
	groupCommit string
	metrics     metricsFlags
	// replAuth are the replicators' credentials for their sources.
	replAuth replicateAuth
}

// serveEmbeddedFlags are the flags that configure the embedded server,
// and serveExternalFlags those that only existing servers take.
var (
	serveEmbeddedFlags = []string{"data-dir", "host", "port", "http-port", "sync-always", "auth-dir"}
	serveExternalFlags = []string{"id", "replicas", "group-commit", flagCreds, flagNkey, flagUser, flagPassword,
		flagTLSCA, flagTLSCert, flagTLSKey}
)

// serveEnv are the environment bindings of `streamwal serve`: not
// NATS_URL, so that a shell set up for the nats tool does not turn serve
// away from its embedded server.
var serveEnv = []envBinding{
	bind(flagServer), bind(flagCluster), bind(flagNkey), bind(flagCreds), bind(flagUser), bind(flagPassword),
	bind(flagTLSCA), bind(flagTLSCert), bind(flagTLSKey),
}

// serveHelp is the long help of `streamwal serve`.
const serveHelp = "Run an embedded nats-server with JetStream file storage in --data-dir,\n" +
	"listening on --host:--port, fsyncing before every acknowledgement unless\n" +
	"--sync-always=false, with a coordinator and a node serving a cluster of\n" +
	"--pchannels PChannels. Ctrl-C (or SIGTERM) shuts down gracefully.\n\n" +
	"One data directory, one server: serve holds an exclusive lock (flock) on\n" +
	"<data-dir>/" + lockFileName + " while it runs, and a second serve on a directory\n" +
	"in use is refused at once, before anything is written. The kernel releases\n" +
	"the lock when the process ends in any way (SIGKILL and crashes included), so\n" +
	"a lock file left behind never blocks a restart; and since holding the lock\n" +
	"proves that the previous serve on the directory is gone, a restarted serve\n" +
	"takes over that one's coordinator lease at once instead of waiting it out.\n\n" +
	"A serve that fails to start (a port in use, say) removes what it created:\n" +
	"the data directory if it did not exist, or else the entries it added to it.\n" +
	"A directory that existed and its data are never removed.\n\n" +
	"--http-port turns on the embedded server's HTTP monitoring endpoint (/varz,\n" +
	"/jsz, /connz, ... as for nats-server -m), printed in the banner; off by default.\n" +
	"`nats server` commands (server report jetstream, server list, ...) ask the\n" +
	"server's system account instead: the embedded server has one user in it, whose\n" +
	"seed serve writes to <data-dir>/" + sysSeedFile + " (mode 0600) at the first start and\n" +
	"keeps; the banner prints the command (nats --nkey <data-dir>/" + sysSeedFile + " ...).\n" +
	"Every other client stays in the global account, where JetStream keeps the data.\n\n" +
	"Existing servers: with --server URL[,URL...] (or STREAMWAL_SERVER; NATS_URL is not\n" +
	"read here), serve starts no server and runs the same coordinator and node on those\n" +
	"servers, as `streamwal coord` and `streamwal node` would: --data-dir, --host,\n" +
	"--port, --http-port and --sync-always are then refused, and no data directory is\n" +
	"locked, so a restarted serve waits out its previous coordinator's lease (3 s)\n" +
	"instead of taking it over. The node's ID is --id (default serve-<host name>),\n" +
	"the same at every start; --replicas and --group-commit are as for `streamwal\n" +
	"node`, and --creds, --nkey, --user/--password and --tls-* authenticate to the\n" +
	"servers (they, too, only with --server).\n\n" +
	"Environment: STREAMWAL_SERVER, STREAMWAL_CLUSTER and the credentials' STREAMWAL_*\n" +
	"variables stand for flags not given; a flag on the command line wins.\n\n" +
	"Credentials: with --auth-dir D (written by `streamwal auth init`), the embedded\n" +
	"server accepts only the users of D/auth.conf, each with its role's permissions,\n" +
	"and serve's coordinator and node connect with D/coord.nk and D/node.nk; clients\n" +
	"then need --nkey D/client.nk, the nats CLI --nkey D/admin.nk (streams, buckets);\n" +
	"`nats server` commands still take the system user's " + sysSeedFile + ", the admin being\n" +
	"a user of the global account."

// newServeCmd is `streamwal serve`.
func newServeCmd() *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run streamwal (coordinator and node) on an embedded NATS server",
		Long:  serveHelp,
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runServe(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", "streamwal-data", "directory of the JetStream file storage (one serve at a time)")
	fl.StringVar(&f.host, "host", embedded.DefaultHost, "address to listen on")
	fl.IntVar(&f.port, "port", 4222, "client port (0 picks a free one)")
	fl.IntVar(&f.httpPort, "http-port", 0, "HTTP monitoring port of the embedded server (0: off; -1 picks a free one)")
	fl.StringVar(&f.authDir, "auth-dir", "", "credentials written by `streamwal auth init`: the embedded server accepts only their users")
	fl.BoolVar(&f.syncAlways, "sync-always", true, "fsync before acknowledging a write")
	fl.StringVar(&f.cluster, flagCluster, "local", "streamwal cluster name (env STREAMWAL_CLUSTER)")
	fl.IntVar(&f.pchannels, "pchannels", coord.DefaultPChannels, "PChannels of a new cluster")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error, disabled")
	addRecoveryFlags(fl, &f.retain, &f.dupWindow, &f.intervals)
	f.replAuth.add(fl)
	f.natsFlags.add(fl)
	fl.Lookup(flagServer).DefValue, f.server = "", ""
	fl.Lookup(flagServer).Usage = "existing NATS servers to run on, comma-separated, instead of the embedded server (env STREAMWAL_SERVER)"
	fl.StringVar(&f.id, "id", "", "with --server: the node's ID, the same at every start (default serve-<host name>)")
	fl.IntVar(&f.replicas, "replicas", 1, "with --server: replicas of the streams and buckets (1 on a single server, 3 on a NATS cluster)")
	fl.StringVar(&f.groupCommit, "group-commit", groupCommitAuto, "with --server: auto, on or off (as for the node command: see its help)")
	addNodeTTLFlag(fl, &f.nodeTTL)
	f.metrics.add(fl)
	return cmd
}

// addNodeTTLFlag registers the coordinator's --node-ttl (serve and coord).
func addNodeTTLFlag(fl *pflag.FlagSet, ttl *time.Duration) {
	fl.DurationVar(ttl, "node-ttl", coord.DefaultNodeTTL, "how long a node may go unheard before the coordinator declares it dead and moves its\n"+
		"PChannels (nodes heartbeat every 250 ms): longer rides out a slow NATS failover or a\n"+
		"stalled machine, shorter moves the PChannels of a dead node sooner; at least 500ms")
}

// checkNodeTTL refuses a --node-ttl shorter than two heartbeats.
func checkNodeTTL(fs *pflag.FlagSet, ttl time.Duration) error {
	if ttl < minNodeTTL {
		return fmt.Errorf("%s must be at least %s (two node heartbeats), got %s", origin(fs, "node-ttl"), minNodeTTL, ttl)
	}
	return nil
}

// minNodeTTL is the shortest --node-ttl: two heartbeats of a node.
const minNodeTTL = 2 * node.DefaultHeartbeat

// storageIntervals are how often a node persists each PChannel's
// checkpoint and truncates its stream.
type storageIntervals struct {
	checkpoint, truncate time.Duration
}

// check refuses an interval that is not positive.
func (iv storageIntervals) check() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"checkpoint-interval", iv.checkpoint}, {"truncate-interval", iv.truncate}} {
		if f.d <= 0 {
			return fmt.Errorf("--%s must be positive, got %s", f.name, f.d)
		}
	}
	return nil
}

// addRecoveryFlags registers the recovery flags serve and node share.
func addRecoveryFlags(fl *pflag.FlagSet, retain, dupWindow *time.Duration, iv *storageIntervals) {
	fl.DurationVar(retain, "retain", node.DefaultRetain, "keep at least this much of the log (by age) in the streams; 0s truncates as soon as\n"+
		"what is below is flushed to the object store and checkpointed, a negative value never truncates;\n"+
		"what truncation removes stays readable from the object store")
	fl.DurationVar(&iv.checkpoint, "checkpoint-interval", recovery.DefaultInterval, "the longest a consumed message waits for its PChannel's checkpoint to be persisted\n"+
		"(at once past 100 such messages); truncation never passes the persisted checkpoint")
	fl.DurationVar(&iv.truncate, "truncate-interval", wal.DefaultTruncateInterval, "how often each PChannel's stream is truncated as --retain allows (the first time\n"+
		"this long after the PChannel opens)")
	fl.DurationVar(dupWindow, "duplicate-window", jetstream.DefaultDuplicateWindow, "how long the streams remember message IDs to drop a retried append that landed;\n"+
		"truncation never removes messages younger than this")
}

// serveConfig is what serve's flags parse to.
type serveConfig struct {
	cluster streamwal.Cluster
	level   zerolog.Level
	nodeTTL time.Duration
}

// parse checks the flags that need no data directory (after applyEnv).
func (f *serveFlags) parse(fs *pflag.FlagSet) (serveConfig, error) {
	if err := f.checkMode(fs); err != nil {
		return serveConfig{}, err
	}
	cluster, err := streamwal.ParseCluster(f.cluster)
	if err != nil {
		return serveConfig{}, fmt.Errorf("%s: %w", origin(fs, flagCluster), err)
	}
	level, err := logging.ParseLevel(f.logLevel)
	if err != nil {
		return serveConfig{}, fmt.Errorf("--log-level: %w", err)
	}
	if f.pchannels <= 0 {
		return serveConfig{}, fmt.Errorf("--pchannels must be positive, got %d", f.pchannels)
	}
	if err := f.metrics.check(); err != nil {
		return serveConfig{}, err
	}
	if err := checkNodeTTL(fs, f.nodeTTL); err != nil {
		return serveConfig{}, err
	}
	if err := f.intervals.check(); err != nil {
		return serveConfig{}, err
	}
	return serveConfig{cluster: cluster, level: level, nodeTTL: f.nodeTTL}, nil
}

// checkMode refuses the flags of the embedded server with --server, and
// those of existing servers without it.
func (f *serveFlags) checkMode(fs *pflag.FlagSet) error {
	external := f.server != ""
	for _, name := range serveEmbeddedFlags {
		if external && fs.Changed(name) {
			return fmt.Errorf("--%s is for the embedded server: with %s, serve runs on existing servers and keeps no data directory",
				name, origin(fs, flagServer))
		}
	}
	for _, name := range serveExternalFlags {
		if !external && fs.Changed(name) {
			return fmt.Errorf("%s applies only with --server (existing servers to run on); the embedded server takes none", origin(fs, name))
		}
	}
	return nil
}

// runServe locks the data directory, starts the server and the system on
// it, and serves until the command's context ends. A start that fails
// undoes what it did to the data directory. With --server, it runs on
// existing servers instead (runServeExternal).
func runServe(cmd *cobra.Command, f *serveFlags) error {
	if err := applyEnv(cmd.Flags(), serveEnv); err != nil {
		return err
	}
	cfg, err := f.parse(cmd.Flags())
	if err != nil {
		return err
	}
	if f.server != "" {
		return runServeExternal(cmd, f, cfg)
	}
	dir, err := openDataDir(f.dataDir)
	if err != nil {
		return err
	}
	s, err := startServing(cmd, f, cfg, dir.locked)
	if err != nil {
		if aerr := dir.abandon(); aerr != nil {
			return errors.Join(err, aerr)
		}
		return err
	}
	s.printBanner(cmd.OutOrStdout(), f)
	<-cmd.Context().Done()
	fmt.Fprintln(cmd.OutOrStdout(), "shutting down")
	s.close()
	return dir.release()
}

// serving is a started server and system.
type serving struct {
	cluster streamwal.Cluster
	srv     *embedded.Server
	sys     *system.System
	view    wire.View
	auth    *serveAuth
	// sysUser is the embedded server's system-account user.
	sysUser systemUser
	// stopTracing flushes and stops the trace export (a no-op without).
	stopTracing func()
}

// startServing starts the embedded server and the system (within a
// minute) and waits until every PChannel is served (until the command's
// context ends); on an error it stops what it started. reclaim
// says that the data directory's lock is held, so that the coordinator may
// take over its own previous incarnation's lease at once.
func startServing(cmd *cobra.Command, f *serveFlags, cfg serveConfig, reclaim bool) (*serving, error) {
	log := newLogger(cmd, cfg.level)
	sec, err := loadServeAuth(f.authDir, cfg.cluster, f.pchannels)
	if err != nil {
		return nil, err
	}
	sysUser, err := loadSystemUser(f.dataDir)
	if err != nil {
		return nil, err
	}
	srv, err := embedded.Start(embedded.Options{
		StoreDir: f.dataDir, Host: f.host, Port: f.port, HTTPPort: f.httpPort, SyncAlways: f.syncAlways, Users: sec.Users(),
		SystemUser: sysUser.publicKey,
		// nats-server's notices are for its own operators: keep them at warn
		// unless debugging.
		Logger: logging.Component(log, "nats-server").Level(natsLevel(cfg.level)),
	})
	if err != nil {
		return nil, err
	}
	tracing, stopTracing, err := startTracing(f.metrics.otlp, "streamwal-serve")
	if err != nil {
		srv.Shutdown()
		return nil, err
	}
	repl, err := f.replAuth.options()
	if err != nil {
		stopTracing()
		srv.Shutdown()
		return nil, err
	}
	s := &serving{cluster: cfg.cluster, srv: srv, auth: sec, sysUser: sysUser, stopTracing: stopTracing}
	ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
	defer cancel()
	s.sys, err = system.Start(ctx, system.Options{Cluster: cfg.cluster, Server: srv, Logger: log, ConnectOptions: sec.connect,
		MetricsAddr: f.metrics.addr, Pprof: f.metrics.pprof,
		Coord: coord.Config{PChannels: f.pchannels, ReclaimLease: reclaim, NodeTTL: cfg.nodeTTL, Hooks: tracing},
		Node: node.Config{Recovery: retention(f.retain, f.intervals), Backend: jetstream.Options{DuplicateWindow: f.dupWindow}, Hooks: tracing,
			ReplicateOptions: repl}})
	if err != nil {
		stopTracing()
		srv.Shutdown()
		return nil, fmt.Errorf("start streamwal: %w", err)
	}
	// Opening a PChannel replays its log since the last checkpoint: wait
	// for every PChannel until told to stop, not a minute; except for one
	// refused for lost history, which waits for an operator.
	if s.view, err = waitSettled(cmd.Context(), s.sys); err != nil {
		s.close()
		if cerr := cmd.Context().Err(); cerr != nil {
			return nil, fmt.Errorf("stopped before every PChannel was served: %w", cerr)
		}
		return nil, err
	}
	return s, nil
}

// retention is the node's recovery options for --retain and the
// intervals.
func retention(d time.Duration, iv storageIntervals) node.RecoveryOptions {
	o := node.RecoveryOptions{Cadence: recovery.Cadence{Interval: iv.checkpoint}, TruncateInterval: iv.truncate}
	switch {
	case d == 0:
		o.Retain = node.RetainNothing
	case d < 0:
		o.NoTruncation = true
	default:
		o.Retain = d
	}
	return o
}

// waitSettled waits until every PChannel is served or refused because its
// stream lost acknowledged history (which only an operator can settle).
func waitSettled(ctx context.Context, sys *system.System) (wire.View, error) {
	return sys.WaitView(ctx, settled)
}

// settled reports whether every PChannel of v is served or lost its
// history.
func settled(v wire.View) bool {
	if len(v.Channels) == 0 || len(v.Nodes) == 0 {
		return false
	}
	for _, a := range v.Channels {
		if !(a.State == wire.Assigned && a.Serving) && !historyLost(a) {
			return false
		}
	}
	return true
}

// historyLost reports whether a's last open was refused for lost history.
func historyLost(a wire.Assignment) bool {
	return strings.Contains(a.Error, string(streamwal.CodeHistoryLost))
}

// printBanner says where the cluster serves.
func (s *serving) printBanner(out io.Writer, f *serveFlags) {
	url := s.srv.ClientURL()
	fmt.Fprintf(out, "streamwal cluster %q serving on an embedded NATS server\n", s.cluster)
	fmt.Fprintf(out, "  url:         %s\n", url)
	fmt.Fprintf(out, "  data dir:    %s (fsync before ack: %v)\n", f.dataDir, f.syncAlways)
	fmt.Fprintf(out, "  pchannels:   %d, control channel %s\n", len(s.view.Channels), s.view.CChannel)
	fmt.Fprintf(out, "  inspect:     nats --server %s stream ls\n", url)
	if m := s.srv.MonitorURL(); m != "" {
		fmt.Fprintf(out, "  monitoring:  %s (/varz, /jsz, /connz)\n", m)
	}
	if a := s.sys.MetricsAddr(); a != "" {
		fmt.Fprintf(out, "  metrics:     http://%s/metrics (/healthz, /readyz)\n", a)
	}
	fmt.Fprintf(out, "  report:      %s\n", s.sysUser.reportCommand(url))
	s.auth.printBanner(out)
	gc := groupCommitOff
	if f.syncAlways {
		gc = groupCommitOn
	}
	fmt.Fprintf(out, "  add a node:  streamwal node --server %s --cluster %s --state-dir DIR --group-commit %s\n", url, s.cluster, gc)
	for _, a := range s.view.Channels {
		if historyLost(a) {
			fmt.Fprintf(out, "  NOT SERVED:  %s: %s\n", a.PChannel, a.Error)
		}
	}
	fmt.Fprintln(out, "Press Ctrl-C to stop.")
}

// close stops the system, then the server.
func (s *serving) close() {
	s.sys.Close()
	s.stopTracing()
	s.srv.Shutdown()
}

// natsLevel is the level of nats-server's own logs: warnings and above,
// unless the command runs at debug level or quieter than warn.
func natsLevel(level zerolog.Level) zerolog.Level {
	if level <= zerolog.DebugLevel || level > zerolog.WarnLevel {
		return level
	}
	return zerolog.WarnLevel
}
