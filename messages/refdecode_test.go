package messages

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
)

// This file keeps the decoder as it was before the read path's fast one
// (one pass over the header, cached subjects), as the oracle the fuzz
// targets compare Decode with: same messages, same errors.

// RefDecode is the reference decoder for the fuzz targets.
func (c *Codec) RefDecode(msg *nats.Msg, id MessageID) (*ImmutableMessage, error) {
	if msg == nil {
		return nil, wrapInvalid(ErrMalformed, "nil message")
	}
	addr, err := c.cluster.ParseSubject(msg.Subject)
	if err != nil {
		return nil, wrapInvalid(ErrMalformed, "subject: %v", err)
	}
	t, h, err := refDecodeHeader(c.reg, msg.Header)
	if err != nil {
		return nil, err
	}
	if err := checkAddress(addr, t, &h); err != nil {
		return nil, err
	}
	if err := checkShape(t, &h); err != nil {
		return nil, err
	}
	if err := checkBody(t, msg.Data); err != nil {
		return nil, err
	}
	if id == 0 {
		return nil, invalid("message id 0 is not a stored message")
	}
	return (&MutableMessage{typ: t, h: h, payload: msg.Data}).Freeze(id), nil
}

// refParseUint parses a canonical decimal uint64 (no sign, no leading zeros).
func refParseUint(s string) (uint64, error) {
	if len(s) > 1 && s[0] == '0' {
		return 0, errLeadingZero
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errNotDecimal
		}
	}
	return strconv.ParseUint(s, 10, 64)
}

// refPrintable reports whether s can travel as a NATS header value
// unchanged.
func refPrintable(s string) bool {
	if s != strings.TrimSpace(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// refReader decodes header values, keeping the first error.
type refReader struct {
	hdr nats.Header
	err error
}

func (r *refReader) fail(key, value string, why any) {
	if r.err == nil {
		r.err = wrapInvalid(ErrMalformed, "header %s=%q: %v", key, value, why)
	}
}

// one returns the single value of key ("" when absent); repeated keys fail.
func (r *refReader) one(key string) string {
	vals := r.hdr.Values(key)
	if len(vals) > 1 {
		r.fail(key, strings.Join(vals, ","), "repeated")
	}
	if len(vals) == 0 {
		return ""
	}
	if !refPrintable(vals[0]) {
		r.fail(key, vals[0], "control characters")
	}
	return vals[0]
}

func (r *refReader) uint(key string) uint64 {
	s := r.one(key)
	if s == "" {
		return 0
	}
	n, err := refParseUint(s)
	if err != nil || n == 0 {
		r.fail(key, s, "want a positive decimal number")
	}
	return n
}

func (r *refReader) int(key string) int64 {
	s := r.one(key)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || strconv.FormatInt(n, 10) != s {
		r.fail(key, s, "want a decimal number")
	}
	return n
}

// decodeHeader reads a message's type and properties.
func refDecodeHeader(reg *Registry, hdr nats.Header) (*Type, Header, error) {
	r := &refReader{hdr: hdr}
	if v := r.one(HdrVersion); v != versionText {
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
func (r *refReader) decodeProps() Header {
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
	h.Props = r.decodePropsApp()
	return h
}

func (r *refReader) decodeChannels(h *Header) {
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

func (r *refReader) decodeTxn() *TxnContext {
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

func (r *refReader) decodeBroadcast() *BroadcastHeader {
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

func (r *refReader) decodeReplicate() *ReplicateHeader {
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

func (r *refReader) decodeDML() *DMLHeader {
	if r.one(HdrPartition) == "" && r.one(HdrRows) == "" && r.one(HdrSegment) == "" {
		return nil
	}
	d := &DMLHeader{PartitionID: r.int(HdrPartition), SegmentID: r.int(HdrSegment)}
	rows := r.one(HdrRows)
	n, err := refParseUint(rows)
	if err != nil {
		r.fail(HdrRows, rows, err)
	}
	d.Rows = n
	return d
}

// decodeProps2 reads the application properties.
func (r *refReader) decodePropsApp() map[string]string {
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

// FuzzScalars: the decoder's number and header value checks agree with the
// reference ones.
func FuzzScalars(f *testing.F) {
	for _, s := range []string{"", "0", "01", "7", "18446744073709551615", "18446744073709551616",
		"99999999999999999999", " a", "a ", "a\u00a0", "\u0085a", "\xc2", "a\x7fb", "a\tb", "-1", "+1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if printable(s) != refPrintable(s) {
			t.Fatalf("printable(%q) = %v", s, printable(s))
		}
		n, err := parseUint(s)
		rn, rerr := refParseUint(s)
		if n != rn || fmt.Sprint(err) != fmt.Sprint(rerr) {
			t.Fatalf("parseUint(%q) = %d, %v; want %d, %v", s, n, err, rn, rerr)
		}
	})
}
