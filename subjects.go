package streamwal

import (
	"strconv"
	"strings"
)

// This file is the only place in the code base that names NATS subjects,
// streams, KV buckets and object stores. See the package doc for the layout.

// Subject roots. The stream of a PChannel captures "wal.<c>.<p>.>"; the api
// and live roots are never captured by any stream.
const (
	walRoot  = "wal"
	apiRoot  = "walapi"
	liveRoot = "wallive"
	// StreamPrefix starts the name of every PChannel stream.
	StreamPrefix = "WAL_"
	// scopeV and scopeP separate VChannel-scoped from PChannel-level subjects.
	scopeV = "v"
	scopeP = "p"
)

// MaxTokenLen bounds a message type's subject token.
const MaxTokenLen = 48

// Token is a validated subject token for a message type: 1 to 48 lower-case
// ASCII letters, digits or '_', starting with a letter ("insert",
// "createcollection"). The message registry derives one per type.
type Token string

// ParseToken validates a type token.
func ParseToken(s string) (Token, error) {
	if s == "" || len(s) > MaxTokenLen {
		return "", invalidName("type token", s, "must be 1 to 48 bytes")
	}
	if s[0] < 'a' || s[0] > 'z' {
		return "", invalidName("type token", s, "must start with a lower-case letter")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return "", invalidName("type token", s, "only lower-case letters, digits and '_' are allowed")
		}
	}
	return Token(s), nil
}

// StreamName is the JetStream stream of p: "WAL_<c>_<p>".
func (c Cluster) StreamName(p PChannel) string {
	return StreamPrefix + string(c) + "_" + p.String()
}

// ParseStreamName returns the PChannel of one of c's stream names.
func (c Cluster) ParseStreamName(name string) (PChannel, error) {
	prefix := StreamPrefix + string(c) + "_"
	if !strings.HasPrefix(name, prefix) {
		return PChannel{}, invalidName("stream", name, "want "+prefix+"<pchannel>")
	}
	return ParsePChannel(name[len(prefix):])
}

// StreamSubjects are the subjects the stream of p captures.
func (c Cluster) StreamSubjects(p PChannel) []string {
	return []string{c.pchannelRoot(p) + ".>"}
}

func (c Cluster) pchannelRoot(p PChannel) string {
	return walRoot + "." + string(c) + "." + p.String()
}

// VChannelSubject is the subject of a message of type t scoped to v:
// "wal.<c>.<p>.v.<suffix>.<t>".
func (c Cluster) VChannelSubject(v VChannel, t Token) string {
	return c.pchannelRoot(v.PChannel()) + "." + scopeV + "." + v.Suffix() + "." + string(t)
}

// PChannelSubject is the subject of a PChannel-level message of type t (time
// ticks, barriers, cluster barriers): "wal.<c>.<p>.p.<t>".
func (c Cluster) PChannelSubject(p PChannel, t Token) string {
	return c.pchannelRoot(p) + "." + scopeP + "." + string(t)
}

// VChannelFilter is what a reader of v subscribes to: v's own subjects plus
// the PChannel-level subjects of its PChannel.
func (c Cluster) VChannelFilter(v VChannel) []string {
	root := c.pchannelRoot(v.PChannel())
	return []string{root + "." + scopeV + "." + v.Suffix() + ".*", root + "." + scopeP + ".*"}
}

// AllVChannelsFilter matches every VChannel-scoped message of p:
// "wal.<c>.<p>.v.>".
func (c Cluster) AllVChannelsFilter(p PChannel) string {
	return c.pchannelRoot(p) + "." + scopeV + ".>"
}

// PChannelLevelFilter matches every PChannel-level message of p:
// "wal.<c>.<p>.p.*".
func (c Cluster) PChannelLevelFilter(p PChannel) string {
	return c.pchannelRoot(p) + "." + scopeP + ".*"
}

// PChannelTypeFilters match every message of type t stored in p's stream,
// VChannel-scoped or PChannel-level: "wal.<c>.<p>.v.*.<t>" and
// "wal.<c>.<p>.p.<t>".
func (c Cluster) PChannelTypeFilters(p PChannel, t Token) []string {
	root := c.pchannelRoot(p)
	return []string{root + "." + scopeV + ".*." + string(t), root + "." + scopeP + "." + string(t)}
}

// PChannelFilter is what a reader of every message of p subscribes to.
func (c Cluster) PChannelFilter(p PChannel) []string {
	return c.StreamSubjects(p)
}

