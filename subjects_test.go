package streamwal_test

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
)

// subjectMatches is a minimal NATS subject matcher: '*' matches one token,
// a final '>' matches one or more tokens. It is cross-checked against the
// server's own matcher so that both the helper and the names are verified.
func subjectMatches(t require.TestingT, filter, subject string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(subject, ".")
	got := func() bool {
		for i, f := range ft {
			if f == ">" {
				return i == len(ft)-1 && len(st) > i
			}
			if i >= len(st) || f != "*" && f != st[i] {
				return false
			}
		}
		return len(ft) == len(st)
	}()
	require.Equal(t, server.SubjectMatchesFilter(subject, filter), got,
		"subject matcher disagrees with nats-server for filter %q subject %q", filter, subject)
	return got
}

func TestSubjectMatcherHelper(t *testing.T) {
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"a.b", "a.b", true},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{"a.*.c", "a.b.c", true},
		{"a.*.c", "a.b.d", false},
		{"*.>", "x.y", true},
	} {
		require.Equal(t, c.want, subjectMatches(t, c.filter, c.subject), "%s ~ %s", c.filter, c.subject)
	}
}

// requireLiteralSubject asserts s is a valid NATS publish subject.
func requireLiteralSubject(t require.TestingT, s string) {
	require.NotEmpty(t, s)
	require.True(t, server.IsValidPublishSubject(s), "invalid publish subject %q", s)
	require.True(t, server.IsValidLiteralSubject(s), "not a literal subject %q", s)
	require.NotContains(t, s, "..", "empty token in %q", s)
	require.False(t, strings.HasPrefix(s, ".") || strings.HasSuffix(s, "."), "empty token in %q", s)
	require.False(t, strings.ContainsAny(s, " \t\r\n\f\x00"), "whitespace in %q", s)
	for _, tok := range strings.Split(s, ".") {
		require.NotEmpty(t, tok)
		require.NotEqual(t, "*", tok)
		require.NotEqual(t, ">", tok)
	}
}

// requireFilterSubject asserts s is a valid NATS subscription subject.
func requireFilterSubject(t require.TestingT, s string) {
	require.True(t, server.IsValidSubject(s), "invalid subject %q", s)
	require.False(t, strings.ContainsAny(s, " \t\r\n\f\x00"), "whitespace in %q", s)
	for _, tok := range strings.Split(s, ".") {
		require.NotEmpty(t, tok, "empty token in %q", s)
	}
}

// requireStreamName asserts s is a valid JetStream stream name.
func requireStreamName(t require.TestingT, s string) {
	require.NotEmpty(t, s)
	require.False(t, strings.ContainsAny(s, ".*>/\\ \t\r\n\f\x00"), "bad stream name %q", s)
	require.LessOrEqual(t, len(s), 255)
	for _, r := range s {
		require.Less(t, r, rune(0x80), "non-ASCII stream name %q", s)
	}
}

var bucketRe = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

func TestNamespaceLayout(t *testing.T) {
	c, err := streamwal.ParseCluster("prod")
	require.NoError(t, err)
	p := mustPChannel(t, "pchan", 3)
	v := mustVChannel(t, p, 42, 0)
	ins, err := streamwal.ParseToken("insert")
	require.NoError(t, err)
	tick, err := streamwal.ParseToken("timetick")
	require.NoError(t, err)
	node, err := streamwal.ParseNodeID("node-1")
	require.NoError(t, err)

	// The documented namespace (doc.go, DESIGN.md §2) is part of the
	// operator-facing contract.
	require.Equal(t, "WAL_prod_pchan-3", c.StreamName(p))
	require.Equal(t, []string{"wal.prod.pchan-3.>"}, c.StreamSubjects(p))
	require.Equal(t, "wal.prod.pchan-3.v.42v0.insert", c.VChannelSubject(v, ins))
	require.Equal(t, "wal.prod.pchan-3.v.vcchan.insert", c.VChannelSubject(p.CChannel(), ins))
	require.Equal(t, "wal.prod.pchan-3.p.timetick", c.PChannelSubject(p, tick))
	require.Equal(t, []string{"wal.prod.pchan-3.v.42v0.*", "wal.prod.pchan-3.p.*"}, c.VChannelFilter(v))
	require.Equal(t, []string{"wal.prod.pchan-3.>"}, c.PChannelFilter(p))
	require.Equal(t, "wal.prod.*.v.*.insert", c.TypeFilter(ins))
	require.Equal(t, "wallive.prod.pchan-3.tick", c.LiveTickSubject(p))
	require.Equal(t, "walapi.prod.append.pchan-3", c.AppendSubject(p))
	require.Equal(t, "walapi.prod.coord.tso", c.CoordSubject(streamwal.CoordTSO))
	require.Equal(t, "walapi.prod.coord.broadcast-ack", c.CoordSubject(streamwal.CoordBroadcastAck))
	require.Equal(t, "walapi.prod.node.node-1.open", c.NodeSubject(node, streamwal.NodeOpen))
	require.Equal(t, "walapi.prod.>", c.APIWildcard())
	require.Equal(t, "wal.prod.>", c.WALWildcard())
	require.Equal(t, "wal_prod_tso", c.BucketName(streamwal.BucketTSO))
	require.Equal(t, "wal_prod_segments", c.ObjectStoreName(streamwal.ObjectStoreSegments))
}

