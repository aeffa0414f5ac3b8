package messages

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
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

// headerReader decodes header values, keeping the first error.
type headerReader struct {
	hdr nats.Header
	err error
}

func (r *headerReader) fail(key, value string, why any) {
	if r.err == nil {
		r.err = wrapInvalid(ErrMalformed, "header %s=%q: %v", key, value, why)
	}
}

// one returns the single value of key ("" when absent); repeated keys fail.
func (r *headerReader) one(key string) string {
	vals := r.hdr.Values(key)
	if len(vals) > 1 {
		r.fail(key, strings.Join(vals, ","), "repeated")
	}
	if len(vals) == 0 {
		return ""
	}
	if !printable(vals[0]) {
		r.fail(key, vals[0], "control characters")
	}
	return vals[0]
}

func (r *headerReader) uint(key string) uint64 {
	s := r.one(key)
	if s == "" {
		return 0
	}
	n, err := parseUint(s)
	if err != nil || n == 0 {
		r.fail(key, s, "want a positive decimal number")
	}
	return n
}

func (r *headerReader) int(key string) int64 {
	s := r.one(key)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || strconv.FormatInt(n, 10) != s {
		r.fail(key, s, "want a decimal number")
	}
	return n
}

// decodeHeader reads a message's type and properties.
func decodeHeader(reg *Registry, hdr nats.Header) (*Type, Header, error) {
	r := &headerReader{hdr: hdr}
	if v := r.one(HdrVersion); v != strconv.Itoa(Version) {
		r.fail(HdrVersion, v, "unsupported version")
	}
	t, err := reg.Lookup(r.one(HdrType))
	if r.err != nil {
		return nil, Header{}, r.err
	}
	if err != nil {
		return nil, Header{}, err
	}
	h := r.decodeProps()
	if r.err != nil {
		return nil, Header{}, r.err
	}
	return t, h, nil
}

// decodeProps reads every property but the type and version.
func (r *headerReader) decodeProps() Header {
	h := Header{
		TimeTick:      TimeTick(r.uint(HdrTimeTick)),
		LastConfirmed: MessageID(r.uint(HdrLastConfirmed)),
		Term:          r.uint(HdrTerm),
		MsgID:         r.one(HdrMsgID),
		TraceParent:   r.one(HdrTraceParent),
		TraceState:    r.one(HdrTraceState),
	}
	r.decodeChannels(&h)
	h.Txn = r.decodeTxn()
	h.Broadcast = r.decodeBroadcast()
	h.Replicate = r.decodeReplicate()
	h.DML = r.decodeDML()
	if v := r.one(HdrUnreplicable); v != "" && v != "true" {
		r.fail(HdrUnreplicable, v, "want true or absent")
	}
	h.Unreplicable = r.one(HdrUnreplicable) == "true"
	if h.MsgID != "" && len(h.MsgID) > MaxMsgIDLen {
		r.fail(HdrMsgID, h.MsgID, "too long")
	}
	h.Props = r.decodeProps2()
	return h
}

func (r *headerReader) decodeChannels(h *Header) {
	ps := r.one(HdrPChannel)
	p, err := streamwal.ParsePChannel(ps)
	if err != nil {
		r.fail(HdrPChannel, ps, err)
		return
	}
	h.PChannel = p
	vs := r.one(HdrVChannel)
	if vs == "" {
		return
	}
	v, err := streamwal.ParseVChannel(vs)
	if err != nil || v.PChannel() != p {
		r.fail(HdrVChannel, vs, "not a vchannel of "+ps)
		return
	}
	h.VChannel = v
}

func (r *headerReader) decodeTxn() *TxnContext {
	if r.one(HdrTxnID) == "" && r.one(HdrTxnKeepalive) == "" {
		return nil
	}
	id := r.uint(HdrTxnID)
	ka := r.one(HdrTxnKeepalive)
	d, err := time.ParseDuration(ka)
	if err != nil || d < MinKeepalive || id == 0 {
		r.fail(HdrTxnKeepalive, ka, "want a txn id and a keepalive of at least 1ms")
	}
	return &TxnContext{ID: TxnID(id), Keepalive: d}
}

func (r *headerReader) decodeBroadcast() *BroadcastHeader {
	if r.one(HdrBroadcastID) == "" {
		if len(r.hdr.Values(HdrBroadcastKey)) > 0 || r.one(HdrBroadcastTargets) != "" {
			r.fail(HdrBroadcastID, "", "missing while other broadcast headers are set")
		}
		return nil
	}
	b := &BroadcastHeader{ID: r.uint(HdrBroadcastID)}
	targets := r.one(HdrBroadcastTargets)
	for _, s := range strings.Split(targets, ",") {
		if v, err := streamwal.ParseVChannel(s); err == nil {
			b.VChannels = append(b.VChannels, v)
		} else if p, err := streamwal.ParsePChannel(s); err == nil {
			b.PChannels = append(b.PChannels, p)
		} else {
			r.fail(HdrBroadcastTargets, targets, "bad target "+strconv.Quote(s))
		}
	}
	for _, ks := range r.hdr.Values(HdrBroadcastKey) {
		k, err := ParseResourceKey(ks)
		if err != nil {
			r.fail(HdrBroadcastKey, ks, err)
		}
		b.Keys = append(b.Keys, k)
	}
	return b
}

func (r *headerReader) decodeReplicate() *ReplicateHeader {
	cs := r.one(HdrReplicateCluster)
	if cs == "" {
		return nil
	}
	c, err := streamwal.ParseCluster(cs)
	if err != nil {
		r.fail(HdrReplicateCluster, cs, err)
	}
	return &ReplicateHeader{
		Cluster:       c,
		MessageID:     MessageID(r.uint(HdrReplicateID)),
		TimeTick:      TimeTick(r.uint(HdrReplicateTimeTick)),
		LastConfirmed: MessageID(r.uint(HdrReplicateLastConf)),
	}
}

func (r *headerReader) decodeDML() *DMLHeader {
	if r.one(HdrPartition) == "" && r.one(HdrRows) == "" && r.one(HdrSegment) == "" {
		return nil
	}
	d := &DMLHeader{PartitionID: r.int(HdrPartition), SegmentID: r.int(HdrSegment)}
	rows := r.one(HdrRows)
	n, err := parseUint(rows)
	if err != nil {
		r.fail(HdrRows, rows, err)
	}
	d.Rows = n
	return d
}

// decodeProps2 reads the application properties.
func (r *headerReader) decodeProps2() map[string]string {
	var props map[string]string
	for k := range r.hdr {
		if !strings.HasPrefix(k, HdrAppPrefix) {
			continue
		}
		key := k[len(HdrAppPrefix):]
		v := r.one(k)
		if err := checkProp(key, v); err != nil {
			r.fail(k, v, err)
			continue
		}
		if props == nil {
			props = map[string]string{}
		}
		props[key] = v
	}
	if len(props) > MaxProps {
		r.fail(HdrAppPrefix+"*", "", "too many application properties")
	}
	return props
}
