package auth

import (
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/streamwal/streamwal"
)

// Role is one of the four kinds of NATS user of a streamwal cluster.
type Role string

// The roles. Their names are also the base names of their seed files
// ("coord.nk", ...).
const (
	// RoleCoordinator runs `streamwal coord` (and serve's coordinator).
	RoleCoordinator Role = "coord"
	// RoleNode runs `streamwal node` (and serve's node).
	RoleNode Role = "node"
	// RoleClient appends, broadcasts, reads and asks for status: the
	// client library and the client commands of the CLI.
	RoleClient Role = "client"
	// RoleAdmin may do anything: operators, `streamwal pchannel
	// accept-loss`, `streamwal bench`, the nats CLI.
	RoleAdmin Role = "admin"
)

// Roles lists every role, in the order auth.conf lists their users.
var Roles = []Role{RoleCoordinator, RoleNode, RoleClient, RoleAdmin}

// ResponseExpiry is how long a coordinator or a node may take to answer a
// request it received (nats-server's allow_responses): a broadcast waits
// for other broadcasts' keys and for its callback, and a client may wait
// up to an hour for it.
const ResponseExpiry = time.Hour

// ParseRole validates a role name.
func ParseRole(s string) (Role, error) {
	if r := Role(s); slices.Contains(Roles, r) {
		return r, nil
	}
	return "", streamwal.Errorf(streamwal.CodeInvalidArgument, "unknown role %q: want one of coord, node, client, admin", s)
}

// Spec is what the permissions are derived from: the cluster's name and
// its PChannels (JetStream API subjects name a stream in one token, so the
// permissions on the WAL streams name each stream).
type Spec struct {
	Cluster   streamwal.Cluster
	PChannels []streamwal.PChannel
}

// NewSpec is the spec of cluster c with count PChannels named
// "<prefix>-<i>", as a coordinator creates them.
func NewSpec(c streamwal.Cluster, prefix string, count int) (Spec, error) {
	if _, err := streamwal.ParseCluster(string(c)); err != nil {
		return Spec{}, err
	}
	ps, err := streamwal.PChannels(prefix, count)
	if err != nil {
		return Spec{}, err
	}
	return Spec{Cluster: c, PChannels: ps}, nil
}

// rules are the subjects one role may publish and subscribe to.
type rules struct {
	pub, sub []string
	// respond allows answers to the requests the role receives.
	respond bool
}

// Permissions are r's NATS permissions in cluster s.Cluster.
func (s Spec) Permissions(r Role) (*server.Permissions, error) {
	var rs rules
	switch r {
	case RoleCoordinator:
		rs = s.coordinator()
	case RoleNode:
		rs = s.node()
	case RoleClient:
		rs = s.client()
	case RoleAdmin:
		rs = rules{pub: []string{streamwal.FullWildcard}, sub: []string{streamwal.FullWildcard}}
	default:
		_, err := ParseRole(string(r))
		return nil, err
	}
	p := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: rs.pub},
		Subscribe: &server.SubjectPermission{Allow: rs.sub},
	}
	if rs.respond {
		p.Response = &server.ResponsePermission{MaxMsgs: 1, Expires: ResponseExpiry}
	}
	return p, nil
}

// coordinator: every KV bucket of the cluster (it provisions them), the
// writes of its own state (every bucket but the nodes' registry and the
// nodes' checkpoints), its request subjects, and the requests it makes of
// nodes (open, close, and the appends of broadcasts).
func (s Spec) coordinator() rules {
	c := s.Cluster
	pub := []string{streamwal.JSAccountInfo, c.NodeWildcard(streamwal.NodeOpen), c.NodeWildcard(streamwal.NodeClose),
		c.AppendWildcard()}
	for _, b := range streamwal.Buckets {
		name := c.BucketName(b)
		pub = append(pub, provision(streamwal.KVStreamName(name))...)
		if b != streamwal.BucketNodes && b != streamwal.BucketCheckpoints {
			pub = append(pub, streamwal.KVWildcard(name))
		}
	}
	return rules{pub: pub, sub: []string{c.CoordWildcard(), streamwal.InboxWildcard}, respond: true}
}

