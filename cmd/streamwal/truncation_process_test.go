package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/recovery"
)

// binaryStatus runs `streamwal status --json` against url.
func binaryStatus(t testing.TB, url string) (client.Status, error) {
	t.Helper()
	out, err := runBinary(t, "", "status", "--server", url, "--json", "--timeout", "10s")
	if err != nil {
		return client.Status{}, err
	}
	var st client.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return client.Status{}, fmt.Errorf("status --json: %w: %s", err, out)
	}
	return st, nil
}

// statusLine is p's line of st (false if st has none).
func statusLine(st client.Status, p string) (client.ChannelStatus, bool) {
	for _, ch := range st.Channels {
		if ch.PChannel == p {
			return ch, true
		}
	}
	return client.ChannelStatus{}, false
}

// waitStatus waits until `streamwal status --json` shows PChannel p as ok
// wants it, within timeout, and returns that line.
func waitStatus(t testing.TB, url, p string, timeout time.Duration, ok func(client.ChannelStatus) bool) client.ChannelStatus {
	t.Helper()
	start := time.Now()
	var last client.ChannelStatus
	var lastErr error
	err := pollEvery(timeout, 200*time.Millisecond, func() (bool, error) {
		st, err := binaryStatus(t, url)
		if err != nil {
			lastErr = err
			return false, nil
		}
		ch, found := statusLine(st, p)
		if !found {
			lastErr = fmt.Errorf("status has no %s", p)
			return false, nil
		}
		last = ch
		return ok(ch), nil
	})
	if err != nil {
		data, _ := json.Marshal(last)
		t.Fatalf("status never showed %s as wanted: %v; last: %s (last error: %v)", p, err, data, lastErr)
	}
	t.Logf("status showed %s as wanted %s after the wait began", p, time.Since(start).Round(time.Millisecond))
	return last
}

// ackedInOrder is the ledger's acknowledged payloads in the order they
// were appended (the payloads number them) with their MessageIDs.
func (l *ledger) ackedInOrder() ([]string, []messages.MessageID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	payloads := make([]string, 0, len(l.acked))
	for p := range l.acked {
		payloads = append(payloads, p)
	}
	slices.Sort(payloads)
	ids := make([]messages.MessageID, len(payloads))
	for i, p := range payloads {
		ids[i] = l.acked[p]
	}
	return payloads, ids
}