var (
	allCoordOps = []streamwal.CoordOp{
		streamwal.CoordTSO, streamwal.CoordBroadcast, streamwal.CoordBroadcastAck, streamwal.CoordAllocate,
		streamwal.CoordRelease, streamwal.CoordBalance, streamwal.CoordStatus,
	}
	allNodeOps = []streamwal.NodeOp{streamwal.NodeOpen, streamwal.NodeClose, streamwal.NodeStatus}
)

func TestBucketNames(t *testing.T) {
	want := []streamwal.Bucket{
		streamwal.BucketLeader, streamwal.BucketTSO, streamwal.BucketNodes, streamwal.BucketAssignments,
		streamwal.BucketVChannels, streamwal.BucketBroadcast, streamwal.BucketCheckpoints, streamwal.BucketReplication,
		streamwal.BucketSubscriptions,
	}
	require.ElementsMatch(t, want, streamwal.Buckets, "Buckets must list every bucket exactly once")

	rapid.Check(t, func(rt *rapid.T) {
		c := drawCluster(rt, "cluster")
		seen := map[string]bool{}
		for _, b := range streamwal.Buckets {
			name := c.BucketName(b)
			require.Regexp(rt, bucketRe, name)
			require.Equal(rt, "wal_"+c.String()+"_"+string(b), name)
			require.False(rt, seen[name], "duplicate bucket %q", name)
			seen[name] = true
		}
		obj := c.ObjectStoreName(streamwal.ObjectStoreSegments)
		require.Regexp(rt, bucketRe, obj)
		require.False(rt, seen[obj], "object store %q shares a KV bucket name", obj)

		// Bucket names of different clusters never collide.
		d := drawCluster(rt, "other")
		if d != c {
			for _, b := range streamwal.Buckets {
				require.NotEqual(rt, c.BucketName(b), d.BucketName(b))
			}
		}
	})
}

func TestClusterOfBucket(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c := drawCluster(rt, "cluster")
		for _, b := range streamwal.Buckets {
			got, ok := streamwal.ClusterOfBucket(c.BucketName(b), b)
			require.True(rt, ok, c.BucketName(b))
			require.Equal(rt, c, got)
			for _, other := range streamwal.Buckets {
				if other != b {
					_, ok := streamwal.ClusterOfBucket(c.BucketName(b), other)
					require.False(rt, ok, "%s is not a %s bucket", c.BucketName(b), other)
				}
			}
		}
		_, ok := streamwal.ClusterOfBucket(c.ObjectStoreName(streamwal.ObjectStoreSegments), streamwal.BucketLeader)
		require.False(rt, ok)
	})
	for _, name := range []string{"", "wal__leader", "wal_leader", "KV_wal_local_leader", "wal_a.b_leader", "wal_local_leader_x", "x_local_leader"} {
		_, ok := streamwal.ClusterOfBucket(name, streamwal.BucketLeader)
		require.False(t, ok, name)
	}
}

func TestNATSNamesValid(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c := drawCluster(rt, "cluster")
		p := drawPChannel(rt, "p")
		v := drawVChannel(rt, p, "v")
		tok := drawToken(rt, "type")
		node, err := streamwal.ParseNodeID(genNodeID.Draw(rt, "node"))
		require.NoError(rt, err)

		requireStreamName(rt, c.StreamName(p))
		for _, s := range []string{
			c.VChannelSubject(v, tok), c.VChannelSubject(p.CChannel(), tok), c.PChannelSubject(p, tok),
			c.LiveTickSubject(p), c.AppendSubject(p),
		} {
			requireLiteralSubject(rt, s)
		}
		for _, op := range allCoordOps {
			requireLiteralSubject(rt, c.CoordSubject(op))
		}
		for _, op := range allNodeOps {
			requireLiteralSubject(rt, c.NodeSubject(node, op))
		}
		filters := append(append(append([]string{}, c.StreamSubjects(p)...), c.VChannelFilter(v)...), c.PChannelFilter(p)...)
		filters = append(filters, c.TypeFilter(tok), c.APIWildcard(), c.WALWildcard(), c.AllVChannelsFilter(p), c.PChannelLevelFilter(p))
		filters = append(filters, c.PChannelTypeFilters(p, tok)...)
		for _, f := range filters {
			requireFilterSubject(rt, f)
		}
	})
}

