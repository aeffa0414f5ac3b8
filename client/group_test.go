package client_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded/system"
)

// groupTTL is the lease TTL of the group tests' members.
const groupTTL = time.Second

// member is one group member of a test: its own connection and client,
// and what it was delivered and acknowledged per VChannel.
type member struct {
	name string
	nc   interface{ Close() }
	c    *client.Client
	sub  *client.Subscription

	mu    sync.Mutex
	got   map[streamwal.VChannel][]int // message numbers, in delivery order
	acked map[streamwal.VChannel]int   // the last acknowledged number (-1: none)
	done  chan struct{}
}

// joinMember subscribes a member to the group and consumes in the
// background, acknowledging every ackEvery messages and each VChannel's
// last one (number last), until stopAfter deliveries (0: no limit) or its
// subscription ends.
func joinMember(t *testing.T, ctx context.Context, s *system.System, name string, col int64, ackEvery, stopAfter, last int) *member {
	t.Helper()
	nc := connect(t, s)
	c, err := client.New(nc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	sub, err := c.Subscribe(ctx, "grp", client.SubscribeCollection(col), dataTypes, client.SubscribeGroup(name),
		client.SubscribeLeaseTTL(groupTTL), client.SubscribeBuffer(8))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	m := &member{name: name, nc: nc, c: c, sub: sub, got: map[streamwal.VChannel][]int{},
		acked: map[streamwal.VChannel]int{}, done: make(chan struct{})}
	go m.consume(ctx, ackEvery, stopAfter, last)
	return m
}

// consume is the member's handler loop.
func (m *member) consume(ctx context.Context, ackEvery, stopAfter, last int) {
	defer close(m.done)
	for n := 1; stopAfter == 0 || n <= stopAfter; n++ {
		d, err := m.sub.Next(ctx)
		if err != nil {
			return
		}
		payload := string(d.Message.Payload())
		k, _ := strconv.Atoi(payload[strings.LastIndexByte(payload, '-')+1:])
		m.mu.Lock()
		m.got[d.VChannel] = append(m.got[d.VChannel], k)
		m.mu.Unlock()
		if n%ackEvery == 0 || k == last {
			if d.Ack(ctx) == nil {
				m.mu.Lock()
				m.acked[d.VChannel] = max(m.acked[d.VChannel], k)
				m.mu.Unlock()
			}
		}
	}
}

// snapshot copies what the member was delivered and acknowledged.
func (m *member) snapshot() (map[streamwal.VChannel][]int, map[streamwal.VChannel]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	got := map[streamwal.VChannel][]int{}
	for v, ks := range m.got {
		got[v] = append([]int(nil), ks...)
	}
	acked := map[streamwal.VChannel]int{}
	for v, k := range m.acked {
		acked[v] = k
	}
	return got, acked
}

// TestGroupMembersShareAndTakeOverFromADeadOne: two members of a group
// share a collection's four VChannels, each read by one member; one dies
// mid-stream (its connection cut, nothing given back), and the other
// takes its VChannels over once their leases lapse, resuming right after
// the dead member's last acknowledgement: nothing is skipped, and only
// what it had not acknowledged comes twice.
func TestGroupMembersShareAndTakeOverFromADeadOne(t *testing.T) {
	const shards, per = 4, 40
	s := newSystemOf(t, shards)
	ctx := testCtx(t)
	c := newClient(t, s)
	col := client.Collection{DBName: "db", Name: "group", ID: collectionIDs.Add(1), Shards: shards}
	vs, err := c.CreateCollection(ctx, col)
	require.NoError(t, err)
	for i, v := range vs {
		appendNumbered(t, ctx, c, v, fmt.Sprintf("v%d", i), 0, per)
	}

	// a stops after 30 deliveries (acking every 7th): mid-stream of its
	// VChannels, with some delivered and not acknowledged.
	a := joinMember(t, ctx, s, "a", col.ID, 7, 30, per-1)
	b := joinMember(t, ctx, s, "b", col.ID, 5, 0, per-1)
	<-a.done
	died := time.Now()
	a.nc.Close()
	gotA, ackedA := a.snapshot()
	require.NotEmpty(t, gotA, "a read some VChannels")

	// b ends up with every message of every VChannel.
	require.Eventually(t, func() bool {
		gotB, _ := b.snapshot()
		for _, v := range vs {
			ks := gotB[v]
			if len(ks) == 0 || ks[len(ks)-1] != per-1 {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "b takes every VChannel over")
	t.Logf("rebalance after a member's death: all VChannels read to the end %v after it", time.Since(died).Round(time.Millisecond))

	gotB, _ := b.snapshot()
	for _, v := range vs {
		ka, kb := gotA[v], gotB[v]
		if len(ka) == 0 {
			require.Equal(t, seq(0, per), kb, "%s read by b alone, in order", v)
			continue
		}
		require.Equal(t, seq(0, len(ka)), ka, "%s: a read it in order from the start", v)
		resume := 0
		if k, ok := ackedA[v]; ok {
			resume = k + 1
		}
		// b read v from the start before a took it, or only after a died.
		if len(kb) > 0 && kb[0] == 0 && resume > 0 {
			t.Fatalf("%s: b read from 0 though a acknowledged up to %d", v, resume-1)
		}
		require.Equal(t, seq(resume, per), kb, "%s: b resumes right after a's last acknowledgement", v)
	}

	infos, err := c.Subscriptions(ctx)
	require.NoError(t, err)
	require.Len(t, infos, 1)
	require.True(t, infos[0].Group)
	for _, p := range infos[0].Positions {
		require.Equal(t, "b", p.Holder, "%s leased to the live member", p.VChannel)
	}
}

// seq is from, from+1, ..., to-1.
func seq(from, to int) []int {
	out := make([]int, 0, max(to-from, 0))
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// TestGroupRebalancesWhenAMemberJoinsAndLeaves: a member alone reads
// every VChannel; a second one gets its fair share; when the first
// leaves (Close gives its leases back), the second reads them all.
func TestGroupRebalancesWhenAMemberJoinsAndLeaves(t *testing.T) {
	const shards = 2
	s := newSystemOf(t, shards)
	ctx := testCtx(t)
	c := newClient(t, s)
	col := client.Collection{DBName: "db", Name: "rebalance", ID: collectionIDs.Add(1), Shards: shards}
	vs, err := c.CreateCollection(ctx, col)
	require.NoError(t, err)

	holders := func() map[string]int {
		infos, err := c.Subscriptions(ctx)
		require.NoError(t, err)
		out := map[string]int{}
		for _, info := range infos {
			for _, p := range info.Positions {
				if p.Holder != "" {
					out[p.Holder]++
				}
			}
		}
		return out
	}
	first := subscribe(t, ctx, c, "grp", client.SubscribeCollection(col.ID), dataTypes, client.SubscribeGroup("first"),
		client.SubscribeLeaseTTL(groupTTL))
	require.Equal(t, map[string]int{"first": shards}, holders())
	other := newClient(t, s)
	second := subscribe(t, ctx, other, "grp", client.SubscribeCollection(col.ID), dataTypes, client.SubscribeGroup("second"),
		client.SubscribeLeaseTTL(groupTTL))
	require.Eventually(t, func() bool {
		h := holders()
		return h["first"] == 1 && h["second"] == 1
	}, 20*time.Second, 20*time.Millisecond, "one VChannel each")

	_, err = c.Subscribe(ctx, "grp", client.SubscribeCollection(col.ID))
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "a group's name is not a plain subscription")
	_, err = c.Subscribe(ctx, "grp", client.SubscribeCollection(col.ID), client.SubscribeGroup("bad.name"))
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, err = c.Subscribe(ctx, "grp2", client.SubscribeCollection(col.ID), client.SubscribeLeaseTTL(time.Second))
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "a lease TTL without a group")
	_, err = c.Subscribe(ctx, "grp2", client.SubscribeCollection(col.ID), client.SubscribeGroup(""), client.SubscribeLeaseTTL(-time.Second))
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)

	require.NoError(t, first.Close())
	require.Eventually(t, func() bool { return holders()["second"] == shards }, 20*time.Second, 20*time.Millisecond,
		"the member left gives its VChannels back")
	for i, v := range vs {
		appendNumbered(t, ctx, c, v, fmt.Sprintf("v%d", i), 0, 1)
	}
	got := delivered(receive(t, ctx, second, 2))
	require.ElementsMatch(t, []string{"v0-0", "v1-0"}, got)
}