// TestServeTruncatesFlushedHistoryAndReadsItBack is the issue's "done
// when", run as a user would: `streamwal serve --retain 0s`, a collection,
// a few hundred appends and a `collection flush`; `status --json` then
// shows the PChannel's stream truncated past everything appended (its
// first_message_id above every MessageID acknowledged) and the segment
// flushed; `tail --from-start` still returns every appended message,
// once, in order, under the MessageID it was acknowledged with (read
// from the archive), between the collection's own history and the WAL's
// segment bookkeeping, accounted for by type; `segments` lists the
// flushed segment; and all of it reads the same after a restart.
func TestServeTruncatesFlushedHistoryAndReadsItBack(t *testing.T) {
	t.Parallel()
	const appended = 300 // past the 100 dirty messages that persist a round at once
	dir := t.TempDir()
	p, url := serveAndWait(t, dir, truncating...)
	require.Equal(t, []string{restartVChannel}, createCollection(t, url, 1))
	l := newLedger(t, restartVChannel)
	pc := l.v.PChannel().String()
	l.preload(t, url, appended)
	payloads, ids := l.ackedInOrder()
	require.Len(t, payloads, appended)
	flushID := flushCollection(t, url, 1)
	require.Greater(t, flushID, ids[len(ids)-1], "the ManualFlush lands after the inserts")

	ch := waitStatus(t, url, pc, truncationTimeout, func(ch client.ChannelStatus) bool {
		return ch.FirstID > ids[len(ids)-1] && ch.Segments != nil && ch.Segments.Flushed >= 1
	})
	require.True(t, ch.Serving)
	require.Empty(t, ch.Error)
	require.Empty(t, ch.StorageError)
	require.Equal(t, client.SegmentCounts{Flushed: 1}, *ch.Segments, "the one segment, flushed; none growing")
	require.NotNil(t, ch.Checkpoint)
	require.GreaterOrEqual(t, ch.Checkpoint.MessageID, ch.FirstID, "truncation stays at or below the checkpoint's replay start")
	require.GreaterOrEqual(t, ch.LastID, ch.FirstID)

	// The VChannel's history: its CreateCollection, a CreateSegment in
	// front of the first insert, the inserts, the ManualFlush, and the
	// Flush of the sealed segment; TimeTicks are not delivered.
	want := appended + 4
	tail := func() string {
		return mustRunBinary(t, "", "tail", "--server", url, "--vchannel", l.v.String(), "--from-start",
			"--limit", strconv.Itoa(want), "--json", "--timeout", "30s")
	}
	out := tail()
	lines := jsonLines[tailJSON](t, out)
	require.Len(t, lines, want)
	var types []string
	var inserts []tailJSON
	for i, m := range lines {
		require.Equal(t, l.v.String(), m.VChannel, "line %d: %s", i, m.Type)
		if i > 0 {
			require.Greater(t, m.ID, lines[i-1].ID, "line %d: MessageIDs increase", i)
			require.Greater(t, m.TimeTick, lines[i-1].TimeTick, "line %d: TimeTicks increase", i)
		}
		if m.Type == messages.TypeInsert.Name {
			inserts = append(inserts, m)
			continue
		}
		types = append(types, m.Type)
	}
	require.Equal(t, []string{messages.TypeCreateCollection.Name, messages.TypeCreateSegment.Name,
		messages.TypeManualFlush.Name, messages.TypeFlush.Name}, types, "the VChannel's other messages, by type")
	require.Len(t, inserts, appended)
	for i, m := range inserts {
		require.Equal(t, payloads[i], m.Payload, "insert %d in order", i)
		require.Equal(t, ids[i], m.ID, "insert %d read under its acknowledgement's MessageID", i)
	}
	require.Equal(t, messages.TypeCreateSegment.Name, lines[1].Type)
	require.Equal(t, messages.TypeManualFlush.Name, lines[want-2].Type)
	require.Equal(t, flushID, lines[want-2].ID, "the ManualFlush that collection flush appended")
	var created messages.CreateSegmentBody
	require.NoError(t, json.Unmarshal([]byte(lines[1].Payload), &created), lines[1].Payload)
	var flushed messages.FlushBody
	require.NoError(t, json.Unmarshal([]byte(lines[want-1].Payload), &flushed), lines[want-1].Payload)
	require.Equal(t, []int64{created.SegmentID}, flushed.SegmentIDs, "the Flush seals the segment the CreateSegment opened")

	// The client reads the inserts the same way (type-filtered), each once.
	c := connect(t, url)
	l.verify(t, l.readBack(t, c, payloads[len(payloads)-1]))

	// segments lists the flushed segment, from its manifest.
	var res struct {
		VChannel string               `json:"vchannel"`
		Segments []client.SegmentInfo `json:"segments"`
	}
	segOut := mustRunBinary(t, "", "segments", "--server", url, "--vchannel", l.v.String(), "--json", "--timeout", "30s")
	require.NoError(t, json.Unmarshal([]byte(segOut), &res), segOut)
	require.Equal(t, l.v.String(), res.VChannel)
	require.Len(t, res.Segments, 1, segOut)
	seg := res.Segments[0]
	require.Equal(t, created.SegmentID, seg.ID)
	require.Equal(t, "flushed", seg.State)
	require.Equal(t, client.SourceObjectStore, seg.Source)
	require.Equal(t, "manual", seg.Reason)
	require.Equal(t, appended, seg.Messages)
	require.Equal(t, ids[0], seg.FirstID)
	require.Equal(t, ids[len(ids)-1], seg.LastID)
	text := mustRunBinary(t, "", "segments", "--server", url, "--vchannel", l.v.String(), "--timeout", "30s")
	require.Regexp(t, fmt.Sprintf(`(?m)^\| +%d \| +0 \| flushed +\| .* \| %d-%d +\| .* \| manual +\| object_store +\|$`,
		seg.ID, ids[0], ids[len(ids)-1]), text)

	// A restart changes none of it: the truncation and the archive stay.
	_ = c.Close()
	p.stop(syscall.SIGTERM)
	p, url = serveAndWait(t, dir, truncating...)
	after := waitStatus(t, url, pc, serveTimeout, func(ch client.ChannelStatus) bool { return ch.Serving })
	require.GreaterOrEqual(t, after.FirstID, ch.FirstID, "the stream starts where it was truncated")
	require.Equal(t, out, tail(), "tail --from-start after the restart")
	p.stop(syscall.SIGTERM)
}

