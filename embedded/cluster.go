package embedded

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

const (
	// DefaultClusterName is the cluster name used when ClusterOptions.Name
	// is empty.
	DefaultClusterName = "streamwal"
	// DefaultClusterSize is the number of servers used when
	// ClusterOptions.Size is zero.
	DefaultClusterSize = 3
	// maxBindAttempts bounds the retries of a cluster start whose
	// pre-picked route ports were taken by someone else in the meantime.
	maxBindAttempts = 5
)

// ClusterOptions configures a JetStream cluster started by [StartCluster].
type ClusterOptions struct {
	// BaseDir is the directory under which every member gets its own store
	// directory, named after the member. Required.
	BaseDir string

	// Name is the cluster name. Default "streamwal" ([DefaultClusterName]).
	Name string

	// Size is the number of servers. Default 3 ([DefaultClusterSize]);
	// at least 2. Three servers tolerate the loss of one.
	Size int

	// Server is the template for every member. Its StoreDir, Port and
	// ServerName must be left empty: each member gets BaseDir/<name>, a free
	// client port and the name "<Name>-<index>". Host is also the route
	// listen address; StartTimeout also bounds the wait for a JetStream meta
	// leader.
	Server Options
}

// Validate reports whether o is usable by [StartCluster]. The returned
// error wraps [ErrInvalidOptions].
func (o ClusterOptions) Validate() error {
	if o.BaseDir == "" {
		return invalid("cluster BaseDir is required")
	}
	if strings.ContainsAny(o.Name, " \t\r\n") {
		return invalid("cluster Name %q contains whitespace", o.Name)
	}
	if o.Size != 0 && o.Size < 2 {
		return invalid("cluster Size %d is below 2", o.Size)
	}
	if o.Server.StoreDir != "" || o.Server.Port != 0 || o.Server.ServerName != "" {
		return invalid("cluster Server template must not set StoreDir, Port or ServerName")
	}
	if o.Server.HTTPPort > 0 {
		return invalid("cluster Server template HTTPPort must be 0 (off) or -1 (a free port for each member)")
	}
	tpl := o.Server
	tpl.StoreDir = o.BaseDir
	if err := tpl.Validate(); err != nil {
		return fmt.Errorf("cluster Server template: %w", err)
	}
	return nil
}

func (o ClusterOptions) withDefaults() ClusterOptions {
	if o.Name == "" {
		o.Name = DefaultClusterName
	}
	if o.Size == 0 {
		o.Size = DefaultClusterSize
	}
	o.Server = o.Server.withDefaults()
	o.Server.ServerName = ""
	return o
}

// Cluster is a JetStream cluster of embedded servers connected by routes.
// Its methods are safe for concurrent use.
type Cluster struct {
	name    string
	timeout time.Duration
	servers []*Server
}

// StartCluster validates opts, starts the cluster members and waits until
// every member is ready, a JetStream meta leader is elected and it sees all
// members, or until opts.Server.StartTimeout expires (per phase).
func StartCluster(opts ClusterOptions) (*Cluster, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	var err error
	for range maxBindAttempts {
		var c *Cluster
		if c, err = startClusterOnce(o); err == nil {
			return c, nil
		}
		if !errors.Is(err, errBind) {
			break
		}
	}
	return nil, fmt.Errorf("embedded: start cluster %q: %w", o.Name, err)
}