// TestStreamSubjects: the stream of p captures exactly the stored subjects of
// p, and no request or live subject.
func TestStreamSubjects(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c := drawCluster(rt, "cluster")
		p := drawPChannel(rt, "p")
		v := drawVChannel(rt, p, "v")
		tok := drawToken(rt, "type")
		subs := c.StreamSubjects(p)
		require.NotEmpty(rt, subs)
		captured := func(s string) bool {
			for _, f := range subs {
				if subjectMatches(rt, f, s) {
					return true
				}
			}
			return false
		}

		require.True(rt, captured(c.VChannelSubject(v, tok)))
		require.True(rt, captured(c.VChannelSubject(p.CChannel(), tok)))
		require.True(rt, captured(c.PChannelSubject(p, tok)))
		for _, f := range subs {
			require.True(rt, subjectMatches(rt, c.WALWildcard(), strings.TrimSuffix(f, ".>")+".x"))
		}

		// Never a request or a live subject, of any cluster.
		node, err := streamwal.ParseNodeID(genNodeID.Draw(rt, "node"))
		require.NoError(rt, err)
		require.False(rt, captured(c.AppendSubject(p)))
		require.False(rt, captured(c.LiveTickSubject(p)))
		for _, op := range allCoordOps {
			require.False(rt, captured(c.CoordSubject(op)))
		}
		for _, op := range allNodeOps {
			require.False(rt, captured(c.NodeSubject(node, op)))
		}
		for _, f := range subs {
			require.False(rt, server.SubjectsCollide(f, c.APIWildcard()), "%q overlaps the api namespace", f)
			require.False(rt, server.SubjectsCollide(f, "wallive.>"), "%q overlaps the live namespace", f)
		}

		// Nothing of another PChannel of the same cluster, nor of another cluster.
		q := drawPChannel(rt, "q")
		w := drawVChannel(rt, q, "w")
		if q != p {
			require.False(rt, captured(c.VChannelSubject(w, tok)))
			require.False(rt, captured(c.VChannelSubject(q.CChannel(), tok)))
			require.False(rt, captured(c.PChannelSubject(q, tok)))
			// JetStream refuses streams with overlapping subjects.
			for _, f := range subs {
				for _, g := range c.StreamSubjects(q) {
					require.False(rt, server.SubjectsCollide(f, g), "streams of %v and %v overlap", p, q)
				}
			}
		}
		d := drawCluster(rt, "other")
		if d != c {
			require.False(rt, captured(d.VChannelSubject(v, tok)))
			require.False(rt, captured(d.PChannelSubject(p, tok)))
			require.NotEqual(rt, c.StreamName(p), d.StreamName(p))
			for _, f := range subs {
				for _, g := range d.StreamSubjects(p) {
					require.False(rt, server.SubjectsCollide(f, g))
				}
			}
			require.False(rt, server.SubjectsCollide(c.WALWildcard(), d.WALWildcard()))
			require.False(rt, server.SubjectsCollide(c.APIWildcard(), d.APIWildcard()))
		}
		require.False(rt, server.SubjectsCollide(c.WALWildcard(), c.APIWildcard()))
	})
}

func TestStreamSubjectsAdjacentNames(t *testing.T) {
	// Names that are string prefixes of each other must still be separate
	// token-wise.
	c, err := streamwal.ParseCluster("c")
	require.NoError(t, err)
	tok, err := streamwal.ParseToken("insert")
	require.NoError(t, err)
	ps := []streamwal.PChannel{
		mustPChannel(t, "a", 1), mustPChannel(t, "a", 10), mustPChannel(t, "a", 100),
		mustPChannel(t, "a-1", 0), mustPChannel(t, "a-", 1), mustPChannel(t, "a--1", 0),
	}
	for _, p := range ps {
		for _, q := range ps {
			same := p == q
			v := mustVChannel(t, q, 1, 0)
			require.Equal(t, same, subjectMatches(t, c.StreamSubjects(p)[0], c.VChannelSubject(v, tok)), "%v vs %v", p, q)
			require.Equal(t, same, subjectMatches(t, c.StreamSubjects(p)[0], c.PChannelSubject(q, tok)), "%v vs %v", p, q)
			require.Equal(t, same, c.StreamName(p) == c.StreamName(q))
			if !same {
				require.False(t, server.SubjectsCollide(c.StreamSubjects(p)[0], c.StreamSubjects(q)[0]))
			}
		}
	}
	c2, err := streamwal.ParseCluster("c-")
	require.NoError(t, err)
	require.False(t, server.SubjectsCollide(c.WALWildcard(), c2.WALWildcard()))
	require.NotEqual(t, c.StreamName(ps[0]), c2.StreamName(ps[0]))
}

func TestVChannelFilter(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c := drawCluster(rt, "cluster")
		p := drawPChannel(rt, "p")
		v := drawVChannel(rt, p, "v")
		tok := drawToken(rt, "type")
		filters := c.VChannelFilter(v)
		matched := func(s string) bool {
			for _, f := range filters {
				if subjectMatches(rt, f, s) {
					return true
				}
			}
			return false
		}
		require.True(rt, matched(c.VChannelSubject(v, tok)))
		require.True(rt, matched(c.PChannelSubject(p, tok)))

		// The filters are a subset of the stream's subjects.
		for _, f := range filters {
			require.True(rt, server.SubjectMatchesFilter(f, c.StreamSubjects(p)[0]), "%q outside the stream", f)
		}
		// Filters of one consumer must not overlap (JetStream rejects
		// overlapping FilterSubjects).
		for i := range filters {
			for j := range filters {
				if i != j {
					require.False(rt, server.SubjectsCollide(filters[i], filters[j]))
				}
			}
		}

		// Not another VChannel of the same PChannel.
		w := drawVChannel(rt, p, "w")
		if w != v {
			require.False(rt, matched(c.VChannelSubject(w, tok)), "filter of %v matches %v", v, w)
		}
		other := p.CChannel()
		if v.IsControl() {
			other = mustVChannel(rt, p, 1, 0)
		}
		require.False(rt, matched(c.VChannelSubject(other, tok)))

		// Not another PChannel's messages, even for the same suffix.
		q := drawPChannel(rt, "q")
		if q != p {
			require.False(rt, matched(c.PChannelSubject(q, tok)))
			var qv streamwal.VChannel
			if v.IsControl() {
				qv = q.CChannel()
			} else {
				qv = mustVChannel(rt, q, v.CollectionID(), v.Shard())
			}
			require.False(rt, matched(c.VChannelSubject(qv, tok)))
		}
		// Nor a request or live subject.
		require.False(rt, matched(c.LiveTickSubject(p)))
		require.False(rt, matched(c.AppendSubject(p)))
	})
}

