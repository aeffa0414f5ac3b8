package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/logging"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/telemetry"
)

// nodeFlags are the flags of `streamwal node`.
type nodeFlags struct {
	componentFlags
	stateDir    string
	retain      time.Duration
	dupWindow   time.Duration
	intervals   storageIntervals
	groupCommit string
	replAuth    replicateAuth
}

// nodeEnv are the environment bindings of `streamwal node`.
var nodeEnv = append([]envBinding{
	{flag: "id", envs: []string{"STREAMWAL_NODE_ID"}}, bind("state-dir"), bind("replicas"), bind("group-commit"),
}, connEnv...)

// The values of --group-commit.
const (
	groupCommitAuto = "auto"
	groupCommitOn   = "on"
	groupCommitOff  = "off"
)

// The files of a node's state directory.
const (
	nodeIDFile   = "node-id"
	nodeLockFile = "node.lock"
)

// nodeHelp is the long help of `streamwal node`.
const nodeHelp = "Run one streamwal node against existing NATS servers (--server), for the cluster\n" +
	"--cluster: it registers with the coordinators and serves the PChannels they assign it\n" +
	"(appends, recovery storage, truncation). Run as many as you like; a coordinator must run\n" +
	"too (`streamwal coord`): until one has created the cluster, the node waits for it.\n\n" +
	"Identity: a node's ID must stay the same across restarts, so that the coordinator knows\n" +
	"it. Give it with --id, or give --state-dir: the first start writes a generated ID to\n" +
	"<state-dir>/" + nodeIDFile + " and later starts read it back (with --id too, the two must\n" +
	"agree). A state directory is locked while its node runs. Every start is a new session:\n" +
	"the PChannels the node served before are opened again under new terms.\n\n" +
	"Group commit: when the servers fsync every write before acknowledging it\n" +
	"(sync_interval: always, the default of `streamwal serve`), the node's writers must\n" +
	"gather the appends that wait into one atomic batch per fsync, or each append pays an\n" +
	"fsync of its own; when they do not fsync, single publishes are faster. --group-commit\n" +
	"auto (the default) decides: on with --replicas above 1 (a replicated stream keeps one\n" +
	"write in flight, which gathering fills); otherwise from the servers' JetStream\n" +
	"configuration, which they show only to users of the system account; and off when they\n" +
	"do not show it (nats-server's default is not to fsync each write), with a warning.\n" +
	"Give on or off to decide yourself.\n\n" +
	"Ctrl-C or SIGTERM stops the node gracefully: it closes its WALs and says goodbye, and\n" +
	"the coordinator moves its PChannels at once. It prints one line when it is running\n" +
	"(its ID and the server it connected to) and logs to standard error."

// newNodeCmd is `streamwal node`.
func newNodeCmd() *cobra.Command {
	f := &nodeFlags{}
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a node against existing NATS servers",
		Long:  nodeHelp,
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runNode(cmd, f) },
	}
	f.add(cmd, "node ID, the same at every start: ASCII letters, digits and '-' (env STREAMWAL_NODE_ID);\n"+
		"required unless --state-dir keeps one")
	fl := cmd.Flags()
	fl.StringVar(&f.stateDir, "state-dir", "", "directory that keeps the node's ID across restarts (env STREAMWAL_STATE_DIR)")
	fl.StringVar(&f.groupCommit, "group-commit", groupCommitAuto, "gather waiting appends into one write: auto, on or off (env STREAMWAL_GROUP_COMMIT; see above)")
	addRecoveryFlags(fl, &f.retain, &f.dupWindow, &f.intervals)
	f.replAuth.add(fl)
	addConnHelp(cmd)
	return cmd
}

