package streamwal_test

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
)

// maxCanonicalCollectionID is the largest collection ID.
const maxCanonicalCollectionID int64 = math.MaxInt64

// Generators of valid inputs, shared by the property tests of this package.
var (
	genPrefix  = rapid.StringMatching(`[a-zA-Z][a-zA-Z0-9-]{0,31}`)
	genCluster = rapid.StringMatching(`[a-zA-Z0-9][a-zA-Z0-9-]{0,31}`)
	genNodeID  = rapid.StringMatching(`[a-zA-Z0-9][a-zA-Z0-9-]{0,63}`)
	genToken   = rapid.StringMatching(`[a-z][a-z0-9_]{0,47}`)
	genIndex   = rapid.IntRange(0, streamwal.MaxPChannels-1)
	genShard   = rapid.IntRange(0, streamwal.MaxShards-1)
	genCollID  = rapid.OneOf(
		rapid.Int64Range(1, 1000),
		rapid.Int64Range(1, maxCanonicalCollectionID),
		rapid.SampledFrom([]int64{1, 9, 10, 99, 100, 449_000_000_000_000_000, maxCanonicalCollectionID}),
	)
)

func drawPChannel(t *rapid.T, label string) streamwal.PChannel {
	p, err := streamwal.NewPChannel(genPrefix.Draw(t, label+".prefix"), genIndex.Draw(t, label+".index"))
	require.NoError(t, err)
	return p
}

func drawVChannel(t *rapid.T, p streamwal.PChannel, label string) streamwal.VChannel {
	if rapid.IntRange(0, 9).Draw(t, label+".control") == 0 {
		return p.CChannel()
	}
	v, err := p.VChannel(genCollID.Draw(t, label+".collection"), genShard.Draw(t, label+".shard"))
	require.NoError(t, err)
	return v
}

func drawCluster(t *rapid.T, label string) streamwal.Cluster {
	c, err := streamwal.ParseCluster(genCluster.Draw(t, label))
	require.NoError(t, err)
	return c
}

func drawToken(t *rapid.T, label string) streamwal.Token {
	tok, err := streamwal.ParseToken(genToken.Draw(t, label))
	require.NoError(t, err)
	return tok
}

// requireInvalidName asserts that err is an invalid-name error whose message
// quotes mention.
func requireInvalidName(t require.TestingT, err error, mention string) {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	require.Error(t, err)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.ErrorIs(t, err, streamwal.ErrInvalidName)
	require.Equal(t, streamwal.CodeInvalidArgument, streamwal.CodeOf(err))
	require.False(t, streamwal.IsRetriable(err))
	require.Contains(t, err.Error(), strconv.Quote(mention), "the error should quote the bad input")
}

func mustPChannel(t rapid.TB, prefix string, index int) streamwal.PChannel {
	t.Helper()
	p, err := streamwal.NewPChannel(prefix, index)
	require.NoError(t, err)
	return p
}

func mustVChannel(t rapid.TB, p streamwal.PChannel, id int64, shard int) streamwal.VChannel {
	t.Helper()
	v, err := p.VChannel(id, shard)
	require.NoError(t, err)
	return v
}

var long32 = strings.Repeat("a", 32)

func TestPChannelRoundTrip(t *testing.T) {
	cases := []struct {
		prefix string
		index  int
		name   string
	}{
		{"pchan", 0, "pchan-0"},
		{"pchan", 3, "pchan-3"},
		{"pchan", 15, "pchan-15"},
		{"pchan", streamwal.MaxPChannels - 1, "pchan-4095"},
		{"a", 1, "a-1"},
		{"Z", 10, "Z-10"},
		{"a-b", 2, "a-b-2"},
		{"a-1", 2, "a-1-2"},
		{"a-", 7, "a--7"},
		{"a--", 100, "a---100"},
		{"x9", 1000, "x9-1000"},
		{"Mixed-Case-9", 42, "Mixed-Case-9-42"},
		{long32, 4095, long32 + "-4095"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := mustPChannel(t, tc.prefix, tc.index)
			require.False(t, p.IsZero())
			require.Equal(t, tc.prefix, p.Prefix())
			require.Equal(t, tc.index, p.Index())
			require.Equal(t, tc.name, p.String())

			q, err := streamwal.ParsePChannel(tc.name)
			require.NoError(t, err)
			require.Equal(t, p, q)
			require.True(t, p == q, "PChannel must be comparable with ==")
			require.Equal(t, tc.name, q.String())

			m := map[streamwal.PChannel]int{p: 1}
			require.Equal(t, 1, m[q], "PChannel must work as a map key")
		})
	}
}