func TestTypeFilter(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c := drawCluster(rt, "cluster")
		tok := drawToken(rt, "type")
		f := c.TypeFilter(tok)
		requireFilterSubject(rt, f)
		for i := range 3 {
			p := drawPChannel(rt, "p"+strconv.Itoa(i))
			v := drawVChannel(rt, p, "v"+strconv.Itoa(i))
			require.True(rt, subjectMatches(rt, f, c.VChannelSubject(v, tok)))
			require.True(rt, subjectMatches(rt, f, c.VChannelSubject(p.CChannel(), tok)))

			other := drawToken(rt, "other"+strconv.Itoa(i))
			if other != tok {
				require.False(rt, subjectMatches(rt, f, c.VChannelSubject(v, other)))
			}
			// PChannel-level messages are not VChannel messages.
			require.False(rt, subjectMatches(rt, f, c.PChannelSubject(p, tok)))
			d := drawCluster(rt, "other-cluster"+strconv.Itoa(i))
			if d != c {
				require.False(rt, subjectMatches(rt, f, d.VChannelSubject(v, tok)))
			}
		}
	})
}

func TestAPISubjects(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c := drawCluster(rt, "cluster")
		p := drawPChannel(rt, "p")
		node, err := streamwal.ParseNodeID(genNodeID.Draw(rt, "node"))
		require.NoError(rt, err)
		var all []string
		all = append(all, c.AppendSubject(p))
		for _, op := range allCoordOps {
			all = append(all, c.CoordSubject(op))
		}
		for _, op := range allNodeOps {
			all = append(all, c.NodeSubject(node, op))
		}
		seen := map[string]bool{}
		for _, s := range all {
			require.True(rt, subjectMatches(rt, c.APIWildcard(), s))
			require.False(rt, subjectMatches(rt, c.WALWildcard(), s))
			require.False(rt, seen[s], "duplicate api subject %q", s)
			seen[s] = true
		}
		require.False(rt, subjectMatches(rt, c.APIWildcard(), c.LiveTickSubject(p)))
		require.False(rt, subjectMatches(rt, c.WALWildcard(), c.LiveTickSubject(p)))
	})
}

func TestParseToken(t *testing.T) {
	for _, s := range []string{"a", "insert", "createcollection", "time_tick", "v", "p", "x9", "a_", strings.Repeat("a", streamwal.MaxTokenLen)} {
		tok, err := streamwal.ParseToken(s)
		require.NoError(t, err, s)
		require.Equal(t, streamwal.Token(s), tok)
	}
	for _, s := range []string{
		"", strings.Repeat("a", streamwal.MaxTokenLen+1), "Insert", "INSERT", "insErt", "1insert", "_insert", "-insert",
		"in-sert", "in.sert", "insert.", "*", ">", "in*", "in>", "in sert", " insert", "insert ", "insert\n",
		"in/sert", "inßert", "é", "\xff", "in\x00",
	} {
		t.Run(strconv.Quote(s), func(t *testing.T) {
			tok, err := streamwal.ParseToken(s)
			require.Empty(t, tok)
			requireInvalidName(t, err, s)
		})
	}
}

