package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/logging"
)

// Bounds of a component's start against existing servers.
const (
	// jetStreamCheckTimeout bounds the first JetStream request: a server
	// without JetStream answers at once, a cluster without a meta leader
	// never does.
	jetStreamCheckTimeout = 10 * time.Second
	// startTimeout bounds a component's start once its servers answered
	// (buckets provisioned, registration written).
	startTimeout = time.Minute
	// syncProbeTimeout bounds the question whether the servers fsync
	// every write.
	syncProbeTimeout = 2 * time.Second
	// maxReplicas is the most replicas a JetStream stream may have.
	maxReplicas = 5
)

// componentFlags are the flags `streamwal coord` and `streamwal node`
// share: the connection, the cluster, the component's ID, the replicas of
// what it creates and its log level.
type componentFlags struct {
	natsFlags
	cluster  string
	id       string
	replicas int
	logLevel string
	metrics  metricsFlags
}

// add registers the shared flags on cmd; idHelp explains --id.
func (f *componentFlags) add(cmd *cobra.Command, idHelp string) {
	fl := cmd.Flags()
	f.natsFlags.add(fl)
	fl.StringVar(&f.cluster, flagCluster, "local", "streamwal cluster name (env STREAMWAL_CLUSTER)")
	fl.StringVar(&f.id, "id", "", idHelp)
	fl.IntVar(&f.replicas, "replicas", 1, "replicas of the streams and buckets it creates: 1 on a single server, 3 on a NATS cluster\n"+
		"(env STREAMWAL_REPLICAS); more than the servers can keep is an error at start")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error, disabled")
	f.metrics.add(fl)
}

// component is what a started component's process shares: its cluster,
// logger and connection.
type component struct {
	cluster streamwal.Cluster
	log     zerolog.Logger
	nc      *nats.Conn
}

// parseCommon checks the shared flags (after applyEnv).
func (f *componentFlags) parseCommon(cmd *cobra.Command) (streamwal.Cluster, zerolog.Level, error) {
	fs := cmd.Flags()
	cluster, err := streamwal.ParseCluster(f.cluster)
	if err != nil {
		return "", 0, fmt.Errorf("%s: %w", origin(fs, flagCluster), err)
	}
	level, err := logging.ParseLevel(f.logLevel)
	if err != nil {
		return "", 0, fmt.Errorf("--log-level: %w", err)
	}
	if f.replicas < 1 || f.replicas > maxReplicas {
		return "", 0, fmt.Errorf("%s must be 1 to %d, got %d", origin(fs, "replicas"), maxReplicas, f.replicas)
	}
	if _, err := f.natsOptions(fs); err != nil {
		return "", 0, err
	}
	if err := f.metrics.check(); err != nil {
		return "", 0, err
	}
	return cluster, level, nil
}

// connectComponent connects a component named name to its servers, logs
// the connection's losses and recoveries, and checks that JetStream
// answers and can keep f.replicas replicas.
func (f *componentFlags) connectComponent(ctx context.Context, cmd *cobra.Command, log zerolog.Logger, name string) (*nats.Conn, error) {
	nc, err := f.dial(cmd.Flags(), name, connectionLogs(log)...)
	if err != nil {
		return nil, err
	}
	if err := checkJetStream(ctx, nc); err != nil {
		nc.Close()
		return nil, err
	}
	if err := checkReplicas(nc, f.replicas); err != nil {
		nc.Close()
		return nil, err
	}
	return nc, nil
}

// connectionLogs are options that log a connection's losses and
// recoveries, and a reconnect wait short enough for a quick failover.
func connectionLogs(log zerolog.Logger) []nats.Option {
	return []nats.Option{
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if !nc.IsClosed() { // not the component's own close
				log.Warn().Err(err).Msg("disconnected from NATS; reconnecting")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("url", nc.ConnectedUrlRedacted()).Msg("reconnected to NATS")
		}),
	}
}

// checkJetStream asks for the account's JetStream information, within
// jetStreamCheckTimeout, and says clearly what is wrong if it does not
// come.
func checkJetStream(ctx context.Context, nc *nats.Conn) error {
	js, err := njs.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, jetStreamCheckTimeout)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	where := describeServer(nc)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, njs.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("JetStream is not enabled for this user's account on %s: give the account JetStream limits in the server's configuration", where)
	case errors.Is(err, njs.ErrJetStreamNotEnabled):
		return fmt.Errorf("JetStream is not enabled on %s: start nats-server with -js (or a jetstream block in its configuration)", where)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("JetStream on %s did not answer within %s (a NATS cluster without a JetStream meta leader? check `nats server report jetstream`)", where, jetStreamCheckTimeout)
	}
	return fmt.Errorf("JetStream on %s: %w", where, err)
}

// describeServer names the server nc is connected to, and its NATS
// cluster if it has one.
func describeServer(nc *nats.Conn) string {
	s := fmt.Sprintf("%s (server %s", nc.ConnectedUrlRedacted(), nc.ConnectedServerName())
	if c := nc.ConnectedClusterName(); c != "" {
		s += ", NATS cluster " + c
	}
	return s + ")"
}

