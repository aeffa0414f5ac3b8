package streamwal_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
)

// The fuzz targets check that the parsers never panic, that every rejection
// is an invalid-name error, and that names are canonical: whatever a parser
// accepts formats back to exactly the same string and parses to the same
// value.

var pchannelSeeds = []string{
	"pchan-0", "pchan-3", "pchan-15", "pchan-4095", "pchan-4096", "a-1", "a-1-2", "a--7", "A-b-9",
	long32 + "-1", long32 + "a-1", "pchan-03", "pchan-00", "pchan-", "-3", "-", "", "pchan", "1-1",
	"pchan--1", "pchan-+1", "pchan-1 ", "pchan-1_42v0", "pchan-9223372036854775807",
	"pchan-999999999999999999", "pchan-4294967296", "pchän-1", "pchan-１",
}

var vchannelSeeds = []string{
	"pchan-3_42v0", "pchan-0_1v1", "pchan-4095_1v1023", "pchan-1_vcchan", "a-1-2_449573712345678901v7",
	"pchan-1_999999999999999999v0", "pchan-1_1000000000000000000v0", "pchan-1_9223372036854775807v0",
	"pchan-1_4294967338v0", "pchan-1_0v0", "pchan-1_042v0", "pchan-1_42v01", "pchan-1_42v1024",
	"pchan-1_42V0", "pchan-1_42v0v1", "pchan-1__42v0", "pchan-1_", "_42v0", "pchan-1", "",
	"pchan-1_vcchan_", "pchan-01_42v0", "v-1_1v0", "vcchan-1_vcchan",
}

var subjectSeeds = []struct{ cluster, subject string }{
	{"c1", "wal.c1.pchan-1.p.tick"},
	{"c1", "wal.c1.pchan-1.v.42v0.insert"},
	{"c1", "wal.c1.pchan-1.v.vcchan.createcollection"},
	{"prod-eu", "wal.prod-eu.a-1-2.v.449573712345678901v7.time_tick"},
	{"c1", "wal.c2.pchan-1.p.tick"},
	{"c1", "wal.c1.pchan-1.p.tick.x"},
	{"c1", "wal.c1.pchan-1.v.42v0"},
	{"c1", "wal.c1.pchan-01.p.tick"},
	{"c1", "wal.c1.*.v.*.insert"},
	{"c1", "wal.c1.pchan-1.>"},
	{"c1", "wal.c1..p.tick"},
	{"c1", "walapi.c1.append.pchan-1"},
	{"c1", "WAL_c1_pchan-1"},
	{"c1", ""},
	{"9", "wal.9.x-0.p.v"},
}

var clusterSeeds = []string{
	"c1", "prod", "Prod-EU-1", "0", "a-", strings.Repeat("c", 32), strings.Repeat("c", 33), strings.Repeat("n", 64),
	"", "-a", "a.b", "a*", "a>", "a b", "a_b", "ñ", "insert", "time_tick", "\xff",
}

func FuzzParsePChannel(f *testing.F) {
	for _, s := range pchannelSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		p, err := streamwal.ParsePChannel(name)
		if err != nil {
			require.True(t, p.IsZero())
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			require.ErrorIs(t, err, streamwal.ErrInvalidName)
			return
		}
		require.False(t, p.IsZero())
		require.Equal(t, name, p.String(), "accepted a non-canonical name")
		q, err := streamwal.ParsePChannel(p.String())
		require.NoError(t, err)
		require.Equal(t, p, q)
		require.Equal(t, p.String(), q.String())
		r, err := streamwal.NewPChannel(p.Prefix(), p.Index())
		require.NoError(t, err)
		require.Equal(t, p, r)
		require.GreaterOrEqual(t, p.Index(), 0)
		require.Less(t, p.Index(), streamwal.MaxPChannels)
		require.False(t, strings.ContainsAny(name, ".*>_/\\ \t\r\n\f"), "unsafe pchannel name %q", name)

		cc, err := streamwal.ParseVChannel(p.CChannel().String())
		require.NoError(t, err)
		require.Equal(t, p.CChannel(), cc)
	})
}