// TypeFilter matches messages of type t on every VChannel of every PChannel
// of c: "wal.<c>.*.v.*.<t>".
func (c Cluster) TypeFilter(t Token) string {
	return walRoot + "." + string(c) + ".*." + scopeV + ".*." + string(t)
}

// Address is what a stored subject says about its message.
type Address struct {
	PChannel PChannel
	// VChannel is zero for a PChannel-level message.
	VChannel VChannel
	Type     Token
}

// ParseSubject decodes a stored message subject of cluster c. On error the
// Address is zero.
func (c Cluster) ParseSubject(subject string) (Address, error) {
	a, err := c.parseSubject(subject)
	if err != nil {
		return Address{}, Errorf(CodeInvalidArgument, "subject %q: %w", subject, err)
	}
	return a, nil
}

func (c Cluster) parseSubject(subject string) (Address, error) {
	parts := strings.Split(subject, ".")
	if len(parts) < 5 || parts[0] != walRoot || parts[1] != string(c) {
		return Address{}, invalidName("subject", subject, "want wal."+string(c)+".<pchannel>.{v.<vchannel>|p}.<type>")
	}
	p, err := ParsePChannel(parts[2])
	if err != nil {
		return Address{}, err
	}
	switch {
	case parts[3] == scopeP && len(parts) == 5:
		t, err := ParseToken(parts[4])
		return Address{PChannel: p, Type: t}, err
	case parts[3] == scopeV && len(parts) == 6:
		v, err := p.parseSuffix(parts[4])
		if err != nil {
			return Address{}, err
		}
		t, err := ParseToken(parts[5])
		return Address{PChannel: p, VChannel: v, Type: t}, err
	}
	return Address{}, invalidName("subject", subject, "want a .v.<vchannel>.<type> or .p.<type> scope")
}

// LiveTickSubject carries the non-persisted time ticks of p on core NATS.
func (c Cluster) LiveTickSubject(p PChannel) string {
	return liveRoot + "." + string(c) + "." + p.String() + ".tick"
}

// AppendSubject is the request subject for appends to p, answered only by
// p's current owner.
func (c Cluster) AppendSubject(p PChannel) string {
	return apiRoot + "." + string(c) + ".append." + p.String()
}

// CoordOp names a coordinator request.
type CoordOp string

// The coordinator's requests.
const (
	CoordTSO          CoordOp = "tso"
	CoordBroadcast    CoordOp = "broadcast"
	CoordBroadcastAck CoordOp = "broadcast-ack"
	CoordAllocate     CoordOp = "allocate"
	CoordRelease      CoordOp = "release"
	CoordBalance      CoordOp = "balance"
	CoordStatus       CoordOp = "status"
)

// CoordSubject is the request subject of a coordinator operation, answered
// by the active coordinator.
func (c Cluster) CoordSubject(op CoordOp) string {
	return apiRoot + "." + string(c) + ".coord." + string(op)
}

// NodeID is a validated StreamingNode identity (same rules as a cluster
// name, up to 64 bytes).
type NodeID string

// MaxNodeIDLen bounds a node ID.
const MaxNodeIDLen = 64

// ParseNodeID validates a node ID.
func ParseNodeID(s string) (NodeID, error) {
	if err := checkWord("node id", s, MaxNodeIDLen); err != nil {
		return "", err
	}
	return NodeID(s), nil
}

// NodeOp names a request answered by one node.
type NodeOp string

// The node's requests.
const (
	NodeOpen   NodeOp = "open"
	NodeClose  NodeOp = "close"
	NodeStatus NodeOp = "status"
)

// NodeSubject is the request subject of an operation on one node.
func (c Cluster) NodeSubject(n NodeID, op NodeOp) string {
	return apiRoot + "." + string(c) + ".node." + string(n) + "." + string(op)
}

// APIWildcard matches every request subject of c (for permissions).
func (c Cluster) APIWildcard() string { return apiRoot + "." + string(c) + ".>" }

// WALWildcard matches every stored subject of c (for permissions).
func (c Cluster) WALWildcard() string { return walRoot + "." + string(c) + ".>" }

// Bucket names one of the cluster's KV buckets.
type Bucket string