func TestVChannelRoundTrip(t *testing.T) {
	cases := []struct {
		p     streamwal.PChannel
		id    int64
		shard int
		name  string
	}{
		{mustPChannel(t, "pchan", 3), 42, 0, "pchan-3_42v0"},
		{mustPChannel(t, "pchan", 0), 1, 1, "pchan-0_1v1"},
		{mustPChannel(t, "pchan", 4095), 1, streamwal.MaxShards - 1, "pchan-4095_1v1023"},
		{mustPChannel(t, "a-1", 2), 449_573_712_345_678_901, 7, "a-1-2_449573712345678901v7"},
		{mustPChannel(t, "a-", 7), 10, 10, "a--7_10v10"},
		{mustPChannel(t, "v", 1), 1, 0, "v-1_1v0"},
		{mustPChannel(t, "vcchan", 1), 1, 0, "vcchan-1_1v0"},
		{mustPChannel(t, "pchan", 1), maxCanonicalCollectionID, 0, "pchan-1_9223372036854775807v0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := mustVChannel(t, tc.p, tc.id, tc.shard)
			require.False(t, v.IsZero())
			require.False(t, v.IsControl())
			require.Equal(t, tc.p, v.PChannel())
			require.Equal(t, tc.id, v.CollectionID())
			require.Equal(t, tc.shard, v.Shard())
			require.Equal(t, tc.name, v.String())
			require.Equal(t, strconv.FormatInt(tc.id, 10)+"v"+strconv.Itoa(tc.shard), v.Suffix())

			w, err := streamwal.ParseVChannel(tc.name)
			require.NoError(t, err)
			require.Equal(t, v, w)
			require.True(t, v == w)
			require.Equal(t, tc.name, w.String())

			// The PChannel is recoverable from the name alone.
			pname, suffix, ok := cutLast(tc.name, "_")
			require.True(t, ok)
			require.Equal(t, v.Suffix(), suffix)
			p, err := streamwal.ParsePChannel(pname)
			require.NoError(t, err)
			require.Equal(t, tc.p, p)
			require.Equal(t, tc.p, w.PChannel())
		})
	}
}

func TestCChannelRoundTrip(t *testing.T) {
	for _, p := range []streamwal.PChannel{
		mustPChannel(t, "pchan", 0),
		mustPChannel(t, "pchan", 15),
		mustPChannel(t, "a-b", 4095),
		mustPChannel(t, long32, 1),
	} {
		t.Run(p.String(), func(t *testing.T) {
			c := p.CChannel()
			require.False(t, c.IsZero())
			require.True(t, c.IsControl())
			require.Equal(t, p, c.PChannel())
			require.Zero(t, c.CollectionID())
			require.Zero(t, c.Shard())
			require.Equal(t, "vcchan", c.Suffix())
			require.Equal(t, p.String()+"_vcchan", c.String())

			d, err := streamwal.ParseVChannel(c.String())
			require.NoError(t, err)
			require.Equal(t, c, d)
			require.True(t, d.IsControl())
			require.Equal(t, p, d.PChannel())

			// A data VChannel of the same PChannel is a different channel.
			v := mustVChannel(t, p, 1, 0)
			require.NotEqual(t, c, v)
			require.NotEqual(t, c.String(), v.String())
		})
	}
}