// lastBlock is the last message block file of PChannel p's stream in the
// data directory dir (jetstream/<account>/streams/<stream>/msgs/N.blk).
func lastBlock(t testing.TB, dir string, p streamwal.PChannel) string {
	t.Helper()
	cluster, err := streamwal.ParseCluster("local")
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(dir, "jetstream", "*", "streams", cluster.StreamName(p), "msgs", "*.blk"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no block file of %s's stream under %s", p, dir)
	index := func(f string) int {
		n, err := strconv.Atoi(strings.TrimSuffix(filepath.Base(f), ".blk"))
		require.NoError(t, err, f)
		return n
	}
	slices.SortFunc(files, func(a, b string) int { return index(a) - index(b) })
	return files[len(files)-1]
}

// cutTail removes n bytes from the end of file.
func cutTail(t testing.TB, file string, n int64) {
	t.Helper()
	fi, err := os.Stat(file)
	require.NoError(t, err)
	require.Greater(t, fi.Size(), 2*n, "%s is too small to cut %d bytes from", file, n)
	require.NoError(t, os.Truncate(file, fi.Size()-n))
	t.Logf("cut %d of %d bytes from the end of %s", n, fi.Size(), file)
}

// TestServeRefusesAPChannelThatLostHistory cuts the end of a PChannel's
// stream while serve is down, as a disk or an operator might: the
// restarted serve does not claim it healthy. It starts (the other
// PChannels serve), and names the PChannel NOT SERVED with HISTORY_LOST
// in its banner and its log; status says so on the PChannel's error line;
// appends to it fail. Once the operator runs `streamwal pchannel
// accept-loss`, the PChannel serves again and new appends get MessageIDs
// above every one acknowledged before the cut; what survived the cut
// reads back as it was, and the loss stays settled across a restart.
func TestServeRefusesAPChannelThatLostHistory(t *testing.T) {
	t.Parallel()
	const appended = 300 // a block file far larger than the cut
	dir := t.TempDir()
	// Serve's default retention keeps everything this young in the
	// streams, so that the block file ends in the messages just appended.
	p, url := serveAndWait(t, dir)
	require.Equal(t, []string{restartVChannel}, createCollection(t, url, 1))
	vs := createCollection(t, url, 2)
	require.Len(t, vs, 1)
	kept, lost := newLedger(t, restartVChannel), newLedger(t, vs[0])
	lp := lost.v.PChannel()
	require.NotEqual(t, kept.v.PChannel(), lp, "collection 2 lives on a PChannel of its own")
	kept.preload(t, url, 10)
	lost.preload(t, url, appended)
	before := lost.maxAcked()
	// The checkpoint records what was handed out; the check at open
	// compares the stream with it.
	waitStatus(t, url, lp.String(), 30*time.Second, func(ch client.ChannelStatus) bool {
		return ch.Checkpoint != nil && ch.Checkpoint.Consumed >= before
	})
	p.stop(syscall.SIGTERM)

	cutTail(t, lastBlock(t, dir, lp), 4<<10)

	// Text logs, which the checks below read (a pipe gets JSON lines by default).
	p = startServe(t, dir, "--log-format", "text")
	url = p.waitURL(serveTimeout)
	banner := p.waitOutput(10*time.Second, "Press Ctrl-C to stop.")
	refusal := regexp.MustCompile(`(?m)^  NOT SERVED: +` + lp.String() + `: (HISTORY_LOST: .*)$`).FindStringSubmatch(banner)
	require.NotNil(t, refusal, "the banner names the PChannel refused:\n%s", banner)
	require.Contains(t, refusal[1], "accept-loss "+lp.String(), "the banner says what to run")
	require.Equal(t, 1, strings.Count(banner, "NOT SERVED:"), "only %s is refused:\n%s", lp, banner)
	require.Regexp(t, `(?m)HISTORY LOST: .*pchannel=`+lp.String(), p.stderr.String(), "the log says so, loudly")

	st, err := binaryStatus(t, url)
	require.NoError(t, err)
	for _, ch := range st.Channels {
		if ch.PChannel == lp.String() {
			require.False(t, ch.Serving, "%s is not served", lp)
			require.Contains(t, ch.Error, string(streamwal.CodeHistoryLost))
			require.Contains(t, ch.Error, "accept-loss "+lp.String())
			continue
		}
		require.True(t, ch.Serving, "%s serves", ch.PChannel)
		require.Empty(t, ch.Error, ch.PChannel)
	}
	text := mustRunBinary(t, "", "status", "--server", url, "--timeout", "10s")
	require.Regexp(t, `(?m)^serving: +15 of 16 PChannels; NOT SERVING \(appends to them wait\): `+lp.String()+`$`, text)
	require.Regexp(t, `(?m)^error: +`+lp.String()+`: HISTORY_LOST: `, text)

	// Appends to the refused PChannel fail; the others take appends.
	start := time.Now()
	refusedOut, err := runBinary(t, "", "append", "--server", url, "--vchannel", lost.v.String(), "--json", "--timeout", "3s", "refused")
	require.Error(t, err, "an append to %s while it is refused: %s", lp, refusedOut)
	t.Logf("an append to the refused %s failed after %s: %v", lp, time.Since(start).Round(time.Millisecond), err)
	kept.preload(t, url, 1)

	// The operator consents.
	out := mustRunBinary(t, "", "pchannel", "accept-loss", lp.String(), "--by", "ops@process-test", "--server", url, "--json", "--timeout", "10s")
	var accepted struct {
		PChannel  string              `json:"pchannel"`
		Accepted  recovery.AcceptLoss `json:"accepted"`
		OpenError string              `json:"open_error"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &accepted), out)
	require.Equal(t, lp.String(), accepted.PChannel)
	require.Equal(t, "ops@process-test", accepted.Accepted.By)
	require.GreaterOrEqual(t, accepted.Accepted.Above, before, "the consent continues above everything acknowledged")
	require.Contains(t, accepted.OpenError, string(streamwal.CodeHistoryLost))

	ch := waitStatus(t, url, lp.String(), 30*time.Second, func(ch client.ChannelStatus) bool { return ch.Serving })
	require.Empty(t, ch.Error)
	require.Regexp(t, `(?m)history loss accepted by an operator: .*accepted_by=ops@process-test.*pchannel=`+lp.String(), p.stderr.String())
	require.NotContains(t, mustRunBinary(t, "", "status", "--server", url, "--timeout", "10s"), "error:")

	old, oldIDs := lost.ackedInOrder()
	lost.preload(t, url, 5)
	all, allIDs := lost.ackedInOrder()
	fresh, freshIDs := all[len(old):], allIDs[len(old):]
	for i, id := range freshIDs {
		require.Greater(t, id, before, "%s: a MessageID above every one acknowledged before the cut", fresh[i])
		require.Greater(t, id, accepted.Accepted.Above, "%s: above every MessageID handed out", fresh[i])
	}

	// What the cut left reads back as it was acknowledged (a prefix of
	// what was appended), then the new appends; the lost ones are gone.
	c := connect(t, url)
	got := readInserts(t, c, lost.v, fresh[len(fresh)-1])
	n := 0
	for n < len(got) && n < len(old) && got[n].payload == old[n] {
		require.Equal(t, oldIDs[n], got[n].id, "%s keeps its MessageID", old[n])
		n++
	}
	require.Less(t, n, len(old), "the cut removed acknowledged messages")
	require.Positive(t, n, "the cut left the first messages")
	rest := got[n:]
	require.Len(t, rest, len(fresh), "after the %d messages the cut left, the new ones only: %v", n, rest)
	for i, m := range rest {
		require.Equal(t, fresh[i], m.payload)
		require.Equal(t, freshIDs[i], m.id)
	}
	t.Logf("the cut lost %d of %d acknowledged messages of %s (%s on); the refused append did not land",
		len(old)-n, len(old), lost.v, old[n])

	// The loss stays settled: the next serve serves every PChannel.
	_ = c.Close()
	p.stop(syscall.SIGTERM)
	p = startServe(t, dir)
	url = p.waitURL(serveTimeout)
	require.NotContains(t, p.waitOutput(10*time.Second, "Press Ctrl-C to stop."), "NOT SERVED")
	lost.preload(t, url, 1)
	require.Greater(t, lost.maxAcked(), freshIDs[len(freshIDs)-1])
	require.NotContains(t, mustRunBinary(t, "", "status", "--server", url, "--timeout", "10s"), "error:")
	p.stop(syscall.SIGTERM)
}