// runNode starts the node and runs it until the command's context ends
// (Ctrl-C, SIGTERM).
func runNode(cmd *cobra.Command, f *nodeFlags) error {
	if err := applyEnv(cmd.Flags(), nodeEnv); err != nil {
		return err
	}
	cluster, level, err := f.parseCommon(cmd)
	if err != nil {
		return err
	}
	if err := f.checkNodeFlags(cmd); err != nil {
		return err
	}
	id, release, err := nodeIdentity(f.id, f.stateDir)
	if err != nil {
		return err
	}
	defer release()
	log := newLogger(cmd, level)
	ep, hooks, err := f.metrics.start(log, cmd.OutOrStdout())
	if err != nil {
		return err
	}
	defer closeEndpoint(ep)
	tracing, stopTracing, err := startTracing(f.metrics.otlp, "streamwal-node")
	if err != nil {
		return err
	}
	defer stopTracing()
	ctx := cmd.Context()
	nc, err := f.connectComponent(ctx, cmd, nodeLog(log, id), "streamwal-node-"+string(id))
	if err != nil {
		return err
	}
	defer nc.Close()
	repl, err := f.replAuth.options()
	if err != nil {
		return err
	}
	n, gc, err := startNode(ctx, log, nc, nodeSettings{cluster: cluster, id: id, replicas: f.replicas,
		retain: f.retain, dupWindow: f.dupWindow, intervals: f.intervals, groupCommit: f.groupCommit, hooks: slices.Concat(hooks, tracing),
		replicate: repl})
	if err != nil {
		return err
	}
	setReady(ep, n.Ready)
	printReady(cmd.OutOrStdout(), "node", string(id), cluster, describeServer(nc),
		fmt.Sprintf("replicas %d, %s, session %s", f.replicas, gc, n.Session()))
	<-ctx.Done()
	fmt.Fprintln(cmd.OutOrStdout(), "shutting down")
	return n.Close()
}

// checkNodeFlags checks the flags only the node has.
func (f *nodeFlags) checkNodeFlags(cmd *cobra.Command) error {
	switch f.groupCommit {
	case groupCommitAuto, groupCommitOn, groupCommitOff:
	default:
		return fmt.Errorf("%s %q: want auto, on or off", origin(cmd.Flags(), "group-commit"), f.groupCommit)
	}
	if f.dupWindow < time.Second {
		return fmt.Errorf("--duplicate-window must be at least 1s, got %s", f.dupWindow)
	}
	if err := f.intervals.check(); err != nil {
		return err
	}
	if f.id == "" && f.stateDir == "" {
		return errors.New("give --id or --state-dir: a node's ID must stay the same across restarts " +
			"(--state-dir keeps a generated one)")
	}
	return nil
}

// nodeSettings are what a node is started with.
type nodeSettings struct {
	cluster     streamwal.Cluster
	id          streamwal.NodeID
	replicas    int
	retain      time.Duration
	dupWindow   time.Duration
	intervals   storageIntervals
	groupCommit string
	// hooks receive the node's (and serve's coordinator's) telemetry:
	// metrics, and the traces of its appends.
	hooks telemetry.Hooks
	// replicate are the credentials of the replicators' connection to
	// each source cluster (replicateAuth).
	replicate func(streamwal.Cluster) []nats.Option
}

// startNode waits for a coordinator to have created the cluster (for as
// long as ctx lasts, saying so in the log), decides group commit, and
// starts the node within startTimeout. It returns the node and a word on
// its group commit.
func startNode(ctx context.Context, log zerolog.Logger, nc *nats.Conn, s nodeSettings) (*node.Node, string, error) {
	codec, err := messages.NewCodec(s.cluster, nil)
	if err != nil {
		return nil, "", err
	}
	if err := waitForCluster(ctx, nodeLog(log, s.id), nc, s.cluster); err != nil {
		return nil, "", err
	}
	gc, why := decideGroupCommit(ctx, nodeLog(log, s.id), nc, s.groupCommit, s.replicas)
	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	n, err := startPlaced(startCtx, nodeLog(log, s.id), nc, s.replicas, func(ctx context.Context) (*node.Node, error) {
		return node.Start(ctx, node.Config{Conn: nc, Codec: codec, ID: s.id, Logger: log, Hooks: s.hooks, ReplicateOptions: s.replicate,
			Backend:  jetstream.Options{Replicas: s.replicas, DuplicateWindow: s.dupWindow, GroupCommit: gc},
			Recovery: withReplicas(retention(s.retain, s.intervals), s.replicas)})
	})
	if err != nil {
		return nil, "", fmt.Errorf("start node %s: %w", s.id, explainReplicas(err, nc, s.replicas))
	}
	return n, why, nil
}

// nodeLog is the logger of what the node's process logs itself, with the
// fields of the node's own logs.
func nodeLog(log zerolog.Logger, id streamwal.NodeID) zerolog.Logger {
	return logging.Component(log, "node").With().Str("node", string(id)).Logger()
}

// withReplicas is o with the replicas of its checkpoints bucket.
func withReplicas(o node.RecoveryOptions, replicas int) node.RecoveryOptions {
	o.Replicas = replicas
	return o
}

// waitLogInterval is how often a node waiting for its cluster says so.
const waitLogInterval = time.Minute

