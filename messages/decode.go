package messages

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
)

// slot numbers a header that decoding reads, so that one pass over a
// message's header finds every value (see headerReader.scan) instead of a
// map lookup per property.
type slot uint8

// The slots, one per header a stored message may carry.
const (
	slotVersion slot = iota
	slotType
	slotPChannel
	slotVChannel
	slotTimeTick
	slotLastConfirmed
	slotTxnID
	slotTxnKeepalive
	slotBroadcastID
	slotBroadcastTargets
	slotBroadcastKey
	slotReplicateCluster
	slotReplicateID
	slotReplicateTimeTick
	slotReplicateLastConf
	slotPartition
	slotRows
	slotSegment
	slotUnreplicable
	slotTerm
	slotMsgID
	slotTraceParent
	slotTraceState
	slotCount
)

// slotNames are the header names of the slots.
var slotNames = [slotCount]string{
	HdrVersion, HdrType, HdrPChannel, HdrVChannel, HdrTimeTick, HdrLastConfirmed,
	HdrTxnID, HdrTxnKeepalive, HdrBroadcastID, HdrBroadcastTargets, HdrBroadcastKey,
	HdrReplicateCluster, HdrReplicateID, HdrReplicateTimeTick, HdrReplicateLastConf,
	HdrPartition, HdrRows, HdrSegment, HdrUnreplicable, HdrTerm, HdrMsgID,
	HdrTraceParent, HdrTraceState,
}

// slotOf returns the slot of a header name.
func slotOf(key string) (slot, bool) {
	switch key {
	case HdrVersion:
		return slotVersion, true
	case HdrType:
		return slotType, true
	case HdrPChannel:
		return slotPChannel, true
	case HdrVChannel:
		return slotVChannel, true
	case HdrTimeTick:
		return slotTimeTick, true
	case HdrLastConfirmed:
		return slotLastConfirmed, true
	case HdrTerm:
		return slotTerm, true
	case HdrMsgID:
		return slotMsgID, true
	case HdrTxnID:
		return slotTxnID, true
	case HdrTxnKeepalive:
		return slotTxnKeepalive, true
	case HdrBroadcastID:
		return slotBroadcastID, true
	case HdrBroadcastTargets:
		return slotBroadcastTargets, true
	case HdrBroadcastKey:
		return slotBroadcastKey, true
	case HdrReplicateCluster:
		return slotReplicateCluster, true
	case HdrReplicateID:
		return slotReplicateID, true
	case HdrReplicateTimeTick:
		return slotReplicateTimeTick, true
	case HdrReplicateLastConf:
		return slotReplicateLastConf, true
	case HdrPartition:
		return slotPartition, true
	case HdrRows:
		return slotRows, true
	case HdrSegment:
		return slotSegment, true
	case HdrUnreplicable:
		return slotUnreplicable, true
	case HdrTraceParent:
		return slotTraceParent, true
	case HdrTraceState:
		return slotTraceState, true
	}
	return 0, false
}

// headerReader decodes header values, keeping the first error.
type headerReader struct {
	hdr  nats.Header
	subj *storedSubject      // the message's subject, whose channels it names
	vals [slotCount][]string // the values of each slot, found by scan
	set  uint32              // the slots with values, a bit each
	apps bool                // hdr has application properties
	err  error
}

// rareSlots are the slots of the transaction, broadcast, replication and
// DML properties, which most messages lack.
const rareSlots = 1<<slotTxnID | 1<<slotTxnKeepalive | 1<<slotBroadcastID | 1<<slotBroadcastTargets |
	1<<slotBroadcastKey | 1<<slotReplicateCluster | 1<<slotReplicateID | 1<<slotReplicateTimeTick |
	1<<slotReplicateLastConf | 1<<slotPartition | 1<<slotRows | 1<<slotSegment | 1<<slotUnreplicable

// scan finds the values of every slot, and whether there are application
// properties, in one pass over the header.
func (r *headerReader) scan() {
	for k, v := range r.hdr {
		if s, ok := slotOf(k); ok {
			r.vals[s] = v
			if len(v) > 0 {
				r.set |= 1 << s
			}
		} else if strings.HasPrefix(k, HdrAppPrefix) {
			r.apps = true
		}
	}
}

