// Package system runs a whole streamwal cluster in one process: an
// embedded nats-server (see package embedded), coordinators and nodes, each
// with its own NATS connection, so that tests (and `streamwal serve`) can
// start, grow, crash and restart members the way a deployment would.
package system

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry/endpoint"
)

// Options configure a System.
type Options struct {
	// Cluster is the cluster name (default "local").
	Cluster streamwal.Cluster
	// Server is an already running embedded server; nil starts one with
	// ServerOptions.
	Server        *embedded.Server
	ServerOptions embedded.Options
	// Coordinators and Nodes are how many of each to start (default 1
	// each); nodes are named node-1, node-2, ...
	Coordinators int
	Nodes        int
	// Coord and Node are templates for every coordinator and node (their
	// connections, codecs and IDs are filled in).
	Coord coord.Config
	Node  node.Config
	// Logger receives every component's logs (the zero value discards
	// them).
	Logger zerolog.Logger
	// ConnectOptions, when set, adds options to each connection the
	// system opens, by the member that uses it: the credentials (and TLS
	// settings) a server with users requires (see package auth).
	ConnectOptions func(Member) []nats.Option
	// MetricsAddr, when set, serves the system's metrics (every
	// coordinator's and node's), /healthz and /readyz (System.Ready) on
	// HOST:PORT (see package telemetry/endpoint); Pprof adds /debug/pprof/.
	MetricsAddr string
	Pprof       bool
	// TracerProvider, when set, traces every coordinator's and node's
	// work into it: the OpenTelemetry adapter (telemetry/oteltrace) is
	// added to their hooks (a node's appends of messages that carry a
	// trace context, a coordinator's broadcast callbacks).
	TracerProvider trace.TracerProvider
}

// Member is who uses a connection of the system.
type Member string

// The members of a system.
const (
	MemberCoordinator Member = "coord"
	MemberNode        Member = "node"
	// MemberClient is the system's own connection (Conn): status, and the
	// checks of tests.
	MemberClient Member = "client"
)

// connectOptions are m's connection options: opts, then ConnectOptions'.
func (o Options) connectOptions(m Member, opts ...nats.Option) []nats.Option {
	if o.ConnectOptions == nil {
		return opts
	}
	return append(opts, o.ConnectOptions(m)...)
}

// System is an in-process cluster.
type System struct {
	opts    Options
	Server  *embedded.Server
	Codec   *messages.Codec
	ownsSrv bool

	mu     sync.Mutex
	coords []*member[*coord.Coordinator]
	nodes  map[streamwal.NodeID]*member[*node.Node]
	nextID int
	admin  *nats.Conn
	// endpoint serves MetricsAddr (nil without).
	endpoint *endpoint.Endpoint
}

// member is a running component with its own connection.
type member[T any] struct {
	c  T
	nc *nats.Conn
}

// Start starts the server (unless given), the coordinators and the nodes.
func Start(ctx context.Context, o Options) (*System, error) {
	if o.Cluster == "" {
		o.Cluster = "local"
	}
	if o.Coordinators <= 0 {
		o.Coordinators = 1
	}
	if o.Nodes < 0 {
		o.Nodes = 0
	} else if o.Nodes == 0 {
		o.Nodes = 1
	}
	codec, err := messages.NewCodec(o.Cluster, nil)
	if err != nil {
		return nil, err
	}
	s := &System{opts: o, Server: o.Server, Codec: codec, nodes: map[streamwal.NodeID]*member[*node.Node]{}}
	if s.Server == nil {
		if s.Server, err = embedded.Start(o.ServerOptions); err != nil {
			return nil, err
		}
		s.ownsSrv = true
	}
	if err := s.startEndpoint(); err != nil {
		s.Close()
		return nil, err
	}
	s.wireTracing()
	if s.admin, err = s.Server.Connect(o.connectOptions(MemberClient, nats.Name("streamwal-admin"))...); err != nil {
		s.Close()
		return nil, err
	}
	for range o.Coordinators {
		if _, err := s.AddCoordinator(ctx); err != nil {
			s.Close()
			return nil, err
		}
	}
	for range o.Nodes {
		if _, err := s.AddNode(ctx); err != nil {
			s.Close()
			return nil, err
		}
	}
	s.serveReady()
	return s, nil
}