func TestZeroValues(t *testing.T) {
	var p streamwal.PChannel
	require.True(t, p.IsZero())
	require.Equal(t, "", p.String())

	var v streamwal.VChannel
	require.True(t, v.IsZero())
	require.Equal(t, "", v.String())
	require.True(t, v.PChannel().IsZero())

	require.True(t, p.CChannel().IsZero())
	require.Equal(t, "", p.CChannel().String())

	// A VChannel on the zero PChannel is a bad argument, not a channel.
	_, err := p.VChannel(1, 0)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Equal(t, streamwal.CodeInvalidArgument, streamwal.CodeOf(err))

	require.Equal(t, "", streamwal.Cluster("").String())
}

func TestPChannels(t *testing.T) {
	ps, err := streamwal.PChannels(streamwal.DefaultPChannelPrefix, streamwal.DefaultPChannelCount)
	require.NoError(t, err)
	require.Len(t, ps, streamwal.DefaultPChannelCount)
	seen := map[string]bool{}
	for i, p := range ps {
		require.Equal(t, i, p.Index())
		require.Equal(t, "pchan", p.Prefix())
		require.Equal(t, "pchan-"+strconv.Itoa(i), p.String())
		require.False(t, seen[p.String()])
		seen[p.String()] = true
	}

	one, err := streamwal.PChannels("x", 1)
	require.NoError(t, err)
	require.Equal(t, []streamwal.PChannel{mustPChannel(t, "x", 0)}, one)

	all, err := streamwal.PChannels("x", streamwal.MaxPChannels)
	require.NoError(t, err)
	require.Len(t, all, streamwal.MaxPChannels)
	require.Equal(t, streamwal.MaxPChannels-1, all[len(all)-1].Index())
}

func TestPChannelsInvalid(t *testing.T) {
	for _, count := range []int{0, -1, math.MinInt, streamwal.MaxPChannels + 1, math.MaxInt} {
		t.Run("count="+strconv.Itoa(count), func(t *testing.T) {
			ps, err := streamwal.PChannels("pchan", count)
			require.Error(t, err)
			require.Nil(t, ps)
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			require.Equal(t, streamwal.CodeInvalidArgument, streamwal.CodeOf(err))
			require.Contains(t, err.Error(), strconv.Itoa(count))
		})
	}
	for _, prefix := range []string{"", "1pchan", "-pchan", "p_chan", "p.chan", "p chan", "pchän", long32 + "a"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			ps, err := streamwal.PChannels(prefix, 4)
			require.Nil(t, ps)
			requireInvalidName(t, err, prefix)
		})
	}
}

// badWords are names that every word-like validator (cluster, node id,
// pchannel prefix) must reject.
var badWords = []string{
	"",
	"-a",
	"-",
	"a.b",
	"a*",
	"*",
	"a>",
	">",
	"a b",
	" a",
	"a ",
	"a\tb",
	"a\nb",
	"a_b",
	"_a",
	"a/b",
	"a\\b",
	"a:b",
	"a$b",
	"a+b",
	"a\x00b",
	"ñ",
	"añb",
	"a\u00a0b",
	"日本",
	"\xff",
}

func TestParseClusterInvalid(t *testing.T) {
	cases := append([]string{strings.Repeat("c", streamwal.MaxClusterNameLen+1), strings.Repeat("c", 1000)}, badWords...)
	for _, name := range cases {
		t.Run(strconv.Quote(name), func(t *testing.T) {
			c, err := streamwal.ParseCluster(name)
			require.Empty(t, c)
			requireInvalidName(t, err, name)
		})
	}
}

func TestParseClusterValid(t *testing.T) {
	for _, name := range []string{"a", "0", "9abc", "prod", "Prod-EU-1", "a-", "a--b", strings.Repeat("c", streamwal.MaxClusterNameLen)} {
		c, err := streamwal.ParseCluster(name)
		require.NoError(t, err, name)
		require.Equal(t, name, c.String())
	}
}

