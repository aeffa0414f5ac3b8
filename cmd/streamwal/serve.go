package main

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/logging"
	"github.com/streamwal/streamwal/services/coord"
)

// serveFlags are the flags of `streamwal serve`.
type serveFlags struct {
	dataDir    string
	host       string
	port       int
	syncAlways bool
	cluster    string
	pchannels  int
	logLevel   string
}

func newServeCmd() *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run streamwal (coordinator and node) on an embedded NATS server",
		Long: "Run an embedded nats-server with JetStream file storage in --data-dir,\n" +
			"listening on --host:--port, fsyncing before every acknowledgement unless\n" +
			"--sync-always=false, with a coordinator and a node serving a cluster of\n" +
			"--pchannels PChannels. Ctrl-C shuts down gracefully.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runServe(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", "streamwal-data", "directory of the JetStream file storage")
	fl.StringVar(&f.host, "host", embedded.DefaultHost, "address to listen on")
	fl.IntVar(&f.port, "port", 4222, "client port (0 picks a free one)")
	fl.BoolVar(&f.syncAlways, "sync-always", true, "fsync before acknowledging a write")
	fl.StringVar(&f.cluster, "cluster", "local", "streamwal cluster name")
	fl.IntVar(&f.pchannels, "pchannels", coord.DefaultPChannels, "PChannels of a new cluster")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error, disabled")
	return cmd
}

func runServe(cmd *cobra.Command, f *serveFlags) error {
	cluster, err := streamwal.ParseCluster(f.cluster)
	if err != nil {
		return err
	}
	level, err := logging.ParseLevel(f.logLevel)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if f.pchannels <= 0 {
		return fmt.Errorf("--pchannels must be positive, got %d", f.pchannels)
	}
	log := logging.New(cmd.ErrOrStderr(), level, true)
	srv, err := embedded.Start(embedded.Options{
		StoreDir: f.dataDir, Host: f.host, Port: f.port, SyncAlways: f.syncAlways,
		// nats-server's notices are for its own operators: keep them at warn
		// unless debugging.
		Logger: logging.Component(log, "nats-server").Level(natsLevel(level)),
	})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
	defer cancel()
	sys, err := system.Start(ctx, system.Options{Cluster: cluster, Server: srv, Logger: log,
		Coord: coord.Config{PChannels: f.pchannels}})
	if err != nil {
		return err
	}
	defer sys.Close()
	view, err := sys.WaitServing(ctx, false)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "streamwal cluster %q serving on an embedded NATS server\n", cluster)
	fmt.Fprintf(out, "  url:         %s\n", srv.ClientURL())
	fmt.Fprintf(out, "  data dir:    %s (fsync before ack: %v)\n", f.dataDir, f.syncAlways)
	fmt.Fprintf(out, "  pchannels:   %d, control channel %s\n", len(view.Channels), view.CChannel)
	fmt.Fprintf(out, "  inspect:     nats --server %s stream ls\n", srv.ClientURL())
	fmt.Fprintln(out, "Press Ctrl-C to stop.")
	<-cmd.Context().Done()
	fmt.Fprintln(out, "shutting down")
	return nil
}

// natsLevel is the level of nats-server's own logs: warnings and above,
// unless the command runs at debug level or quieter than warn.
func natsLevel(level zerolog.Level) zerolog.Level {
	if level <= zerolog.DebugLevel || level > zerolog.WarnLevel {
		return level
	}
	return zerolog.WarnLevel
}