func TestParseSubjectInvalid(t *testing.T) {
	c, err := streamwal.ParseCluster("c1")
	require.NoError(t, err)
	cases := []struct {
		subject    string
		mention    string // "" means the subject itself
		emptyToken bool   // the error quotes the empty token
	}{
		{subject: ""},
		{subject: "wal"},
		{subject: "wal.c1"},
		{subject: "wal.c1.pchan-1"},
		{subject: "wal.c1.pchan-1.p"},
		{subject: "wal.c1.pchan-1.v.42v0"},
		{subject: "wal.c1.pchan-1.p.tick.extra"},
		{subject: "wal.c1.pchan-1.v.42v0.insert.extra"},
		{subject: "wal.c1.pchan-1.p.x.y.z"},
		{subject: "wal.c1.pchan-1.x.insert"},
		{subject: "wal.c1.pchan-1.V.42v0.insert"},
		{subject: "wal.c1.pchan-1.P.tick"},
		{subject: "wal.c1.pchan-1.vv.42v0.insert"},
		{subject: "wal.c2.pchan-1.p.tick"},
		{subject: "wal.C1.pchan-1.p.tick"},
		{subject: "wal.c1-.pchan-1.p.tick"},
		{subject: "wal.c.pchan-1.p.tick"},
		{subject: "WAL.c1.pchan-1.p.tick"},
		{subject: "walapi.c1.append.pchan-1.x"},
		{subject: "wallive.c1.pchan-1.tick.x"},
		{subject: "walx.c1.pchan-1.p.tick"},
		{subject: ".wal.c1.pchan-1.p.tick"},
		{subject: "wal..pchan-1.p.tick"},
		{subject: "wal.c1..p.tick", emptyToken: true},
		{subject: "wal.c1.pchan-1..tick"},
		{subject: "wal.c1.pchan-1.p.", emptyToken: true},
		{subject: "wal.c1.pchan-1.v..insert", emptyToken: true},
		{subject: "wal.c1.pchan-1.v.42v0.", emptyToken: true},
		{subject: "wal.c1.pchan-1.p.tick."},
		{subject: "wal.c1.pchan-01.p.tick", mention: "pchan-01"},
		{subject: "wal.c1.pchan-4096.p.tick", mention: "4096"},
		{subject: "wal.c1.pchan.p.tick", mention: "pchan"},
		{subject: "wal.c1.*.p.tick", mention: "*"},
		{subject: "wal.c1.>"},
		{subject: "wal.c1.pchan-1.>"},
		{subject: "wal.c1.pchan-1.p.*", mention: "*"},
		{subject: "wal.c1.pchan-1.p.>", mention: ">"},
		{subject: "wal.c1.pchan-1.v.*.insert", mention: "*"},
		{subject: "wal.c1.pchan-1.v.42v0.*", mention: "*"},
		{subject: "wal.c1.pchan-1.p.Tick", mention: "Tick"},
		{subject: "wal.c1.pchan-1.p.tick ", mention: "tick "},
		{subject: "wal.c1.pchan-1.p.1tick", mention: "1tick"},
		{subject: "wal.c1.pchan-1.v.42v0.In", mention: "In"},
		{subject: "wal.c1.pchan-1.v.0v0.insert", mention: "0"},
		{subject: "wal.c1.pchan-1.v.042v0.insert", mention: "042v0"},
		{subject: "wal.c1.pchan-1.v.42v1024.insert", mention: "1024"},
		{subject: "wal.c1.pchan-1.v.42v-1.insert", mention: "42v-1"},
		{subject: "wal.c1.pchan-1.v.pchan-1_42v0.insert", mention: "pchan-1_42v0"},
		{subject: "wal.c1.pchan-1.v.cchan.insert", mention: "cchan"},
		{subject: "wal.c1.pchan-1.v.VCCHAN.insert", mention: "VCCHAN"},
		{subject: "wal c1 pchan-1 p tick"},
	}
	for _, tc := range cases {
		t.Run(strconv.Quote(tc.subject), func(t *testing.T) {
			mention := tc.mention
			if mention == "" {
				mention = tc.subject
			}
			if tc.emptyToken {
				// The bad token is empty; its parser quotes "".
				mention = ""
			}
			_, err := c.ParseSubject(tc.subject)
			requireInvalidName(t, err, mention)
		})
	}
}

func TestParseSubjectValid(t *testing.T) {
	c, err := streamwal.ParseCluster("c1")
	require.NoError(t, err)
	p := mustPChannel(t, "pchan", 1)
	for subject, want := range map[string]streamwal.Address{
		"wal.c1.pchan-1.p.tick":            {PChannel: p, Type: "tick"},
		"wal.c1.pchan-1.p.v":               {PChannel: p, Type: "v"},
		"wal.c1.pchan-1.v.42v0.insert":     {PChannel: p, VChannel: mustVChannel(t, p, 42, 0), Type: "insert"},
		"wal.c1.pchan-1.v.42v0.p":          {PChannel: p, VChannel: mustVChannel(t, p, 42, 0), Type: "p"},
		"wal.c1.pchan-1.v.vcchan.dropcoll": {PChannel: p, VChannel: p.CChannel(), Type: "dropcoll"},
	} {
		a, err := c.ParseSubject(subject)
		require.NoError(t, err, subject)
		require.Equal(t, want, a, subject)
		if a.VChannel.IsZero() {
			require.Equal(t, subject, c.PChannelSubject(a.PChannel, a.Type))
		} else {
			require.Equal(t, subject, c.VChannelSubject(a.VChannel, a.Type))
		}
	}
}