func FuzzParseVChannel(f *testing.F) {
	for _, s := range vchannelSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		v, err := streamwal.ParseVChannel(name)
		if err != nil {
			require.True(t, v.IsZero())
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			require.ErrorIs(t, err, streamwal.ErrInvalidName)
			return
		}
		require.False(t, v.IsZero())
		require.Equal(t, name, v.String(), "accepted a non-canonical name")
		w, err := streamwal.ParseVChannel(v.String())
		require.NoError(t, err)
		require.Equal(t, v, w)
		require.Equal(t, v.String(), w.String())

		// The PChannel is recoverable from the name alone.
		pname, suffix, ok := cutLast(name, "_")
		require.True(t, ok)
		require.Equal(t, v.Suffix(), suffix)
		p, err := streamwal.ParsePChannel(pname)
		require.NoError(t, err)
		require.Equal(t, p, v.PChannel())

		if v.IsControl() {
			require.Equal(t, p.CChannel(), v)
		} else {
			u, err := p.VChannel(v.CollectionID(), v.Shard())
			require.NoError(t, err)
			require.Equal(t, u, v)
		}
		require.False(t, strings.ContainsAny(v.Suffix(), ".*>_ \t\r\n\f"), "unsafe subject token %q", v.Suffix())
	})
}

func FuzzParseSubject(f *testing.F) {
	for _, s := range subjectSeeds {
		f.Add(s.cluster, s.subject)
	}
	f.Fuzz(func(t *testing.T, cluster, subject string) {
		c, err := streamwal.ParseCluster(cluster)
		if err != nil {
			return
		}
		if name, err := c.ParseStreamName(subject); err == nil {
			require.Equal(t, subject, c.StreamName(name), "accepted a non-canonical stream name")
		} else {
			require.ErrorIs(t, err, streamwal.ErrInvalidName)
		}

		a, err := c.ParseSubject(subject)
		if err != nil {
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			require.ErrorIs(t, err, streamwal.ErrInvalidName)
			return
		}
		require.False(t, a.PChannel.IsZero())
		_, err = streamwal.ParseToken(string(a.Type))
		require.NoError(t, err)
		var again string
		if a.VChannel.IsZero() {
			again = c.PChannelSubject(a.PChannel, a.Type)
		} else {
			require.Equal(t, a.PChannel, a.VChannel.PChannel())
			again = c.VChannelSubject(a.VChannel, a.Type)
			require.True(t, subjectMatches(t, c.TypeFilter(a.Type), subject))
			require.True(t, subjectMatches(t, c.VChannelFilter(a.VChannel)[0], subject))
		}
		require.Equal(t, subject, again, "accepted a non-canonical subject")
		b, err := c.ParseSubject(again)
		require.NoError(t, err)
		require.Equal(t, a, b)
		require.True(t, subjectMatches(t, c.StreamSubjects(a.PChannel)[0], subject))
		requireLiteralSubject(t, subject)
	})
}

func FuzzParseCluster(f *testing.F) {
	for _, s := range clusterSeeds {
		f.Add(s)
	}
	p, err := streamwal.NewPChannel("pchan", 1)
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, name string) {
		c, err := streamwal.ParseCluster(name)
		if err != nil {
			require.Empty(t, c)
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			require.ErrorIs(t, err, streamwal.ErrInvalidName)
		} else {
			require.Equal(t, name, c.String())
			d, err := streamwal.ParseCluster(c.String())
			require.NoError(t, err)
			require.Equal(t, c, d)
			// Every name derived from a valid cluster is valid for NATS.
			requireStreamName(t, c.StreamName(p))
			requireLiteralSubject(t, c.PChannelSubject(p, "tick"))
			requireLiteralSubject(t, c.AppendSubject(p))
			requireFilterSubject(t, c.WALWildcard())
			requireFilterSubject(t, c.APIWildcard())
			for _, b := range streamwal.Buckets {
				require.Regexp(t, bucketRe, c.BucketName(b))
			}
			got, err := c.ParseStreamName(c.StreamName(p))
			require.NoError(t, err)
			require.Equal(t, p, got)
			// A cluster name is always a valid node ID (same rules, longer limit).
			_, err = streamwal.ParseNodeID(name)
			require.NoError(t, err)
		}

		// The other word-like validators share the input.
		if n, err := streamwal.ParseNodeID(name); err == nil {
			require.Equal(t, name, string(n))
			requireLiteralSubject(t, streamwal.Cluster("c").NodeSubject(n, streamwal.NodeOpen))
		} else {
			require.ErrorIs(t, err, streamwal.ErrInvalidName)
		}
		if tok, err := streamwal.ParseToken(name); err == nil {
			require.Equal(t, name, string(tok))
			requireLiteralSubject(t, streamwal.Cluster("c").PChannelSubject(p, tok))
		} else {
			require.ErrorIs(t, err, streamwal.ErrInvalidName)
		}
	})
}