func TestParseNodeIDInvalid(t *testing.T) {
	cases := append([]string{strings.Repeat("n", streamwal.MaxNodeIDLen+1)}, badWords...)
	for _, name := range cases {
		t.Run(strconv.Quote(name), func(t *testing.T) {
			n, err := streamwal.ParseNodeID(name)
			require.Empty(t, n)
			requireInvalidName(t, err, name)
		})
	}
}

func TestParseNodeIDValid(t *testing.T) {
	for _, name := range []string{"n", "1", "node-1", "Node-A-", strings.Repeat("n", streamwal.MaxNodeIDLen)} {
		n, err := streamwal.ParseNodeID(name)
		require.NoError(t, err, name)
		require.Equal(t, streamwal.NodeID(name), n)
	}
}

func TestNewPChannelInvalid(t *testing.T) {
	type tc struct {
		prefix  string
		index   int
		mention string
	}
	var cases []tc
	for _, w := range append([]string{"1pchan", "9", "0-a", long32 + "x"}, badWords...) {
		cases = append(cases, tc{w, 0, w})
	}
	for _, i := range []int{-1, -42, math.MinInt, streamwal.MaxPChannels, streamwal.MaxPChannels + 1, math.MaxInt} {
		cases = append(cases, tc{"pchan", i, strconv.Itoa(i)})
	}
	for _, c := range cases {
		t.Run(strconv.Quote(c.prefix)+"/"+strconv.Itoa(c.index), func(t *testing.T) {
			p, err := streamwal.NewPChannel(c.prefix, c.index)
			require.True(t, p.IsZero())
			requireInvalidName(t, err, c.mention)
		})
	}
}

func TestParsePChannelInvalid(t *testing.T) {
	cases := []struct {
		name    string
		mention string // "" means name itself
	}{
		{name: ""},
		{name: "pchan"},
		{name: "pchan-"},
		{name: "pchan-a"},
		{name: "pchan-1a"},
		{name: "pchan-0x1"},
		{name: "pchan-1e3"},
		{name: "pchan-00"},
		{name: "pchan-03"},
		{name: "pchan-007"},
		{name: "pchan-+1"},
		{name: "pchan- 1"},
		{name: "pchan-1 "},
		{name: " pchan-1", mention: " pchan"},
		{name: "pchan-1.5"},
		{name: "pchan-1_2"},
		{name: "pchan-1\n"},
		{name: "pchan-１"}, // full-width digit
		{name: "pchan-١"}, // Arabic-Indic digit
		{name: "pchan-4096", mention: "4096"},
		{name: "pchan-99999", mention: "99999"},
		{name: "pchan-4294967296", mention: "4294967296"},
		{name: "pchan-9223372036854775807"},
		{name: "pchan-18446744073709551616"},
		{name: "pchan-99999999999999999999999999"},
		{name: "-3", mention: ""},
		{name: "-", mention: "-"},
		{name: "1-3", mention: "1"},
		{name: "9pchan-3", mention: "9pchan"},
		{name: "-pchan-3", mention: "-pchan"},
		{name: "p_chan-3", mention: "p_chan"},
		{name: "p.chan-3", mention: "p.chan"},
		{name: "p*-3", mention: "p*"},
		{name: "p>-3", mention: "p>"},
		{name: "pchän-3", mention: "pchän"},
		{name: "pchan_3"},
		{name: "pchan.3"},
		{name: long32 + "a-3", mention: long32 + "a"},
		{name: "pchan-3_42v0"},
		{name: "pchan-3_vcchan"},
	}
	for _, c := range cases {
		t.Run(strconv.Quote(c.name), func(t *testing.T) {
			mention := c.mention
			if mention == "" && !strings.HasPrefix(c.name, "-") {
				mention = c.name
			}
			p, err := streamwal.ParsePChannel(c.name)
			require.True(t, p.IsZero())
			requireInvalidName(t, err, mention)
		})
	}
}