func TestParseStreamName(t *testing.T) {
	c, err := streamwal.ParseCluster("c1")
	require.NoError(t, err)
	for _, p := range []streamwal.PChannel{mustPChannel(t, "pchan", 0), mustPChannel(t, "a-b-", 4095), mustPChannel(t, long32, 7)} {
		got, err := c.ParseStreamName(c.StreamName(p))
		require.NoError(t, err)
		require.Equal(t, p, got)
	}

	cases := []struct{ name, mention string }{
		{"", ""},
		{"WAL_c1_", ""},
		{"WAL_c1", "WAL_c1"},
		{"WAL_", "WAL_"},
		{"WAL_c2_pchan-1", "WAL_c2_pchan-1"},
		{"WAL_C1_pchan-1", "WAL_C1_pchan-1"},
		{"WAL_c1-_pchan-1", "WAL_c1-_pchan-1"},
		{"wal_c1_pchan-1", "wal_c1_pchan-1"},
		{"KV_wal_c1_tso", "KV_wal_c1_tso"},
		{"WAL_c1pchan-1", "WAL_c1pchan-1"},
		{" WAL_c1_pchan-1", " WAL_c1_pchan-1"},
		{"WAL_c1_pchan-01", "pchan-01"},
		{"WAL_c1_pchan-1 ", "pchan-1 "},
		{"WAL_c1_pchan-4096", "4096"},
		{"WAL_c1_pchan", "pchan"},
		{"WAL_c1_pchan-1_42v0", "pchan-1_42v0"},
		{"WAL_c1_c1_pchan-1", "c1_pchan"},
		{"WAL_c1_1-1", "1"},
		{"WAL_c1_pchan-1.x", "pchan-1.x"},
	}
	for _, tc := range cases {
		t.Run(strconv.Quote(tc.name), func(t *testing.T) {
			p, err := c.ParseStreamName(tc.name)
			require.True(t, p.IsZero())
			requireInvalidName(t, err, tc.mention)
		})
	}
}

// TestPChannelTypeFilters: the filters of a type on p match that type's
// subjects on p, VChannel-scoped and PChannel-level, and nothing else.
func TestPChannelTypeFilters(t *testing.T) {
	c, err := streamwal.ParseCluster("prod")
	require.NoError(t, err)
	p := mustPChannel(t, "pchan", 3)
	require.Equal(t, []string{"wal.prod.pchan-3.v.*.flush", "wal.prod.pchan-3.p.flush"}, c.PChannelTypeFilters(p, "flush"))
	rapid.Check(t, func(rt *rapid.T) {
		c := drawCluster(rt, "cluster")
		p, q := drawPChannel(rt, "p"), drawPChannel(rt, "q")
		v := drawVChannel(rt, p, "v")
		tok, other := drawToken(rt, "type"), drawToken(rt, "other")
		matches := func(subject string) bool {
			for _, f := range c.PChannelTypeFilters(p, tok) {
				if server.SubjectMatchesFilter(subject, f) {
					return true
				}
			}
			return false
		}
		require.True(rt, matches(c.VChannelSubject(v, tok)))
		require.True(rt, matches(c.PChannelSubject(p, tok)))
		if other != tok {
			require.False(rt, matches(c.VChannelSubject(v, other)))
			require.False(rt, matches(c.PChannelSubject(p, other)))
		}
		if q != p {
			qv := drawVChannel(rt, q, "qv")
			require.False(rt, matches(c.VChannelSubject(qv, tok)))
			require.False(rt, matches(c.PChannelSubject(q, tok)))
		}
	})
}

func TestAllVChannelsAndPChannelLevelFilters(t *testing.T) {
	c, err := streamwal.ParseCluster("prod")
	require.NoError(t, err)
	p := mustPChannel(t, "pchan", 3)
	require.Equal(t, "wal.prod.pchan-3.v.>", c.AllVChannelsFilter(p))
	require.Equal(t, "wal.prod.pchan-3.p.*", c.PChannelLevelFilter(p))

	rapid.Check(t, func(rt *rapid.T) {
		c := drawCluster(rt, "cluster")
		p := drawPChannel(rt, "p")
		v := drawVChannel(rt, p, "v")
		tok := drawToken(rt, "type")
		all, lvl := c.AllVChannelsFilter(p), c.PChannelLevelFilter(p)
		requireFilterSubject(rt, all)
		requireFilterSubject(rt, lvl)
		stream := c.StreamSubjects(p)[0]
		require.True(rt, server.SubjectMatchesFilter(all, stream), "%q outside the stream", all)
		require.True(rt, server.SubjectMatchesFilter(lvl, stream), "%q outside the stream", lvl)
		// Disjoint, so they can be the two FilterSubjects of one consumer.
		require.False(rt, server.SubjectsCollide(all, lvl))

		require.True(rt, subjectMatches(rt, all, c.VChannelSubject(v, tok)))
		require.True(rt, subjectMatches(rt, all, c.VChannelSubject(p.CChannel(), tok)))
		require.False(rt, subjectMatches(rt, all, c.PChannelSubject(p, tok)))
		require.True(rt, subjectMatches(rt, lvl, c.PChannelSubject(p, tok)))
		require.False(rt, subjectMatches(rt, lvl, c.VChannelSubject(v, tok)))
		// The per-VChannel filter is covered by the two.
		vf := c.VChannelFilter(v)
		require.True(rt, server.SubjectMatchesFilter(vf[0], all))
		require.True(rt, server.SubjectMatchesFilter(vf[1], lvl))

		q := drawPChannel(rt, "q")
		if q != p {
			w := drawVChannel(rt, q, "w")
			require.False(rt, subjectMatches(rt, all, c.VChannelSubject(w, tok)))
			require.False(rt, subjectMatches(rt, lvl, c.PChannelSubject(q, tok)))
		}
		d := drawCluster(rt, "other")
		if d != c {
			require.False(rt, subjectMatches(rt, all, d.VChannelSubject(v, tok)))
			require.False(rt, subjectMatches(rt, lvl, d.PChannelSubject(p, tok)))
		}
		require.False(rt, subjectMatches(rt, all, c.LiveTickSubject(p)))
		require.False(rt, subjectMatches(rt, lvl, c.LiveTickSubject(p)))
	})
}

