package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/logging"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/wire"
)

// externalServing is serve's coordinator and node on existing servers,
// each with a connection of its own.
type externalServing struct {
	cluster          streamwal.Cluster
	coordNC, nodeNC  *nats.Conn
	coord            *coord.Coordinator
	node             *node.Node
	nodeID, coordID  string
	groupCommit, url string
	view             wire.View
}

// runServeExternal runs serve's coordinator and node on the servers of
// --server until the command's context ends.
func runServeExternal(cmd *cobra.Command, f *serveFlags, cfg serveConfig) error {
	cf := componentFlags{natsFlags: f.natsFlags, cluster: f.cluster, id: f.id, replicas: f.replicas, logLevel: f.logLevel, metrics: f.metrics}
	if _, _, err := cf.parseCommon(cmd); err != nil {
		return err
	}
	nf := nodeFlags{componentFlags: cf, dupWindow: f.dupWindow, intervals: f.intervals, groupCommit: f.groupCommit}
	if nf.id == "" {
		nf.id = defaultServeID()
	}
	if err := nf.checkNodeFlags(cmd); err != nil {
		return err
	}
	id, err := streamwal.ParseNodeID(nf.id)
	if err != nil {
		return fmt.Errorf("--id: %w", err)
	}
	log := newLogger(cmd, cfg.level)
	ep, hooks, err := f.metrics.start(log, cmd.OutOrStdout())
	if err != nil {
		return err
	}
	defer closeEndpoint(ep)
	tracing, stopTracing, err := startTracing(f.metrics.otlp, "streamwal-serve")
	if err != nil {
		return err
	}
	defer stopTracing()
	repl, err := f.replAuth.options()
	if err != nil {
		return err
	}
	s, err := startExternal(cmd, &cf, log, cfg, nodeSettings{cluster: cfg.cluster, id: id, replicas: f.replicas,
		retain: f.retain, dupWindow: f.dupWindow, intervals: f.intervals, groupCommit: f.groupCommit, hooks: slices.Concat(hooks, tracing),
		replicate: repl}, f.pchannels)
	if err != nil {
		return err
	}
	setReady(ep, func() error { return errors.Join(s.coord.Ready(), s.node.Ready()) })
	s.printBanner(cmd.OutOrStdout(), f)
	<-cmd.Context().Done()
	fmt.Fprintln(cmd.OutOrStdout(), "shutting down")
	s.close()
	return nil
}

// defaultServeID is serve's node ID on existing servers: serve-<host
// name>, with what a node ID cannot hold replaced by '-'.
func defaultServeID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, host)
	return strings.TrimRight(("serve-" + host)[:min(len("serve-"+host), streamwal.MaxNodeIDLen)], "-")
}

// startExternal connects the coordinator and the node, starts them and
// waits until every PChannel is served (or refused for lost history), for
// as long as the command's context lasts; on an error it stops what it
// started.
func startExternal(cmd *cobra.Command, cf *componentFlags, log zerolog.Logger, cfg serveConfig, ns nodeSettings, pchannels int) (*externalServing, error) {
	ctx := cmd.Context()
	s := &externalServing{cluster: cfg.cluster, nodeID: string(ns.id), coordID: "coord-" + nuid.Next()}
	var err error
	coordLog := logging.Component(log, "coord").With().Str("coord", s.coordID).Logger()
	if s.coordNC, err = cf.connectComponent(ctx, cmd, coordLog, "streamwal-coord-"+s.coordID); err != nil {
		return nil, err
	}
	s.url = describeServer(s.coordNC)
	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	s.coord, err = startPlaced(startCtx, coordLog, s.coordNC, ns.replicas, func(ctx context.Context) (*coord.Coordinator, error) {
		return coord.Start(ctx, coord.Config{Conn: s.coordNC, Cluster: cfg.cluster, ID: s.coordID,
			PChannels: pchannels, Replicas: ns.replicas, NodeTTL: cfg.nodeTTL, Logger: log, Hooks: ns.hooks})
	})
	if err != nil {
		s.close()
		return nil, fmt.Errorf("start coordinator: %w", explainReplicas(err, s.coordNC, ns.replicas))
	}
	if s.nodeNC, err = cf.connectComponent(ctx, cmd, nodeLog(log, ns.id), "streamwal-node-"+s.nodeID); err != nil {
		s.close()
		return nil, err
	}
	if s.node, s.groupCommit, err = startNode(ctx, log, s.nodeNC, ns); err != nil {
		s.close()
		return nil, err
	}
	if s.view, err = waitViewOn(ctx, s.coordNC, cfg.cluster, settled); err != nil {
		s.close()
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("stopped before every PChannel was served: %w", cerr)
		}
		return nil, err
	}
	return s, nil
}

// waitViewOn polls the active coordinator's view of cluster until ready
// accepts it, or ctx ends.
func waitViewOn(ctx context.Context, nc *nats.Conn, cluster streamwal.Cluster, ready func(wire.View) bool) (wire.View, error) {
	subject := cluster.CoordSubject(streamwal.CoordStatus)
	for {
		var v wire.View
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := wire.Call(callCtx, nc, subject, struct{}{}, &v)
		cancel()
		if err == nil && ready(v) {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return v, errors.Join(fmt.Errorf("cluster %q not serving", cluster), err, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// printBanner says where serve runs.
func (s *externalServing) printBanner(out io.Writer, f *serveFlags) {
	fmt.Fprintf(out, "streamwal cluster %q serving on existing NATS servers\n", s.cluster)
	fmt.Fprintf(out, "  url:         %s\n", f.server)
	fmt.Fprintf(out, "  connected:   %s\n", s.url)
	fmt.Fprintf(out, "  node:        %s (%s), coordinator %s\n", s.nodeID, s.groupCommit, s.coordID)
	fmt.Fprintf(out, "  pchannels:   %d, control channel %s, replicas %d\n", len(s.view.Channels), s.view.CChannel, f.replicas)
	for _, a := range s.view.Channels {
		if historyLost(a) {
			fmt.Fprintf(out, "  NOT SERVED:  %s: %s\n", a.PChannel, a.Error)
		}
	}
	fmt.Fprintln(out, "Press Ctrl-C to stop.")
}

// close stops the coordinator (so that it does not reassign what the node
// gives up), then the node, then their connections.
func (s *externalServing) close() {
	if s.coord != nil {
		_ = s.coord.Close()
	}
	if s.node != nil {
		_ = s.node.Close()
	}
	for _, nc := range []*nats.Conn{s.coordNC, s.nodeNC} {
		if nc != nil {
			nc.Close()
		}
	}
}