// The KV buckets of a cluster.
const (
	// BucketLeader holds the coordinator lease.
	BucketLeader Bucket = "leader"
	// BucketTSO holds the timestamp oracle's persisted upper bound.
	BucketTSO Bucket = "tso"
	// BucketNodes is the node registry (per-key TTL heartbeats).
	BucketNodes Bucket = "nodes"
	// BucketAssignments is the versioned PChannel assignment view.
	BucketAssignments Bucket = "assignments"
	// BucketVChannels is the VChannel allocation and the CChannel placement.
	BucketVChannels Bucket = "vchannels"
	// BucketBroadcast holds broadcast tasks and tombstones.
	BucketBroadcast Bucket = "broadcast"
	// BucketCheckpoints holds the recovery checkpoints of PChannels.
	BucketCheckpoints Bucket = "checkpoints"
	// BucketReplication holds the replication topology and checkpoints.
	BucketReplication Bucket = "replication"
	// BucketSubscriptions holds the durable subscriptions of clients,
	// their acknowledged positions and the leases of their groups.
	BucketSubscriptions Bucket = "subscriptions"
)

// Buckets lists every KV bucket of a cluster.
var Buckets = []Bucket{BucketLeader, BucketTSO, BucketNodes, BucketAssignments,
	BucketVChannels, BucketBroadcast, BucketCheckpoints, BucketReplication, BucketSubscriptions}

// BucketName is the KV bucket name "wal_<c>_<b>".
func (c Cluster) BucketName(b Bucket) string {
	return walRoot + "_" + string(c) + "_" + string(b)
}

// ClusterOfBucket is the cluster whose bucket b is called name, and
// whether name is such a bucket: the inverse of BucketName.
func ClusterOfBucket(name string, b Bucket) (Cluster, bool) {
	rest, ok := strings.CutPrefix(name, walRoot+"_")
	if !ok {
		return "", false
	}
	rest, ok = strings.CutSuffix(rest, "_"+string(b))
	if !ok {
		return "", false
	}
	c, err := ParseCluster(rest)
	if err != nil || c.BucketName(b) != name {
		return "", false
	}
	return c, true
}

// ObjectStoreSegments names the object store of flushed segment data.
const ObjectStoreSegments = "segments"

// ObjectStoreName is the object store bucket "wal_<c>_<name>".
func (c Cluster) ObjectStoreName(name string) string {
	return walRoot + "_" + string(c) + "_" + name
}

// Keys of the KV buckets. A PChannel's assignment is under its name in
// BucketAssignments, a node's registration under its ID in BucketNodes.
const (
	// KeyLeader is the coordinator lease in BucketLeader.
	KeyLeader = "lease"
	// KeyTSOBound is the oracle's persisted upper bound in BucketTSO.
	KeyTSOBound = "bound"
	// KeyView is the versioned assignment view in BucketAssignments.
	KeyView = "view"
	// KeyCollections is the VChannel allocation and the CChannel
	// placement in BucketVChannels.
	KeyCollections = "collections"
)

// AssignmentKey is p's key in BucketAssignments.
func AssignmentKey(p PChannel) string { return "pchannel." + p.String() }

// NodeKey is n's key in BucketNodes.
func NodeKey(n NodeID) string { return "node." + string(n) }

// BroadcastTaskKey is broadcast task id's key in BucketBroadcast.
func BroadcastTaskKey(id uint64) string { return "task." + strconv.FormatUint(id, 10) }

// BroadcastTaskPrefix prefixes every broadcast task key.
const BroadcastTaskPrefix = "task."

// Keys of BucketSubscriptions: a durable subscription's record under
// "sub.<name>", its acknowledged position on each of its VChannels under
// "pos.<name>.<vchannel>", and, for a group, the lease of each VChannel
// under "lease.<name>.<vchannel>" and each live member under
// "member.<name>.<member>".
const (
	// SubscriptionPrefix prefixes every subscription record key.
	SubscriptionPrefix = "sub."
	// SubscriptionPositionPrefix prefixes every position key.
	SubscriptionPositionPrefix = "pos."
	// SubscriptionLeasePrefix prefixes every group lease key.
	SubscriptionLeasePrefix = "lease."
	// SubscriptionMemberPrefix prefixes every group member key.
	SubscriptionMemberPrefix = "member."
)

// MaxSubscriptionNameLen bounds the name of a durable subscription.
const MaxSubscriptionNameLen = 64

// CheckSubscriptionName validates the name of a durable subscription (or
// group): 1 to 64 ASCII letters, digits or '-', starting with a letter or
// digit, so that it is one token of a KV key.
func CheckSubscriptionName(name string) error {
	return checkWord("subscription name", name, MaxSubscriptionNameLen)
}

// SubscriptionKey is subscription name's record in BucketSubscriptions.
func SubscriptionKey(name string) string { return SubscriptionPrefix + name }

// SubscriptionPositionKey is the acknowledged position of subscription
// name on v in BucketSubscriptions.
func SubscriptionPositionKey(name string, v VChannel) string {
	return SubscriptionPositionPrefix + name + "." + v.String()
}