func (r *headerReader) fail(key, value string, why any) {
	if r.err == nil {
		r.err = wrapInvalid(ErrMalformed, "header %s=%q: %v", key, value, why)
	}
}

// one returns the single value of a slot ("" when absent); repeated keys
// fail.
func (r *headerReader) one(s slot) string { return r.single(slotNames[s], r.vals[s]) }

// value returns the single value of key, which needs no scan.
func (r *headerReader) value(key string) string { return r.single(key, r.hdr.Values(key)) }

// single returns the one value of key in vals ("" when there is none);
// several values fail.
func (r *headerReader) single(key string, vals []string) string {
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

// canonical is one(s) for a value that is usually canon, a printable name,
// which then needs no check.
func (r *headerReader) canonical(s slot, canon string) string {
	if v := r.vals[s]; len(v) == 1 && v[0] == canon {
		return canon
	}
	return r.one(s)
}

func (r *headerReader) uint(s slot) uint64 {
	if v := r.vals[s]; len(v) == 1 {
		if n, err := parseUint(v[0]); err == nil && n != 0 {
			return n // digits only, so printable
		}
	}
	v := r.one(s)
	if v == "" {
		return 0
	}
	n, err := parseUint(v)
	if err != nil || n == 0 {
		r.fail(slotNames[s], v, "want a positive decimal number")
	}
	return n
}

func (r *headerReader) int(s slot) int64 {
	v := r.one(s)
	n, err := strconv.ParseInt(v, 10, 64)
	var buf [20]byte
	if err != nil || string(strconv.AppendInt(buf[:0], n, 10)) != v {
		r.fail(slotNames[s], v, "want a decimal number")
	}
	return n
}

// decodeHeader reads the type and properties of a message with subject subj
// into h.
func decodeHeader(reg *Registry, hdr nats.Header, subj *storedSubject, h *Header) (*Type, error) {
	r := &headerReader{hdr: hdr, subj: subj}
	r.scan()
	if v := r.canonical(slotVersion, versionText); v != versionText {
		r.fail(HdrVersion, v, "unsupported version")
	}
	t, err := r.typ(reg)
	if r.err != nil {
		return nil, r.err
	}
	if err != nil {
		return nil, err
	}
	r.decodeProps(h)
	if r.err != nil {
		return nil, r.err
	}
	return t, nil
}

// typ looks up the message's type, which is usually its subject's: a
// registered type keeps its name and token, so an equal name is that type.
func (r *headerReader) typ(reg *Registry) (*Type, error) {
	t := r.subj.typ
	if t == nil {
		return reg.Lookup(r.one(slotType))
	}
	if name := r.canonical(slotType, t.Name); name != t.Name {
		return reg.Lookup(name)
	}
	return t, nil
}

// decodeProps reads every property but the type and version.
func (r *headerReader) decodeProps(h *Header) {
	h.TimeTick = TimeTick(r.uint(slotTimeTick))
	h.LastConfirmed = MessageID(r.uint(slotLastConfirmed))
	h.Term = r.uint(slotTerm)
	h.MsgID = r.one(slotMsgID)
	h.TraceParent = r.one(slotTraceParent)
	h.TraceState = r.one(slotTraceState)
	r.decodeChannels(h)
	if r.set&rareSlots != 0 {
		r.decodeRare(h)
	}
	if h.MsgID != "" && len(h.MsgID) > MaxMsgIDLen {
		r.fail(HdrMsgID, h.MsgID, "too long")
	}
	h.Props = r.decodeApps()
}

// decodeChannels reads the channels, which are usually the subject's: their
// names are canonical, so equal names parse to the subject's channels.
// decodeRare reads the properties of rareSlots, all absent unless set.
func (r *headerReader) decodeRare(h *Header) {
	h.Txn = r.decodeTxn()
	h.Broadcast = r.decodeBroadcast()
	h.Replicate = r.decodeReplicate()
	h.DML = r.decodeDML()
	if v := r.one(slotUnreplicable); v != "" && v != "true" {
		r.fail(HdrUnreplicable, v, "want true or absent")
	}
	h.Unreplicable = r.one(slotUnreplicable) == "true"
}

func (r *headerReader) decodeChannels(h *Header) {
	ps := r.canonical(slotPChannel, r.subj.pchannel)
	p, err := r.subj.addr.PChannel, error(nil)
	if ps != r.subj.pchannel {
		p, err = streamwal.ParsePChannel(ps)
	}
	if err != nil {
		r.fail(HdrPChannel, ps, err)
		return
	}
	h.PChannel = p
	vs := r.canonical(slotVChannel, r.subj.vchannel)
	if vs == "" {
		return
	}
	v := r.subj.addr.VChannel
	if vs != r.subj.vchannel {
		v, err = streamwal.ParseVChannel(vs)
	}
	if err != nil || v.PChannel() != p {
		r.fail(HdrVChannel, vs, "not a vchannel of "+ps)
		return
	}
	h.VChannel = v
}

func (r *headerReader) decodeTxn() *TxnContext {
	if r.one(slotTxnID) == "" && r.one(slotTxnKeepalive) == "" {
		return nil
	}
	id := r.uint(slotTxnID)
	ka := r.one(slotTxnKeepalive)
	d, err := time.ParseDuration(ka)
	if err != nil || d < MinKeepalive || id == 0 {
		r.fail(HdrTxnKeepalive, ka, "want a txn id and a keepalive of at least 1ms")
	}
	return &TxnContext{ID: TxnID(id), Keepalive: d}
}

func (r *headerReader) decodeBroadcast() *BroadcastHeader {
	if r.one(slotBroadcastID) == "" {
		if len(r.vals[slotBroadcastKey]) > 0 || r.one(slotBroadcastTargets) != "" {
			r.fail(HdrBroadcastID, "", "missing while other broadcast headers are set")
		}
		return nil
	}
	b := &BroadcastHeader{ID: r.uint(slotBroadcastID)}
	targets := r.one(slotBroadcastTargets)
	for _, s := range strings.Split(targets, ",") {
		if v, err := streamwal.ParseVChannel(s); err == nil {
			b.VChannels = append(b.VChannels, v)
		} else if p, err := streamwal.ParsePChannel(s); err == nil {
			b.PChannels = append(b.PChannels, p)
		} else {
			r.fail(HdrBroadcastTargets, targets, "bad target "+strconv.Quote(s))
		}
	}
	for _, ks := range r.vals[slotBroadcastKey] {
		k, err := ParseResourceKey(ks)
		if err != nil {
			r.fail(HdrBroadcastKey, ks, err)
		}
		b.Keys = append(b.Keys, k)
	}
	return b
}

func (r *headerReader) decodeReplicate() *ReplicateHeader {
	cs := r.one(slotReplicateCluster)
	if cs == "" {
		return nil
	}
	c, err := streamwal.ParseCluster(cs)
	if err != nil {
		r.fail(HdrReplicateCluster, cs, err)
	}
	return &ReplicateHeader{
		Cluster:       c,
		MessageID:     MessageID(r.uint(slotReplicateID)),
		TimeTick:      TimeTick(r.uint(slotReplicateTimeTick)),
		LastConfirmed: MessageID(r.uint(slotReplicateLastConf)),
	}
}

func (r *headerReader) decodeDML() *DMLHeader {
	if r.one(slotPartition) == "" && r.one(slotRows) == "" && r.one(slotSegment) == "" {
		return nil
	}
	d := &DMLHeader{PartitionID: r.int(slotPartition), SegmentID: r.int(slotSegment)}
	rows := r.one(slotRows)
	n, err := parseUint(rows)
	if err != nil {
		r.fail(HdrRows, rows, err)
	}
	d.Rows = n
	return d
}

// decodeApps reads the application properties.
func (r *headerReader) decodeApps() map[string]string {
	if !r.apps {
		return nil
	}
	var props map[string]string
	for k, vals := range r.hdr {
		if !strings.HasPrefix(k, HdrAppPrefix) {
			continue
		}
		key := k[len(HdrAppPrefix):]
		v := r.single(k, vals)
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
