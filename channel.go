package streamwal

import (
	"errors"
	"strconv"
	"strings"
)

// Limits on names. They keep every derived NATS name (subject token, stream
// name, bucket name) well inside what NATS accepts and readable in the CLI.
const (
	// MaxClusterNameLen bounds a cluster name.
	MaxClusterNameLen = 32
	// MaxPrefixLen bounds a PChannel prefix.
	MaxPrefixLen = 32
	// MaxPChannels bounds the PChannel count of a cluster (indexes are
	// 0..MaxPChannels-1).
	MaxPChannels = 4096
	// MaxShards bounds the shard count of a collection (shards are
	// 0..MaxShards-1).
	MaxShards = 1024
	// DefaultPChannelPrefix is the prefix of PChannel names when a cluster
	// does not choose one.
	DefaultPChannelPrefix = "pchan"
	// DefaultPChannelCount is the PChannel count of a new cluster.
	DefaultPChannelCount = 16
	// controlSuffix names the control channel within its PChannel.
	controlSuffix = "vcchan"
)

// Cluster is a validated cluster name: 1 to 32 ASCII letters, digits or '-',
// starting with a letter or digit. It scopes every NATS name of the cluster.
type Cluster string

// ParseCluster validates a cluster name.
func ParseCluster(name string) (Cluster, error) {
	if err := checkWord("cluster name", name, MaxClusterNameLen); err != nil {
		return "", err
	}
	return Cluster(name), nil
}

// String returns the name.
func (c Cluster) String() string { return string(c) }

// checkWord validates a name made of ASCII letters, digits and '-', starting
// with a letter or digit.
func checkWord(kind, s string, maxLen int) error {
	switch {
	case s == "":
		return invalidName(kind, s, "empty")
	case len(s) > maxLen:
		return invalidName(kind, s, "longer than "+strconv.Itoa(maxLen)+" bytes")
	case s[0] == '-':
		return invalidName(kind, s, "must start with a letter or digit")
	}
	for i := 0; i < len(s); i++ {
		if !isWordByte(s[i]) {
			return invalidName(kind, s, "only ASCII letters, digits and '-' are allowed")
		}
	}
	return nil
}

func isWordByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '-'
}

// PChannel identifies a physical channel: "<prefix>-<index>". The zero value
// is no channel (see IsZero). PChannel is comparable and usable as a map key.
type PChannel struct {
	prefix string
	index  int
}

// NewPChannel validates a prefix (letters, digits and '-', starting with a
// letter) and an index in [0, MaxPChannels).
func NewPChannel(prefix string, index int) (PChannel, error) {
	if err := checkPrefix(prefix); err != nil {
		return PChannel{}, err
	}
	if index < 0 || index >= MaxPChannels {
		return PChannel{}, invalidName("pchannel index", strconv.Itoa(index),
			"must be in [0, "+strconv.Itoa(MaxPChannels)+")")
	}
	return PChannel{prefix: prefix, index: index}, nil
}

func checkPrefix(prefix string) error {
	if err := checkWord("pchannel prefix", prefix, MaxPrefixLen); err != nil {
		return err
	}
	if c := prefix[0]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
		return invalidName("pchannel prefix", prefix, "must start with a letter")
	}
	return nil
}