func startClusterOnce(o ClusterOptions) (*Cluster, error) {
	ports, err := freePorts(o.Server.Host, o.Size)
	if err != nil {
		return nil, err
	}
	c := &Cluster{name: o.Name, timeout: o.Server.StartTimeout}
	for i := range o.Size {
		c.servers = append(c.servers, newMember(o, i, ports))
	}
	for _, m := range c.servers {
		if err := m.start(); err != nil {
			c.Shutdown()
			return nil, err
		}
	}
	if err := c.WaitHealthy(c.timeout); err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

// newMember builds (without starting) member i of a cluster whose members
// listen for routes on routePorts.
func newMember(o ClusterOptions, i int, routePorts []int) *Server {
	opts := o.Server
	opts.ServerName = o.Name + "-" + strconv.Itoa(i)
	opts.StoreDir = filepath.Join(o.BaseDir, opts.ServerName)
	m := &memberConfig{clusterName: o.Name, routePort: routePorts[i]}
	for j, p := range routePorts {
		if j != i {
			m.routes = append(m.routes, routeURL(o.Server.Host, p))
		}
	}
	return &Server{opts: opts, member: m}
}

func routeURL(host string, port int) *url.URL {
	return &url.URL{Scheme: "nats-route", Host: net.JoinHostPort(connectHost(host), strconv.Itoa(port))}
}

// freePorts returns n distinct ports that were free on host a moment ago.
func freePorts(host string, n int) ([]int, error) {
	ports := make([]int, 0, n)
	// Keep every listener open until all ports are picked so that the
	// ports are distinct; they are closed when freePorts returns.
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("embedded: pick a free port on %s: %w", host, err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Name returns the cluster name.
func (c *Cluster) Name() string { return c.name }

// Servers returns the members, indexed like [Cluster.StopServer].
func (c *Cluster) Servers() []*Server {
	return append([]*Server(nil), c.servers...)
}

// ClientURLs returns the client URL of every member (running or not), in
// member order. strings.Join(urls, ",") is a valid nats.Connect URL.
func (c *Cluster) ClientURLs() []string {
	urls := make([]string, len(c.servers))
	for i, s := range c.servers {
		urls[i] = s.ClientURL()
	}
	return urls
}

// Connect connects a NATS client to the cluster, which may use any member.
func (c *Cluster) Connect(opts ...nats.Option) (*nats.Conn, error) {
	u := strings.Join(c.ClientURLs(), ",")
	nc, err := nats.Connect(u, opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded: connect to cluster %q: %w", c.name, err)
	}
	return nc, nil
}

// Shutdown stops every member. It is idempotent.
func (c *Cluster) Shutdown() {
	for _, s := range c.servers {
		s.Shutdown()
	}
}

// StopServer shuts member i down, keeping its ports and store directory for
// [Cluster.RestartServer]. It does not wait for the remaining members to
// elect a new leader; use [Cluster.WaitHealthy] for that.
func (c *Cluster) StopServer(i int) error {
	s, err := c.member(i)
	if err != nil {
		return err
	}
	s.Shutdown()
	return nil
}

// RestartServer (re)starts member i on its ports and store directory and
// waits until the cluster is healthy again (see [Cluster.WaitHealthy]).
func (c *Cluster) RestartServer(i int) error {
	s, err := c.member(i)
	if err != nil {
		return err
	}
	if err := s.Restart(); err != nil {
		return fmt.Errorf("embedded: cluster %q: %w", c.name, err)
	}
	return c.WaitHealthy(c.timeout)
}

func (c *Cluster) member(i int) (*Server, error) {
	if i < 0 || i >= len(c.servers) {
		return nil, fmt.Errorf("embedded: cluster %q has no server %d", c.name, i)
	}
	return c.servers[i], nil
}

// Leader returns the member that is the JetStream meta leader, or nil if
// no running member is.
func (c *Cluster) Leader() *Server {
	for _, s := range c.servers {
		if ns := s.NATSServer(); ns != nil && ns.JetStreamIsLeader() {
			return s
		}
	}
	return nil
}

// WaitHealthy polls until a running member is the JetStream meta leader,
// the leader sees every running member as an online peer, and every running
// member is current with the meta group; or until timeout expires.
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	if err := poll(timeout, c.healthy); err != nil {
		return fmt.Errorf("embedded: cluster %q not healthy: %w", c.name, err)
	}
	return nil
}

func (c *Cluster) healthy() (bool, error) {
	leader := c.Leader()
	if leader == nil {
		return false, nil
	}
	ln := leader.NATSServer()
	if ln == nil {
		return false, nil
	}
	running := 0
	for _, s := range c.servers {
		ns := s.NATSServer()
		if ns == nil {
			continue
		}
		running++
		if !ns.JetStreamIsCurrent() {
			return false, nil
		}
	}
	return len(ln.JetStreamClusterPeers()) == running, nil
}