func TestPermissionWildcards(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c := drawCluster(rt, "cluster")
		other := drawCluster(rt, "other")
		p := drawPChannel(rt, "p")
		node, err := streamwal.ParseNodeID(genNodeID.Draw(rt, "node"))
		require.NoError(rt, err)
		for _, w := range []string{c.AppendWildcard(), c.CoordWildcard(), c.LiveWildcard()} {
			requireFilterSubject(rt, w)
		}
		require.True(rt, subjectMatches(rt, c.AppendWildcard(), c.AppendSubject(p)))
		require.True(rt, subjectMatches(rt, c.LiveWildcard(), c.LiveTickSubject(p)))
		require.False(rt, subjectMatches(rt, c.LiveWildcard(), c.AppendSubject(p)))
		for _, op := range allCoordOps {
			require.True(rt, subjectMatches(rt, c.CoordWildcard(), c.CoordSubject(op)))
			require.False(rt, subjectMatches(rt, c.AppendWildcard(), c.CoordSubject(op)))
		}
		require.False(rt, subjectMatches(rt, c.CoordWildcard(), c.AppendSubject(p)))
		for _, op := range allNodeOps {
			requireFilterSubject(rt, c.NodeWildcard(op))
			require.False(rt, subjectMatches(rt, c.CoordWildcard(), c.NodeSubject(node, op)))
			require.False(rt, subjectMatches(rt, c.AppendWildcard(), c.NodeSubject(node, op)))
			for _, op2 := range allNodeOps {
				require.Equal(rt, op == op2, subjectMatches(rt, c.NodeWildcard(op2), c.NodeSubject(node, op)))
			}
		}
		if other != c {
			require.False(rt, subjectMatches(rt, other.AppendWildcard(), c.AppendSubject(p)))
			require.False(rt, subjectMatches(rt, other.CoordWildcard(), c.CoordSubject(streamwal.CoordStatus)))
			require.False(rt, subjectMatches(rt, other.LiveWildcard(), c.LiveTickSubject(p)))
		}
	})
}

// TestJetStreamNames checks the names of JetStream's own conventions
// against what nats.go and nats-server do: the streams behind a KV bucket
// and an object store, the subjects their writes publish to, and the API
// requests nats.go sends (seen by subscribing to the subject we name).
func TestJetStreamNames(t *testing.T) {
	srv := embedded.StartTest(t)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := streamwal.Cluster("names")

	bucket := c.BucketName(streamwal.BucketLeader)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
	require.NoError(t, err)
	info, err := js.Stream(ctx, streamwal.KVStreamName(bucket))
	require.NoError(t, err, "the stream behind the bucket")
	require.NotEmpty(t, info.CachedInfo().Config.Subjects)
	for _, s := range info.CachedInfo().Config.Subjects {
		require.True(t, subjectMatches(t, streamwal.KVWildcard(bucket), s), "bucket subject %s", s)
	}
	put := subscribeSync(t, nc, streamwal.KVKeySubject(bucket, streamwal.KeyLeader))
	_, err = kv.Put(ctx, streamwal.KeyLeader, []byte("x"))
	require.NoError(t, err)
	nextMsg(t, put)

	store := c.ObjectStoreName(streamwal.ObjectStoreSegments)
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: store})
	require.NoError(t, err)
	info, err = js.Stream(ctx, streamwal.ObjectStreamName(store))
	require.NoError(t, err, "the stream behind the object store")
	for _, s := range info.CachedInfo().Config.Subjects {
		require.True(t, subjectMatches(t, streamwal.ObjectWildcard(store), s), "object store subject %s", s)
	}
	chunks := subscribeSync(t, nc, streamwal.ObjectWildcard(store))
	_, err = obs.PutBytes(ctx, "obj", []byte("data"))
	require.NoError(t, err)
	nextMsg(t, chunks)

	p := mustPChannel(t, "pchan", 0)
	wal, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: c.StreamName(p), Subjects: c.StreamSubjects(p)})
	require.NoError(t, err)
	tick, err := streamwal.ParseToken("timetick")
	require.NoError(t, err)
	_, err = js.Publish(ctx, c.PChannelSubject(p, tick), nil)
	require.NoError(t, err)
	cons, err := wal.CreateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	batch, err := cons.FetchNoWait(1)
	require.NoError(t, err)
	acked := 0
	for m := range batch.Messages() {
		reply := m.Reply()
		require.True(t, slices.ContainsFunc(streamwal.JSAckWildcards(c.StreamName(p)), func(w string) bool {
			return subjectMatches(t, w, reply)
		}), "ack subject %s", reply)
		acked++
	}
	require.NoError(t, batch.Error())
	require.Equal(t, 1, acked)

	stream := streamwal.KVStreamName(bucket)
	for _, want := range []struct {
		subject string
		do      func() error
	}{
		{streamwal.JSAccountInfo, func() error { _, err := js.AccountInfo(ctx); return err }},
		{streamwal.JSAPISubject(streamwal.JSStreamInfo, stream), func() error { _, err := js.Stream(ctx, stream); return err }},
		{streamwal.JSAPIWildcard(streamwal.JSDirectGet, stream), func() error { _, err := kv.Get(ctx, streamwal.KeyLeader); return err }},
		{streamwal.JSAPISubject(streamwal.JSStreamMsgGet, wal.CachedInfo().Config.Name), func() error {
			_, err := wal.GetMsg(ctx, 1) // no direct gets on this stream
			return err
		}},
		{streamwal.JSAPIWildcard(streamwal.JSConsumerCreate, stream), func() error {
			_, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{streamwal.KVWildcard(bucket)}})
			return err
		}},
		{streamwal.JSAPISubject(streamwal.JSStreamPurge, stream), func() error {
			if err := kv.Delete(ctx, streamwal.KeyLeader); err != nil {
				return err
			}
			return kv.PurgeDeletes(ctx, jetstream.DeleteMarkersOlderThan(-1))
		}},
		{streamwal.JSAPISubject(streamwal.JSStreamDelete, streamwal.ObjectStreamName(store)), func() error { return js.DeleteObjectStore(ctx, store) }},
	} {
		sub := subscribeSync(t, nc, want.subject)
		require.NoError(t, want.do(), want.subject)
		nextMsg(t, sub)
	}
}