// replicaError is a replica count the servers cannot keep, and what they
// can.
type replicaError struct{ msg string }

// Error says what was asked and what the servers provide.
func (e *replicaError) Error() string { return e.msg }

// replicasRefused is a replicaError.
func replicasRefused(format string, args ...any) error {
	return &replicaError{msg: fmt.Sprintf(format, args...)}
}

// checkReplicas refuses more than one replica on a server that is not
// part of a NATS cluster: such a server keeps exactly one. A cluster's
// capacity shows only when a stream or bucket is created (see
// explainReplicas).
func checkReplicas(nc *nats.Conn, replicas int) error {
	if replicas > 1 && nc.ConnectedClusterName() == "" {
		return replicasRefused("--replicas %d: %s is a single server, not part of a NATS cluster: it keeps 1 replica of each stream and bucket; use --replicas 1, or a cluster of at least %d servers",
			replicas, describeServer(nc), replicas)
	}
	return nil
}

// startPlaced runs start until it succeeds, fails for another reason
// than the placement of replicas, or ctx ends. A NATS cluster that knows
// of enough servers may still refuse a placement for a moment (a cluster
// just started, whose JetStream peers are not all current yet: "no
// suitable peers for placement, peer offline"); one that knows of fewer
// servers than replicas is refused at once (see explainReplicas).
func startPlaced[T any](ctx context.Context, log zerolog.Logger, nc *nats.Conn, replicas int, start func(context.Context) (T, error)) (T, error) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = 250*time.Millisecond, 2*time.Second
	for {
		v, err := start(ctx)
		if err == nil || !isReplicaError(err) || len(nc.Servers()) < replicas || ctx.Err() != nil {
			return v, err
		}
		log.Warn().Err(err).Int("replicas", replicas).Msg("the NATS cluster cannot place the replicas yet; trying again")
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(bo.NextBackOff()):
		}
	}
}

// JetStream's error codes for a replica count the servers cannot keep.
const (
	jsErrNoPeers              = 10005 // no suitable peers for placement
	jsErrInsufficientResource = 10023 // insufficient resources
	jsErrReplicasNotSupported = 10074 // replicas > 1 not supported in non-clustered mode
)

// explainReplicas turns an error of a component's start that says the
// servers cannot keep `replicas` replicas (JetStream's own words, which a
// bucket's creation returns) into one that says what they provide; any
// other error is returned as it is.
func explainReplicas(err error, nc *nats.Conn, replicas int) error {
	if err == nil || !isReplicaError(err) {
		return err
	}
	known := len(nc.Servers())
	if nc.ConnectedClusterName() == "" {
		return replicasRefused("--replicas %d: %s is a single server: it keeps 1 replica; use --replicas 1 (%v)",
			replicas, describeServer(nc), err)
	}
	return replicasRefused("--replicas %d: the NATS cluster %q cannot place %d replicas: it needs %d servers with JetStream and room on them, and this connection knows of %d server(s) in it; use fewer replicas or add servers (%v)",
		replicas, nc.ConnectedClusterName(), replicas, replicas, known, err)
}

// isReplicaError reports whether err is JetStream's refusal of a replica
// count: by its API error when err carries one, else by the error code in
// its text (the coordinator's provisioning keeps only the text).
func isReplicaError(err error) bool {
	codes := []njs.ErrorCode{jsErrNoPeers, jsErrInsufficientResource, jsErrReplicasNotSupported}
	var apiErr *njs.APIError
	if errors.As(err, &apiErr) {
		for _, c := range codes {
			if apiErr.ErrorCode == c {
				return true
			}
		}
		return false
	}
	for _, c := range codes {
		if strings.Contains(err.Error(), fmt.Sprintf("err_code=%d", c)) {
			return true
		}
	}
	return false
}

// jszReply is the part of a server's JSZ answer that says whether it
// fsyncs every write.
type jszReply struct {
	Data *struct {
		Config *struct {
			SyncAlways bool `json:"sync_always"`
		} `json:"config"`
	} `json:"data"`
	Error *struct {
		Description string `json:"description"`
	} `json:"error"`
}

// errSyncUnknown says that the servers did not say whether they fsync
// every write.
var errSyncUnknown = errors.New("the servers' sync setting is not visible to this user (it takes a user of the system account)")

// serversSyncAlways asks the servers (nats-server's JSZ request, answered
// to users of the system account) whether they fsync every write before
// acknowledging it, within syncProbeTimeout. errSyncUnknown (wrapped)
// means no server said.
func serversSyncAlways(ctx context.Context, nc *nats.Conn) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, syncProbeTimeout)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, streamwal.ServerJSZPing, []byte(`{}`))
	if err != nil {
		return false, fmt.Errorf("%w: %v", errSyncUnknown, err)
	}
	var r jszReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return false, fmt.Errorf("%w: %v", errSyncUnknown, err)
	}
	if r.Error != nil || r.Data == nil || r.Data.Config == nil {
		return false, fmt.Errorf("%w: the answer has no JetStream configuration", errSyncUnknown)
	}
	return r.Data.Config.SyncAlways, nil
}