// SubscriptionLeaseKey is the lease of group name on v in
// BucketSubscriptions: the member that holds it reads v.
func SubscriptionLeaseKey(name string, v VChannel) string {
	return SubscriptionLeasePrefix + name + "." + v.String()
}

// SubscriptionMemberKey is member's heartbeat in group name in
// BucketSubscriptions.
func SubscriptionMemberKey(name, member string) string {
	return SubscriptionMemberPrefix + name + "." + member
}

// Keys of a PChannel's recovery storage in BucketCheckpoints (DESIGN.md
// §10), all under "pchannel.<p>.": the node writes the VChannel and segment
// metadata before the checkpoint that covers them.
const recoveryPrefix = "pchannel."

// CheckpointKey is p's recovery checkpoint in BucketCheckpoints.
func CheckpointKey(p PChannel) string { return recoveryPrefix + p.String() + ".checkpoint" }

// VChannelMetaKey is the VChannel metadata of p in BucketCheckpoints.
func VChannelMetaKey(p PChannel) string { return recoveryPrefix + p.String() + ".vchannels" }

// SegmentMetaKey is the segment metadata of p in BucketCheckpoints.
func SegmentMetaKey(p PChannel) string { return recoveryPrefix + p.String() + ".segments" }

// AcceptLossKey is where `streamwal pchannel accept-loss` records an
// operator's consent to serve p above a detected loss of its history.
func AcceptLossKey(p PChannel) string { return recoveryPrefix + p.String() + ".accept-loss" }

// Keys of BucketReplication (DESIGN.md §11): the cluster's replication
// topology as of the last AlterReplicateConfig that landed on every
// PChannel (the coordinator writes it), and per PChannel of a secondary
// the replicate checkpoint, where its replicator has read the primary
// through (the replicator of the node that owns the PChannel writes it).
const (
	// KeyReplicateTopology is the topology in BucketReplication.
	KeyReplicateTopology = "topology"
	// ReplicateCheckpointPrefix prefixes every replicate checkpoint key.
	ReplicateCheckpointPrefix = "pchannel."
)

// ReplicateCheckpointKey is p's replicate checkpoint in BucketReplication.
func ReplicateCheckpointKey(p PChannel) string {
	return ReplicateCheckpointPrefix + p.String() + ".checkpoint"
}

// Object names in the ObjectStoreSegments store. IDs are zero-padded to 20
// digits so that names sort by position.

// ArchivePrefix prefixes every archived range of p's stream.
func ArchivePrefix(p PChannel) string { return "log." + p.String() + "." }

// ArchiveObjectName names the archived messages first..last of p's stream.
func ArchiveObjectName(p PChannel, first, last uint64) string {
	return ArchivePrefix(p) + pad20(first) + "-" + pad20(last)
}

// ArchiveIndexName names the index of p's archived ranges.
func ArchiveIndexName(p PChannel) string { return "log." + p.String() + ".index" }

// SegmentPrefix prefixes every flushed segment of v.
func SegmentPrefix(v VChannel) string { return "segment." + v.String() + "." }

// SegmentObjectName names flushed segment id of v.
func SegmentObjectName(v VChannel, id int64) string {
	return SegmentPrefix(v) + pad20(uint64(id))
}

// pad20 writes n in 20 digits, zero-padded.
func pad20(n uint64) string {
	s := strconv.FormatUint(n, 10)
	return strings.Repeat("0", 20-len(s)) + s
}

// Wildcards of the cluster's request and live subjects, for the
// permissions of package auth.

// AppendWildcard matches the append subject of every PChannel of c:
// "walapi.<c>.append.*".
func (c Cluster) AppendWildcard() string { return apiRoot + "." + string(c) + ".append.*" }

// CoordWildcard matches every coordinator request of c:
// "walapi.<c>.coord.>".
func (c Cluster) CoordWildcard() string { return apiRoot + "." + string(c) + ".coord.>" }

// NodeWildcard matches operation op on every node of c:
// "walapi.<c>.node.*.<op>".
func (c Cluster) NodeWildcard(op NodeOp) string {
	return apiRoot + "." + string(c) + ".node.*." + string(op)
}

// LiveWildcard matches every live (core NATS, never stored) subject of c:
// "wallive.<c>.>".
func (c Cluster) LiveWildcard() string { return liveRoot + "." + string(c) + ".>" }