// waitForCluster waits until the cluster's nodes bucket exists (a
// coordinator created the cluster), logging that it waits once it waited
// a second, and again every waitLogInterval.
func waitForCluster(ctx context.Context, log zerolog.Logger, nc *nats.Conn, cluster streamwal.Cluster) error {
	js, err := njs.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	bucket := cluster.BucketName(streamwal.BucketNodes)
	lastLog := time.Now().Add(time.Second - waitLogInterval)
	for {
		_, err := js.KeyValue(ctx, bucket)
		if err == nil {
			return nil
		}
		if !errors.Is(err, njs.ErrBucketNotFound) && ctx.Err() == nil {
			log.Warn().Err(err).Str("bucket", bucket).Msg("cannot look up the cluster's nodes bucket; trying again")
		} else if time.Since(lastLog) >= waitLogInterval {
			log.Info().Str("cluster", string(cluster)).Str("bucket", bucket).
				Msg("waiting for a coordinator to create the cluster (is `streamwal coord` running with this --cluster?)")
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped while waiting for a coordinator of cluster %q: %w", cluster, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// decideGroupCommit turns --group-commit into the node's setting, and
// says why.
func decideGroupCommit(ctx context.Context, log zerolog.Logger, nc *nats.Conn, mode string, replicas int) (bool, string) {
	switch mode {
	case groupCommitOn:
		return true, "group commit on (--group-commit on)"
	case groupCommitOff:
		return false, "group commit off (--group-commit off)"
	}
	if replicas > 1 {
		return true, "group commit on (auto: replicated streams)"
	}
	sync, err := serversSyncAlways(ctx, nc)
	switch {
	case err == nil && sync:
		return true, "group commit on (auto: the servers fsync every write)"
	case err == nil:
		return false, "group commit off (auto: the servers do not fsync every write)"
	}
	log.Warn().Err(err).Msg("group commit off, as for nats-server's default of not fsyncing every write; " +
		"if the servers fsync every write (sync_interval: always, as `streamwal serve` does by default), " +
		"start the node with --group-commit on, or appends will be slow")
	return false, "group commit off (auto: the servers' sync setting is not visible to this user)"
}

// nodeIdentity is the node's ID: --id, or the one its state directory
// keeps (written there at the first start, generated unless --id gives
// it). A state directory is locked until release is called.
func nodeIdentity(flagID, stateDir string) (streamwal.NodeID, func(), error) {
	if flagID != "" {
		if _, err := streamwal.ParseNodeID(flagID); err != nil {
			return "", nil, fmt.Errorf("--id: %w", err)
		}
	}
	if stateDir == "" {
		return streamwal.NodeID(flagID), func() {}, nil
	}
	lock, err := lockStateDir(stateDir)
	if err != nil {
		return "", nil, err
	}
	release := func() { _ = lock.Close() }
	id, err := stateDirID(stateDir, flagID)
	if err != nil {
		release()
		return "", nil, err
	}
	return id, release, nil
}

// lockStateDir creates dir if it is missing and locks it, refusing a
// directory another node holds.
func lockStateDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--state-dir %s: %w", dir, err)
	}
	name := filepath.Join(dir, nodeLockFile)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--state-dir %s: %w", dir, err)
	}
	if _, err := tryLock(f); err != nil {
		_ = f.Close()
		if errors.Is(err, errDataDirInUse) {
			return nil, fmt.Errorf("--state-dir %s is in use by another streamwal node (the lock is on %s): stop it first or give another directory", dir, name)
		}
		return nil, fmt.Errorf("--state-dir %s: lock %s: %w", dir, name, err)
	}
	return f, nil
}

// stateDirID reads the ID dir keeps, or writes one there (flagID, or a
// generated one) if it keeps none. flagID, when given, must be the one
// kept.
func stateDirID(dir, flagID string) (streamwal.NodeID, error) {
	path := filepath.Join(dir, nodeIDFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id, err := streamwal.ParseNodeID(strings.TrimSpace(string(b)))
		if err != nil {
			return "", fmt.Errorf("%s: %w (remove the file to start under a new ID)", path, err)
		}
		if flagID != "" && string(id) != flagID {
			return "", fmt.Errorf("--id %s: the state directory %s belongs to node %s (%s): give that ID, or another directory",
				flagID, dir, id, path)
		}
		return id, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("--state-dir: %w", err)
	}
	id := flagID
	if id == "" {
		id = "node-" + nuid.Next()
	}
	if err := writeFileSynced(path, []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("--state-dir: keep the node ID: %w", err)
	}
	return streamwal.NodeID(id), nil
}

// writeFileSynced writes data to path whole or not at all: to a temporary
// file, fsynced, renamed over path, and the directory fsynced.
func writeFileSynced(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