// subscribeSync subscribes to subject and flushes, so that the server
// knows the subscription before the test publishes.
func subscribeSync(t *testing.T, nc *nats.Conn, subject string) *nats.Subscription {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return sub
}

// nextMsg requires a message on sub within a few seconds.
func nextMsg(t *testing.T, sub *nats.Subscription) {
	t.Helper()
	_, err := sub.NextMsg(5 * time.Second)
	require.NoError(t, err, "nothing on %s", sub.Subject)
}

// TestServerJSZPingAnswersTheSystemAccount checks ServerJSZPing on a real
// server: a user of the system account gets the server's JetStream
// configuration (it fsyncs every write, as started), an ordinary user no
// answer.
func TestServerJSZPingAnswersTheSystemAccount(t *testing.T) {
	sys, app := server.NewAccount("SYS"), server.NewAccount("APP")
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), SyncAlways: true, NoSigs: true, NoLog: true, Accounts: []*server.Account{sys, app},
		SystemAccount: "SYS", Users: []*server.User{{Username: "sys", Password: "s", Account: sys},
			{Username: "app", Password: "a", Account: app}}})
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	require.True(t, ns.ReadyForConnections(10*time.Second))

	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo("sys", "s"))
	require.NoError(t, err)
	defer nc.Close()
	msg, err := nc.Request(streamwal.ServerJSZPing, []byte("{}"), 5*time.Second)
	require.NoError(t, err)
	var reply struct {
		Data struct {
			Config struct {
				SyncAlways bool `json:"sync_always"`
			} `json:"config"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(msg.Data, &reply), "%s", msg.Data)
	require.True(t, reply.Data.Config.SyncAlways, "%s", msg.Data)

	other, err := nats.Connect(ns.ClientURL(), nats.UserInfo("app", "a"))
	require.NoError(t, err)
	defer other.Close()
	_, err = other.Request(streamwal.ServerJSZPing, []byte("{}"), 5*time.Second)
	require.ErrorIs(t, err, nats.ErrNoResponders)
}

// TestSubscriptionKeys: a subscription's record, positions and leases are
// distinct keys of valid KV tokens, and a bad name is refused.
func TestSubscriptionKeys(t *testing.T) {
	require.Equal(t, "wal_c1_subscriptions", streamwal.Cluster("c1").BucketName(streamwal.BucketSubscriptions))
	p, err := streamwal.NewPChannel("pchan", 3)
	require.NoError(t, err)
	v, err := p.VChannel(42, 1)
	require.NoError(t, err)
	require.NoError(t, streamwal.CheckSubscriptionName("billing-1"))
	require.Equal(t, "sub.billing-1", streamwal.SubscriptionKey("billing-1"))
	require.Equal(t, "pos.billing-1.pchan-3_42v1", streamwal.SubscriptionPositionKey("billing-1", v))
	require.Equal(t, "lease.billing-1.pchan-3_42v1", streamwal.SubscriptionLeaseKey("billing-1", v))
	require.Equal(t, "member.billing-1.m-2", streamwal.SubscriptionMemberKey("billing-1", "m-2"))
	for _, k := range []string{streamwal.SubscriptionKey("a"), streamwal.SubscriptionPositionKey("a", v), streamwal.SubscriptionLeaseKey("a", v),
		streamwal.SubscriptionMemberKey("a", "b")} {
		require.Regexp(t, `^[-/_=.a-zA-Z0-9]+$`, k)
	}
	for _, bad := range []string{"", "a.b", "a b", "-a", "a*", strings.Repeat("x", streamwal.MaxSubscriptionNameLen+1)} {
		err := streamwal.CheckSubscriptionName(bad)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "%q", bad)
		require.ErrorIs(t, err, streamwal.ErrInvalidName, "%q", bad)
	}
}
