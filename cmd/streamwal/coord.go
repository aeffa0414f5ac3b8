package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/logging"
	"github.com/streamwal/streamwal/services/coord"
)

// coordFlags are the flags of `streamwal coord`.
type coordFlags struct {
	componentFlags
	pchannels int
	nodeTTL   time.Duration
}

// coordEnv are the environment bindings of `streamwal coord`.
var coordEnv = append([]envBinding{
	{flag: "id", envs: []string{"STREAMWAL_COORD_ID"}}, bind("replicas"), bind("pchannels"), bind("node-ttl"),
}, connEnv...)

// coordHelp is the long help of `streamwal coord`.
const coordHelp = "Run one streamwal coordinator against existing NATS servers (--server), for the\n" +
	"cluster --cluster. Coordinators are active-standby: run two or three, on different\n" +
	"machines; one holds the lease and assigns the PChannels to the nodes, the others\n" +
	"take over within a few seconds if it dies. The first coordinator of a new cluster\n" +
	"creates its buckets (with --replicas replicas) and its --pchannels PChannels; later\n" +
	"ones, and restarts, use what is stored.\n\n" +
	"--id names this coordinator in the lease and the logs (default: a new random one\n" +
	"each start). A coordinator stopped with Ctrl-C or SIGTERM gives its lease back, so a\n" +
	"standby takes over at once; one that crashed is waited out (3 s).\n\n" +
	"It prints one line when it is running (its ID and the server it connected to)\n" +
	"and logs to standard error."

// newCoordCmd is `streamwal coord`.
func newCoordCmd() *cobra.Command {
	f := &coordFlags{}
	cmd := &cobra.Command{
		Use:   "coord",
		Short: "Run a coordinator against existing NATS servers",
		Long:  coordHelp,
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runCoord(cmd, f) },
	}
	f.add(cmd, "coordinator ID: ASCII letters, digits and '-' (env STREAMWAL_COORD_ID; default: coord-<random>)")
	cmd.Flags().IntVar(&f.pchannels, "pchannels", coord.DefaultPChannels, "PChannels of a new cluster (env STREAMWAL_PCHANNELS); an existing cluster keeps its own")
	addNodeTTLFlag(cmd.Flags(), &f.nodeTTL)
	addConnHelp(cmd)
	return cmd
}

// parse checks coord's flags and returns the cluster, the log level and
// the coordinator's ID.
func (f *coordFlags) parse(cmd *cobra.Command) (streamwal.Cluster, zerolog.Level, string, error) {
	if err := applyEnv(cmd.Flags(), coordEnv); err != nil {
		return "", 0, "", err
	}
	cluster, level, err := f.parseCommon(cmd)
	if err != nil {
		return "", 0, "", err
	}
	if f.pchannels <= 0 {
		return "", 0, "", fmt.Errorf("%s must be positive, got %d", origin(cmd.Flags(), "pchannels"), f.pchannels)
	}
	if err := checkNodeTTL(cmd.Flags(), f.nodeTTL); err != nil {
		return "", 0, "", err
	}
	id := f.id
	if id == "" {
		id = "coord-" + nuid.Next()
	}
	if _, err := streamwal.ParseNodeID(id); err != nil {
		return "", 0, "", fmt.Errorf("%s: %w", origin(cmd.Flags(), "id"), err)
	}
	return cluster, level, id, nil
}

// runCoord starts the coordinator and runs it until the command's context
// ends (Ctrl-C, SIGTERM).
func runCoord(cmd *cobra.Command, f *coordFlags) error {
	cluster, level, id, err := f.parse(cmd)
	if err != nil {
		return err
	}
	log := newLogger(cmd, level)
	ep, hooks, err := f.metrics.start(log, cmd.OutOrStdout())
	if err != nil {
		return err
	}
	defer closeEndpoint(ep)
	tracing, stopTracing, err := startTracing(f.metrics.otlp, "streamwal-coord")
	if err != nil {
		return err
	}
	defer stopTracing()
	ctx := cmd.Context()
	nc, err := f.connectComponent(ctx, cmd, logging.Component(log, "coord").With().Str("coord", id).Logger(), "streamwal-coord-"+id)
	if err != nil {
		return err
	}
	defer nc.Close()
	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	c, err := startPlaced(startCtx, log, nc, f.replicas, func(ctx context.Context) (*coord.Coordinator, error) {
		return coord.Start(ctx, coord.Config{Conn: nc, Cluster: cluster, ID: id, PChannels: f.pchannels,
			Replicas: f.replicas, NodeTTL: f.nodeTTL, Logger: log, Hooks: slices.Concat(hooks, tracing)})
	})
	if err != nil {
		return fmt.Errorf("start coordinator %s: %w", id, explainReplicas(err, nc, f.replicas))
	}
	setReady(ep, c.Ready)
	printReady(cmd.OutOrStdout(), "coordinator", id, cluster, describeServer(nc),
		fmt.Sprintf("replicas %d, %d PChannels if the cluster is new", f.replicas, f.pchannels))
	<-ctx.Done()
	fmt.Fprintln(cmd.OutOrStdout(), "shutting down")
	return c.Close()
}

// printReady prints the line a component prints once it runs.
func printReady(w io.Writer, what, id string, cluster streamwal.Cluster, server, details string) {
	fmt.Fprintf(w, "streamwal %s %s of cluster %q running on %s; %s. Press Ctrl-C to stop.\n",
		what, id, cluster, server, details)
}