func TestVChannelConstructorInvalid(t *testing.T) {
	p := mustPChannel(t, "pchan", 1)
	cases := []struct {
		id      int64
		shard   int
		mention string
	}{
		{0, 0, "0"},
		{-1, 0, "-1"},
		{math.MinInt64, 0, strconv.FormatInt(math.MinInt64, 10)},
		{1, -1, "-1"},
		{1, math.MinInt, strconv.Itoa(math.MinInt)},
		{1, streamwal.MaxShards, strconv.Itoa(streamwal.MaxShards)},
		{1, math.MaxInt, strconv.Itoa(math.MaxInt)},
	}
	for _, c := range cases {
		t.Run(strconv.FormatInt(c.id, 10)+"v"+strconv.Itoa(c.shard), func(t *testing.T) {
			v, err := p.VChannel(c.id, c.shard)
			require.True(t, v.IsZero())
			requireInvalidName(t, err, c.mention)
		})
	}
}

func TestParseVChannelInvalid(t *testing.T) {
	cases := []struct {
		name    string
		mention string
	}{
		{"", ""},
		{"pchan-1", "pchan-1"},
		{"pchan-1v0", "pchan-1v0"},
		{"pchan-1_", ""},
		{"_42v0", ""},
		{"_vcchan", ""},
		{"pchan_42v0", "pchan"},
		{"pchan-01_42v0", "pchan-01"},
		{"pchan-4096_42v0", "4096"},
		{"1pchan-1_42v0", "1pchan"},
		{"pchan-1_42", "42"},
		{"pchan-1_v0", "v0"},
		{"pchan-1_42v", "42v"},
		{"pchan-1_v", "v"},
		{"pchan-1_0v0", "0"},
		{"pchan-1_00v0", "00v0"},
		{"pchan-1_042v0", "042v0"},
		{"pchan-1_42v00", "42v00"},
		{"pchan-1_42v01", "42v01"},
		{"pchan-1_42v1024", "1024"},
		{"pchan-1_42v99999", "99999"},
		{"pchan-1_-42v0", "-42v0"},
		{"pchan-1_42v-1", "42v-1"},
		{"pchan-1_+42v0", "+42v0"},
		{"pchan-1_42V0", "42V0"},
		{"pchan-1_42v0v1", "42v0v1"},
		{"pchan-1_42x0", "42x0"},
		{"pchan-1_ 42v0", " 42v0"},
		{"pchan-1_42v0 ", "42v0 "},
		{"pchan-1_42v0.x", "42v0.x"},
		{"pchan-1_42v0*", "42v0*"},
		{"pchan-1_4２v0", "4２v0"},
		{"pchan-1_9999999999999999999999v0", "9999999999999999999999v0"},
		{"pchan-1__42v0", "pchan-1_"},
		{"pchan-1_42v0_43v0", "pchan-1_42v0"},
		{"pchan-1_vcchan2", "vcchan2"},
		{"pchan-1_vcchan_", "pchan-1_vcchan"},
		{"pchan-1_VCCHAN", "VCCHAN"},
		{"pchan-1_cchan", "cchan"},
		{"pchan-1_vcchan ", "vcchan "},
		{"pchan-1.42v0", "pchan-1.42v0"},
	}
	for _, c := range cases {
		t.Run(strconv.Quote(c.name), func(t *testing.T) {
			v, err := streamwal.ParseVChannel(c.name)
			require.True(t, v.IsZero())
			requireInvalidName(t, err, c.mention)
		})
	}
}