// node: its WAL streams (created, written through `wal.<c>.>`, read,
// truncated), the object store of archived ranges and flushed segments,
// its checkpoints and its registration, the time oracle, the allocation
// of the collections a secondary's replicated DDL creates and drops
// (package replicate), live ticks, the
// requests it answers (appends, open, close, status), and reads of the
// coordinator's lease and assignment view (its readiness), and the
// replicate checkpoints of its PChannels. It may also ask
// the servers for their JetStream settings (`streamwal node
// --group-commit auto`; only users of the system account get an answer).
func (s Spec) node() rules {
	c := s.Cluster
	pub := []string{streamwal.JSAccountInfo, streamwal.ServerJSZPing, c.WALWildcard(), c.LiveWildcard(),
		c.CoordSubject(streamwal.CoordTSO), c.CoordSubject(streamwal.CoordAllocate), c.CoordSubject(streamwal.CoordRelease)}
	for _, p := range s.PChannels {
		pub = append(pub, provision(c.StreamName(p))...)
		pub = append(pub, streamwal.JSAPISubject(streamwal.JSStreamPurge, c.StreamName(p)))
	}
	objects := c.ObjectStoreName(streamwal.ObjectStoreSegments)
	pub = append(pub, provision(streamwal.ObjectStreamName(objects))...)
	pub = append(pub, streamwal.JSAPISubject(streamwal.JSStreamPurge, streamwal.ObjectStreamName(objects)),
		streamwal.ObjectWildcard(objects))
	checkpoints := c.BucketName(streamwal.BucketCheckpoints)
	pub = append(pub, provision(streamwal.KVStreamName(checkpoints))...)
	pub = append(pub, streamwal.KVWildcard(checkpoints))
	nodes := c.BucketName(streamwal.BucketNodes)
	pub = append(pub, read(streamwal.KVStreamName(nodes))...)
	// Durable subscription positions hold the log: truncation reads them.
	pub = append(pub, read(streamwal.KVStreamName(c.BucketName(streamwal.BucketSubscriptions)))...)
	// Readiness follows the coordinator's lease and assignment view.
	for _, b := range []streamwal.Bucket{streamwal.BucketLeader, streamwal.BucketAssignments} {
		pub = append(pub, read(streamwal.KVStreamName(c.BucketName(b)))...)
	}
	pub = append(pub, streamwal.KVWildcard(nodes))
	// A secondary's replicators keep their checkpoints (status and lag),
	// each under its PChannel's key only: the topology is the
	// coordinator's.
	repl := c.BucketName(streamwal.BucketReplication)
	pub = append(pub, read(streamwal.KVStreamName(repl))...)
	for _, p := range s.PChannels {
		pub = append(pub, streamwal.KVKeySubject(repl, streamwal.ReplicateCheckpointKey(p)))
	}
	sub := []string{c.AppendWildcard(), streamwal.InboxWildcard, c.LiveWildcard()}
	for _, op := range []streamwal.NodeOp{streamwal.NodeOpen, streamwal.NodeClose, streamwal.NodeStatus} {
		sub = append(sub, c.NodeWildcard(op))
	}
	return rules{pub: pub, sub: sub, respond: true}
}

// clientOps are the coordinator requests a client makes: everything but
// the time oracle (the nodes') and balance (an operator's).
var clientOps = []streamwal.CoordOp{streamwal.CoordStatus, streamwal.CoordBroadcast, streamwal.CoordBroadcastAck,
	streamwal.CoordAllocate, streamwal.CoordRelease}

// client: append requests, its coordinator requests, and reads: consumers
// and gets on the WAL streams (with acknowledgements, for positions kept
// in durable consumers), the object store (reads below a stream's
// truncation point, flushed segments), the checkpoints (status) and the
// replication bucket (`replicate status`); and
// the subscriptions bucket, where durable subscriptions keep their
// positions and groups their leases (read and written: the only bucket a
// client writes).
func (s Spec) client() rules {
	c := s.Cluster
	pub := []string{c.AppendWildcard()}
	for _, op := range clientOps {
		pub = append(pub, c.CoordSubject(op))
	}
	for _, p := range s.PChannels {
		pub = append(pub, read(c.StreamName(p))...)
		pub = append(pub, streamwal.JSAckWildcards(c.StreamName(p))...)
	}
	pub = append(pub, read(streamwal.ObjectStreamName(c.ObjectStoreName(streamwal.ObjectStoreSegments)))...)
	pub = append(pub, read(streamwal.KVStreamName(c.BucketName(streamwal.BucketCheckpoints)))...)
	// Replication's topology and checkpoints (`replicate status`).
	pub = append(pub, read(streamwal.KVStreamName(c.BucketName(streamwal.BucketReplication)))...)
	subs := c.BucketName(streamwal.BucketSubscriptions)
	pub = append(pub, read(streamwal.KVStreamName(subs))...)
	pub = append(pub, streamwal.KVWildcard(subs))
	// The info of the lease bucket's stream: when no coordinator answers
	// (a takeover), the client looks whether the cluster exists at all.
	pub = append(pub, streamwal.JSAPISubject(streamwal.JSStreamInfo, streamwal.KVStreamName(c.BucketName(streamwal.BucketLeader))))
	return rules{pub: pub, sub: []string{streamwal.InboxWildcard, c.LiveWildcard()}}
}

// read are the requests that read stream: its info, gets (direct and
// through the leader), consumers (created, asked for their info, fetched
// from, deleted) and the flow-control replies of push consumers (KV
// watches and object reads use them).
func read(stream string) []string {
	out := []string{
		streamwal.JSAPISubject(streamwal.JSStreamInfo, stream),
		streamwal.JSAPISubject(streamwal.JSDirectGet, stream),
		streamwal.JSAPIWildcard(streamwal.JSDirectGet, stream),
		streamwal.JSAPISubject(streamwal.JSStreamMsgGet, stream),
		streamwal.JSAPISubject(streamwal.JSConsumerCreate, stream),
		streamwal.JSAPIWildcard(streamwal.JSConsumerCreate, stream),
		streamwal.JSAPIWildcard(streamwal.JSConsumerInfo, stream),
		streamwal.JSAPIWildcard(streamwal.JSConsumerDelete, stream),
		streamwal.JSAPIWildcard(streamwal.JSConsumerNext, stream),
	}
	return append(out, streamwal.JSFlowControlWildcards(stream)...)
}

// provision are read's requests plus the creation and update of stream.
func provision(stream string) []string {
	return append(read(stream),
		streamwal.JSAPISubject(streamwal.JSStreamCreate, stream),
		streamwal.JSAPISubject(streamwal.JSStreamUpdate, stream))
}