// JetStream's own names: the API subjects nats-server answers, the streams
// and subjects behind KV buckets and object stores, and the inboxes of
// replies. They are nats-server's conventions, written down here (and only
// here) for the permissions of package auth.
const (
	jsAPIRoot       = "$JS.API"
	jsAckRoot       = "$JS.ACK"
	jsFCRoot        = "$JS.FC"
	kvRoot          = "$KV"
	objectRoot      = "$O"
	kvStreamPrefix  = "KV_"
	objStreamPrefix = "OBJ_"

	// JSAccountInfo is the JetStream account information request, which a
	// KV bucket's creation makes first.
	JSAccountInfo = jsAPIRoot + ".INFO"
	// InboxWildcard matches the reply subjects of every request (nats.go's
	// default inbox prefix).
	InboxWildcard = "_INBOX.>"
	// FullWildcard matches every subject.
	FullWildcard = ">"
)

// JSOp names a JetStream API request about one stream.
type JSOp string

// The JetStream API requests about one stream. Those about a consumer take
// the consumer's name (and a create may take a filter) after the stream:
// match them with [JSAPIWildcard].
const (
	JSStreamInfo   JSOp = "STREAM.INFO"
	JSStreamCreate JSOp = "STREAM.CREATE"
	JSStreamUpdate JSOp = "STREAM.UPDATE"
	JSStreamDelete JSOp = "STREAM.DELETE"
	JSStreamPurge  JSOp = "STREAM.PURGE"
	// JSStreamMsgGet reads a message through the stream's leader.
	JSStreamMsgGet JSOp = "STREAM.MSG.GET"
	// JSStreamMsgDelete removes one message.
	JSStreamMsgDelete JSOp = "STREAM.MSG.DELETE"
	// JSDirectGet reads messages from any replica (by sequence, or the
	// last of a subject appended after the stream's name).
	JSDirectGet      JSOp = "DIRECT.GET"
	JSConsumerCreate JSOp = "CONSUMER.CREATE"
	JSConsumerInfo   JSOp = "CONSUMER.INFO"
	JSConsumerDelete JSOp = "CONSUMER.DELETE"
	// JSConsumerNext is a pull consumer's fetch.
	JSConsumerNext JSOp = "CONSUMER.MSG.NEXT"
)

// JSAPISubject is the subject of request op about stream:
// "$JS.API.<op>.<stream>".
func JSAPISubject(op JSOp, stream string) string { return jsAPIRoot + "." + string(op) + "." + stream }

// JSAPIWildcard matches the subjects of request op about stream that carry
// more tokens (a consumer's name, a create's filter, a direct get's
// subject): "$JS.API.<op>.<stream>.>".
func JSAPIWildcard(op JSOp, stream string) string { return JSAPISubject(op, stream) + ".>" }

// JSAckWildcards match the acknowledgements of the consumers of stream, in
// both of nats-server's formats ("$JS.ACK.<stream>.>" and, with a domain
// and an account hash in front, "$JS.ACK.*.*.<stream>.>").
func JSAckWildcards(stream string) []string {
	return []string{jsAckRoot + "." + stream + ".>", jsAckRoot + ".*.*." + stream + ".>"}
}

// JSFlowControlWildcards match the flow-control replies of the push
// consumers of stream, in both of nats-server's formats.
func JSFlowControlWildcards(stream string) []string {
	return []string{jsFCRoot + "." + stream + ".>", jsFCRoot + ".*.*." + stream + ".>"}
}

// KVStreamName is the stream that holds KV bucket bucket: "KV_<bucket>".
func KVStreamName(bucket string) string { return kvStreamPrefix + bucket }

// KVWildcard matches every key of KV bucket bucket: "$KV.<bucket>.>".
func KVWildcard(bucket string) string { return kvRoot + "." + bucket + ".>" }

// KVKeySubject is the subject a write of key in KV bucket bucket publishes
// to: "$KV.<bucket>.<key>".
func KVKeySubject(bucket, key string) string { return kvRoot + "." + bucket + "." + key }

// ObjectStreamName is the stream that holds object store bucket:
// "OBJ_<bucket>".
func ObjectStreamName(bucket string) string { return objStreamPrefix + bucket }

// ObjectWildcard matches every chunk and every metadata subject of object
// store bucket: "$O.<bucket>.>".
func ObjectWildcard(bucket string) string { return objectRoot + "." + bucket + ".>" }

// ServerJSZPing asks every server for its JetStream information, its
// configuration included (whether it fsyncs every write): nats-server's
// "$SYS.REQ.SERVER.PING.JSZ", answered only to users of the system
// account.
const ServerJSZPing = "$SYS.REQ.SERVER.PING.JSZ"
