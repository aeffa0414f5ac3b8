package messages

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// NATS header names of message properties. They are human readable on
// purpose: `nats stream view` shows them as they are.
const (
	HdrVersion           = "Wal-Version"
	HdrType              = "Wal-Type"
	HdrPChannel          = "Wal-PChannel"
	HdrVChannel          = "Wal-VChannel"
	HdrTimeTick          = "Wal-TimeTick"
	HdrLastConfirmed     = "Wal-Last-Confirmed"
	HdrTxnID             = "Wal-Txn-Id"
	HdrTxnKeepalive      = "Wal-Txn-Keepalive"
	HdrBroadcastID       = "Wal-Broadcast-Id"
	HdrBroadcastTargets  = "Wal-Broadcast-Targets"
	HdrBroadcastKey      = "Wal-Broadcast-Key"
	HdrReplicateCluster  = "Wal-Replicate-Cluster"
	HdrReplicateID       = "Wal-Replicate-Message-Id"
	HdrReplicateTimeTick = "Wal-Replicate-TimeTick"
	HdrReplicateLastConf = "Wal-Replicate-Last-Confirmed"
	HdrPartition         = "Wal-Partition"
	HdrRows              = "Wal-Rows"
	HdrSegment           = "Wal-Segment"
	HdrUnreplicable      = "Wal-Unreplicable"
	HdrTerm              = "Wal-Term"
	HdrMsgID             = nats.MsgIdHdr
	HdrTraceParent       = "traceparent"
	HdrTraceState        = "tracestate"
	// HdrMsgSize is the header in which JetStream gives the size of the
	// payload of a message delivered without it (a headers-only consumer).
	HdrMsgSize = "Nats-Msg-Size"
	// HdrAppPrefix prefixes application properties: property "k" travels as
	// header "Wal-App-k".
	HdrAppPrefix = "Wal-App-"
)

// versionText is the wire form of Version.
var versionText = strconv.Itoa(Version)

// Limits on header values.
const (
	MaxMsgIDLen     = 256
	MaxPropKeyLen   = 64
	MaxPropValueLen = 4096
	MaxProps        = 64
)

// encodeHeader writes h's properties into hdr.
func encodeHeader(hdr nats.Header, t *Type, h *Header, names *channelNames) {
	hdr.Set(HdrVersion, versionText)
	hdr.Set(HdrType, t.Name)
	hdr.Set(HdrPChannel, names.pchannel)
	setIf(hdr, HdrVChannel, names.vchannel)
	setUint(hdr, HdrTimeTick, uint64(h.TimeTick))
	setUint(hdr, HdrLastConfirmed, uint64(h.LastConfirmed))
	if h.Txn != nil {
		hdr.Set(HdrTxnID, strconv.FormatUint(uint64(h.Txn.ID), 10))
		hdr.Set(HdrTxnKeepalive, h.Txn.Keepalive.String())
	}
	if h.Broadcast != nil {
		encodeBroadcast(hdr, h.Broadcast)
	}
	if r := h.Replicate; r != nil {
		hdr.Set(HdrReplicateCluster, string(r.Cluster))
		setUint(hdr, HdrReplicateID, uint64(r.MessageID))
		setUint(hdr, HdrReplicateTimeTick, uint64(r.TimeTick))
		setUint(hdr, HdrReplicateLastConf, uint64(r.LastConfirmed))
	}
	if d := h.DML; d != nil {
		hdr.Set(HdrPartition, strconv.FormatInt(d.PartitionID, 10))
		hdr.Set(HdrRows, strconv.FormatUint(d.Rows, 10))
		hdr.Set(HdrSegment, strconv.FormatInt(d.SegmentID, 10))
	}
	if h.Unreplicable {
		hdr.Set(HdrUnreplicable, "true")
	}
	setUint(hdr, HdrTerm, h.Term)
	setIf(hdr, HdrMsgID, h.MsgID)
	setIf(hdr, HdrTraceParent, h.TraceParent)
	setIf(hdr, HdrTraceState, h.TraceState)
	for k, v := range h.Props {
		hdr.Set(HdrAppPrefix+k, v)
	}
}

func encodeBroadcast(hdr nats.Header, b *BroadcastHeader) {
	hdr.Set(HdrBroadcastID, strconv.FormatUint(b.ID, 10))
	targets := make([]string, 0, len(b.VChannels)+len(b.PChannels))
	for _, v := range b.VChannels {
		targets = append(targets, v.String())
	}
	for _, p := range b.PChannels {
		targets = append(targets, p.String())
	}
	hdr.Set(HdrBroadcastTargets, strings.Join(targets, ","))
	for _, k := range b.Keys {
		hdr.Add(HdrBroadcastKey, k.String())
	}
}

func setIf(hdr nats.Header, key, value string) {
	if value != "" {
		hdr.Set(key, value)
	}
}

func setUint(hdr nats.Header, key string, v uint64) {
	if v != 0 {
		hdr.Set(key, strconv.FormatUint(v, 10))
	}
}

// headerSize estimates the bytes of h's header values.
func headerSize(h *Header) int {
	n := 128 + len(h.MsgID) + len(h.TraceParent) + len(h.TraceState)
	for k, v := range h.Props {
		n += len(HdrAppPrefix) + len(k) + len(v) + 4
	}
	if h.Broadcast != nil {
		n += 64 * (len(h.Broadcast.VChannels) + len(h.Broadcast.PChannels) + len(h.Broadcast.Keys))
	}
	return n
}