// Conn is a connection for clients and checks, owned by the system.
func (s *System) Conn() *nats.Conn { return s.admin }

// connect opens a member's connection.
func (s *System) connect(name string, m Member) (*nats.Conn, error) {
	return s.Server.Connect(s.opts.connectOptions(m, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))...)
}

// AddCoordinator starts one more coordinator (a standby if one is active).
func (s *System) AddCoordinator(ctx context.Context) (*coord.Coordinator, error) {
	s.mu.Lock()
	s.nextID++
	id := fmt.Sprintf("coord-%d", s.nextID)
	s.mu.Unlock()
	nc, err := s.connect(id, MemberCoordinator)
	if err != nil {
		return nil, err
	}
	cfg := s.opts.Coord
	cfg.Conn, cfg.Cluster, cfg.ID, cfg.Logger = nc, s.opts.Cluster, id, s.opts.Logger
	c, err := coord.Start(ctx, cfg)
	if err != nil {
		nc.Close()
		return nil, err
	}
	s.mu.Lock()
	s.coords = append(s.coords, &member[*coord.Coordinator]{c: c, nc: nc})
	s.mu.Unlock()
	return c, nil
}

// Coordinators lists the running coordinators.
func (s *System) Coordinators() []*coord.Coordinator {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*coord.Coordinator, len(s.coords))
	for i, m := range s.coords {
		out[i] = m.c
	}
	return out
}

// Active returns the active coordinator, if any.
func (s *System) Active() (*coord.Coordinator, bool) {
	for _, c := range s.Coordinators() {
		if _, ok := c.Active(); ok {
			return c, true
		}
	}
	return nil, false
}