// TestVChannelLargeCollectionIDRoundTrip: every VChannel the constructor
// accepts, up to the largest int64 collection ID, has a name that
// ParseVChannel accepts back.
func TestVChannelLargeCollectionIDRoundTrip(t *testing.T) {
	p := mustPChannel(t, "pchan", 1)
	for _, id := range []int64{999_999_999_999_999_999, 1_000_000_000_000_000_000, 1 << 62, math.MaxInt64} {
		v, err := p.VChannel(id, 0)
		if err != nil {
			requireInvalidName(t, err, strconv.FormatInt(id, 10))
			continue
		}
		w, err := streamwal.ParseVChannel(v.String())
		require.NoError(t, err, "ParseVChannel(%q)", v.String())
		require.Equal(t, v, w)
	}
}

// TestParseNumbersDoNotOverflow checks the decimal parser keeps exact values
// for numbers beyond 32 bits (it must not wrap on 32-bit platforms either:
// run with GOARCH=386).
func TestParseNumbersDoNotOverflow(t *testing.T) {
	_, err := streamwal.ParsePChannel("pchan-4294967296") // 2^32: would wrap to index 0
	requireInvalidName(t, err, "4294967296")
	_, err = streamwal.ParsePChannel("pchan-4294967297") // 2^32+1: would wrap to index 1
	require.Error(t, err)

	v, err := streamwal.ParseVChannel("pchan-1_4294967338v0") // 2^32+42
	require.NoError(t, err)
	require.Equal(t, int64(4294967338), v.CollectionID())
	require.Equal(t, "pchan-1_4294967338v0", v.String())

	v, err = streamwal.ParseVChannel("pchan-1_449573712345678901v3")
	require.NoError(t, err)
	require.Equal(t, int64(449573712345678901), v.CollectionID())

	_, err = streamwal.ParseVChannel("pchan-1_1v4294967296") // shard 2^32
	require.Error(t, err)
}

func TestChannelRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := drawPChannel(rt, "p")
		q, err := streamwal.ParsePChannel(p.String())
		require.NoError(rt, err)
		require.Equal(rt, p, q)
		require.Equal(rt, p.String(), q.String())
		require.Equal(rt, p.Prefix()+"-"+strconv.Itoa(p.Index()), p.String())

		v := drawVChannel(rt, p, "v")
		w, err := streamwal.ParseVChannel(v.String())
		require.NoError(rt, err)
		require.Equal(rt, v, w)
		require.Equal(rt, v.String(), w.String())
		require.Equal(rt, p, w.PChannel())

		// The PChannel is recoverable from the VChannel name alone.
		pname, suffix, ok := cutLast(v.String(), "_")
		require.True(rt, ok)
		require.Equal(rt, p.String(), pname)
		require.Equal(rt, v.Suffix(), suffix)

		cc, err := streamwal.ParseVChannel(p.CChannel().String())
		require.NoError(rt, err)
		require.Equal(rt, p.CChannel(), cc)

		c := drawCluster(rt, "cluster")
		tok := drawToken(rt, "type")
		a, err := c.ParseSubject(c.VChannelSubject(v, tok))
		require.NoError(rt, err)
		require.Equal(rt, streamwal.Address{PChannel: p, VChannel: v, Type: tok}, a)

		a, err = c.ParseSubject(c.PChannelSubject(p, tok))
		require.NoError(rt, err)
		require.Equal(rt, streamwal.Address{PChannel: p, Type: tok}, a)
		require.True(rt, a.VChannel.IsZero())

		sp, err := c.ParseStreamName(c.StreamName(p))
		require.NoError(rt, err)
		require.Equal(rt, p, sp)
	})
}

// TestChannelNamesInjective: distinct channels have distinct names.
func TestChannelNamesInjective(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p1, p2 := drawPChannel(rt, "p1"), drawPChannel(rt, "p2")
		require.Equal(rt, p1 == p2, p1.String() == p2.String())
		v1, v2 := drawVChannel(rt, p1, "v1"), drawVChannel(rt, p2, "v2")
		require.Equal(rt, v1 == v2, v1.String() == v2.String())
	})
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// Compile-time check that the typed errors are usable with errors.As.
var _ = func(err error) bool {
	var e *streamwal.Error
	return errors.As(err, &e)
}