// PChannels returns the count PChannels "<prefix>-0" .. "<prefix>-<count-1>"
// of a cluster.
func PChannels(prefix string, count int) ([]PChannel, error) {
	if count < 1 || count > MaxPChannels {
		return nil, Errorf(CodeInvalidArgument, "pchannel count %d must be in [1, %d]", count, MaxPChannels)
	}
	out := make([]PChannel, count)
	for i := range out {
		p, err := NewPChannel(prefix, i)
		if err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

// ParsePChannel parses "<prefix>-<index>". The index is decimal without
// leading zeros, so that every PChannel has exactly one name.
func ParsePChannel(name string) (PChannel, error) {
	cut := strings.LastIndexByte(name, '-')
	if cut < 0 {
		return PChannel{}, invalidName("pchannel", name, "want <prefix>-<index>")
	}
	digits := name[cut+1:]
	index, err := parseDecimal(digits)
	if err != nil {
		return PChannel{}, invalidName("pchannel", name, "index: "+err.Error())
	}
	if index >= MaxPChannels {
		return PChannel{}, invalidName("pchannel", name, "index "+strconv.Quote(digits)+" must be in [0, "+strconv.Itoa(MaxPChannels)+")")
	}
	return NewPChannel(name[:cut], int(index))
}

// parseDecimal parses a canonical non-negative decimal int64: digits only,
// no sign, no leading zero (except "0" itself), no overflow.
func parseDecimal(s string) (int64, error) {
	if s == "" || len(s) > 19 || (len(s) > 1 && s[0] == '0') {
		return 0, errBadDecimal
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errBadDecimal
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, errBadDecimal
	}
	return n, nil
}

var errBadDecimal = errors.New("want a decimal number without sign or leading zeros")

// Prefix returns the name prefix.
func (p PChannel) Prefix() string { return p.prefix }

// Index returns the PChannel's index within its cluster.
func (p PChannel) Index() int { return p.index }

// IsZero reports whether p is the zero value (no channel).
func (p PChannel) IsZero() bool { return p.prefix == "" }

// String returns "<prefix>-<index>", or "" for the zero value.
func (p PChannel) String() string {
	if p.IsZero() {
		return ""
	}
	return p.prefix + "-" + strconv.Itoa(p.index)
}

// VChannel returns the VChannel of one shard of a collection on p.
func (p PChannel) VChannel(collectionID int64, shard int) (VChannel, error) {
	if p.IsZero() {
		return VChannel{}, Errorf(CodeInvalidArgument, "vchannel on the zero pchannel")
	}
	if collectionID <= 0 {
		return VChannel{}, invalidName("collection id", strconv.FormatInt(collectionID, 10), "must be positive")
	}
	if shard < 0 || shard >= MaxShards {
		return VChannel{}, invalidName("shard", strconv.Itoa(shard), "must be in [0, "+strconv.Itoa(MaxShards)+")")
	}
	return VChannel{pchannel: p, collectionID: collectionID, shard: shard}, nil
}

// CChannel returns the control channel placed on p.
func (p PChannel) CChannel() VChannel {
	return VChannel{pchannel: p, control: true}
}

// VChannel identifies a virtual channel: one shard of one collection, or the
// control channel (CChannel) of the cluster. Its name carries its PChannel.
// The zero value is no channel. VChannel is comparable.
type VChannel struct {
	pchannel     PChannel
	collectionID int64
	shard        int
	control      bool
}

// ParseVChannel parses "<pchannel>_<collectionID>v<shard>" or
// "<pchannel>_vcchan".
func ParseVChannel(name string) (VChannel, error) {
	cut := strings.LastIndexByte(name, '_')
	if cut < 0 {
		return VChannel{}, invalidName("vchannel", name, "want <pchannel>_<collectionID>v<shard>")
	}
	p, err := ParsePChannel(name[:cut])
	if err != nil {
		return VChannel{}, Errorf(CodeInvalidArgument, "vchannel %q: %w", name, err)
	}
	v, err := p.parseSuffix(name[cut+1:])
	if err != nil {
		return VChannel{}, Errorf(CodeInvalidArgument, "vchannel %q: %w", name, err)
	}
	return v, nil
}

// parseSuffix parses the part of a VChannel name after the PChannel.
func (p PChannel) parseSuffix(suffix string) (VChannel, error) {
	if suffix == controlSuffix {
		return p.CChannel(), nil
	}
	v := strings.IndexByte(suffix, 'v')
	if v < 0 {
		return VChannel{}, invalidName("vchannel suffix", suffix, "want <collectionID>v<shard> or vcchan")
	}
	id, err := parseDecimal(suffix[:v])
	if err != nil {
		return VChannel{}, invalidName("vchannel suffix", suffix, "collection id: "+err.Error())
	}
	shard, err := parseDecimal(suffix[v+1:])
	if err != nil {
		return VChannel{}, invalidName("vchannel suffix", suffix, "shard: "+err.Error())
	}
	if shard >= MaxShards {
		return VChannel{}, invalidName("vchannel suffix", suffix, "shard "+strconv.Quote(suffix[v+1:])+" must be in [0, "+strconv.Itoa(MaxShards)+")")
	}
	return p.VChannel(id, int(shard))
}

// PChannel returns the physical channel that carries v.
func (v VChannel) PChannel() PChannel { return v.pchannel }

// CollectionID returns the collection of a data VChannel (0 for the CChannel).
func (v VChannel) CollectionID() int64 { return v.collectionID }

// Shard returns the shard index of a data VChannel (0 for the CChannel).
func (v VChannel) Shard() int { return v.shard }

// IsControl reports whether v is the cluster's control channel.
func (v VChannel) IsControl() bool { return v.control }

// IsZero reports whether v is the zero value (no channel).
func (v VChannel) IsZero() bool { return v.pchannel.IsZero() }

// Suffix returns the part of the name after "<pchannel>_": "<id>v<shard>"
// or "vcchan". It is the subject token of the VChannel.
func (v VChannel) Suffix() string {
	if v.control {
		return controlSuffix
	}
	return strconv.FormatInt(v.collectionID, 10) + "v" + strconv.Itoa(v.shard)
}

// String returns the VChannel's name, or "" for the zero value.
func (v VChannel) String() string {
	if v.IsZero() {
		return ""
	}
	return v.pchannel.String() + "_" + v.Suffix()
}