// StopCoordinator stops c: gracefully (it gives its lease back), or as a
// crash (the lease lapses).
func (s *System) StopCoordinator(c *coord.Coordinator, crash bool) {
	s.mu.Lock()
	var m *member[*coord.Coordinator]
	for i, x := range s.coords {
		if x.c == c {
			m = x
			s.coords = append(s.coords[:i], s.coords[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	if m == nil {
		return
	}
	if crash {
		m.c.Crash()
	} else {
		_ = m.c.Close()
	}
	m.nc.Close()
}

// AddNode starts one more node, under the next free ID.
func (s *System) AddNode(ctx context.Context) (*node.Node, error) {
	s.mu.Lock()
	s.nextID++
	id := streamwal.NodeID(fmt.Sprintf("node-%d", s.nextID))
	s.mu.Unlock()
	return s.StartNode(ctx, id)
}

// StartNode starts a node under id, which no running node of the system
// may have: a restart under a stable ID is StopNode then StartNode.
func (s *System) StartNode(ctx context.Context, id streamwal.NodeID) (*node.Node, error) {
	s.mu.Lock()
	_, running := s.nodes[id]
	s.mu.Unlock()
	if running {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "node %s is running", id)
	}
	nc, err := s.connect(string(id), MemberNode)
	if err != nil {
		return nil, err
	}
	cfg := s.opts.Node
	cfg.Conn, cfg.Codec, cfg.ID, cfg.Logger = nc, s.Codec, id, s.opts.Logger
	if s.Server.SyncAlways() {
		cfg.Backend.GroupCommit = true
	}
	n, err := node.Start(ctx, cfg)
	if err != nil {
		nc.Close()
		return nil, err
	}
	s.mu.Lock()
	s.nodes[id] = &member[*node.Node]{c: n, nc: nc}
	s.mu.Unlock()
	return n, nil
}

// Nodes lists the running nodes.
func (s *System) Nodes() []*node.Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*node.Node, 0, len(s.nodes))
	for _, m := range s.nodes {
		out = append(out, m.c)
	}
	return out
}

// Local is the system's nodes as a client's local bypass: pass it to
// client.WithLocal so that a client in this process appends to the WAL of
// a PChannel one of these nodes serves directly, without a request
// through NATS.
func (s *System) Local() *LocalNodes { return &LocalNodes{s: s} }

// LocalNodes appends to the WALs the running nodes of a System serve (it
// implements client.Local).
type LocalNodes struct{ s *System }

// AppendLocal appends msgs to p through the node of the system that
// serves it; served is false when none does (see node.Node.AppendLocal).
func (l *LocalNodes) AppendLocal(ctx context.Context, c streamwal.Cluster, p streamwal.PChannel, msgs []*messages.MutableMessage) ([]*messages.ImmutableMessage, []error, bool) {
	l.s.mu.Lock()
	nodes := make([]*node.Node, 0, len(l.s.nodes))
	for _, m := range l.s.nodes {
		nodes = append(nodes, m.c)
	}
	l.s.mu.Unlock()
	for _, n := range nodes {
		if out, errs, ok := n.AppendLocal(ctx, c, p, msgs); ok {
			return out, errs, true
		}
	}
	return nil, nil, false
}

// StopNode stops a node: gracefully (goodbye, WALs closed), or as a crash
// (its connection dropped, nothing said).
func (s *System) StopNode(id streamwal.NodeID, crash bool) {
	s.mu.Lock()
	m := s.nodes[id]
	delete(s.nodes, id)
	s.mu.Unlock()
	if m == nil {
		return
	}
	if crash {
		m.nc.Close()
		m.c.Crash()
	} else {
		_ = m.c.Close()
		m.nc.Close()
	}
}

// View asks the active coordinator for the assignment view.
func (s *System) View(ctx context.Context) (wire.View, error) {
	var v wire.View
	err := wire.Call(ctx, s.admin, s.opts.Cluster.CoordSubject(streamwal.CoordStatus), struct{}{}, &v)
	return v, err
}

// WaitServing waits until every PChannel is ASSIGNED to a live node that
// confirmed it serves it and, if balanced, until no node has more than one
// PChannel more than another.
func (s *System) WaitServing(ctx context.Context, balanced bool) (wire.View, error) {
	return s.WaitView(ctx, func(v wire.View) bool { return serving(v, balanced) })
}

// WaitView polls the coordinator's view until ready accepts it, or ctx
// ends.
func (s *System) WaitView(ctx context.Context, ready func(wire.View) bool) (wire.View, error) {
	for {
		v, err := s.View(ctx)
		if err == nil && ready(v) {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("cluster not serving (last view %+v, err %v): %w", v, err, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// serving reports whether every channel is assigned (and balanced).
func serving(v wire.View, balanced bool) bool {
	if len(v.Channels) == 0 || len(v.Nodes) == 0 {
		return false
	}
	count := map[string]int{}
	for _, n := range v.Nodes {
		count[n] = 0
	}
	for _, a := range v.Channels {
		if a.State != wire.Assigned || !a.Serving {
			return false
		}
		if _, ok := count[a.Node]; !ok {
			return false
		}
		count[a.Node]++
	}
	if !balanced {
		return true
	}
	lo, hi := len(v.Channels), 0
	for _, c := range count {
		lo, hi = min(lo, c), max(hi, c)
	}
	return hi-lo <= 1
}

// Crash stops every coordinator and node as a crash of the process
// would (no lease given back, no goodbye), leaving the server (even one
// it started) running, so that a new System can start on it as a
// restarted process would.
func (s *System) Crash() {
	for _, c := range s.Coordinators() {
		s.StopCoordinator(c, true)
	}
	for _, n := range s.Nodes() {
		s.StopNode(n.ID(), true)
	}
	if s.admin != nil {
		s.admin.Close()
	}
	s.closeEndpoint()
}

// Close stops the coordinators (so that they do not reassign what the
// nodes give up), the nodes and (if it started it) the server.
func (s *System) Close() {
	for _, c := range s.Coordinators() {
		s.StopCoordinator(c, false)
	}
	for _, n := range s.Nodes() {
		s.StopNode(n.ID(), false)
	}
	if s.admin != nil {
		s.admin.Close()
	}
	s.closeEndpoint()
	if s.ownsSrv && s.Server != nil {
		s.Server.Shutdown()
	}
}
