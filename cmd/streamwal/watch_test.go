package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/client"
)

// watchHeader is the first line of a refresh of `status --watch`.
var watchHeader = regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  \(every 50ms; Ctrl-C to stop\)$`)

// rateCell is a PChannel row's Msgs/s cell once a rate is known.
var rateCell = regexp.MustCompile(`(?m)^\| pchan-0 +\| \S+ +\| +\d+ \| yes +\| \d+\.\d +\|`)

// TestStatusWatch: --watch refreshes --count times, each refresh with a
// row per PChannel, and from the second on a message rate; --json prints
// one status per refresh.
func TestStatusWatch(t *testing.T) {
	c := newCluster(t)
	c.mustRun(t, "", "collection", "create", "--db", "shop", "--name", "orders", "--id", "1")
	c.mustRun(t, "", "append", "--vchannel", "pchan-0_1v0", "a", "b")
	out := c.mustRun(t, "", "status", "--watch", "--count", "3", "--interval", "50ms")
	require.Len(t, watchHeader.FindAllString(out, -1), 3, out)
	frames := watchHeader.Split(out, -1)[1:]
	for _, f := range frames {
		require.Contains(t, f, "| PCHANNEL ")
		require.Equal(t, testPChannels, strings.Count(f, "\n| pchan-"), "a row per PChannel: %s", f)
	}
	require.NotRegexp(t, rateCell, frames[0], "no rate before a second refresh")
	require.Regexp(t, rateCell, frames[1], "a rate from the second refresh on")

	out = c.mustRun(t, "", "status", "--watch", "--count", "2", "--interval", "50ms", "--json")
	lines := jsonLines[client.Status](t, out)
	require.Len(t, lines, 2)
	require.Len(t, lines[1].Channels, testPChannels)
}

// TestStatusWatchFlagsAreChecked: the watch's flags are refused when they
// make no sense.
func TestStatusWatchFlagsAreChecked(t *testing.T) {
	c := newCluster(t)
	_, err := c.run(t, "", "status", "--count", "2")
	require.ErrorContains(t, err, "--count needs --watch")
	_, err = c.run(t, "", "status", "--watch", "--interval", "1ms")
	require.ErrorContains(t, err, "--interval must be at least 10ms")
}
