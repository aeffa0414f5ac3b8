package lock_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/lock"
)

var locks = []messages.Lock{messages.NoLock, messages.SharedVChannelLock, messages.ExclusiveVChannelLock, messages.ExclusivePChannelLock}

func vchannels(t require.TestingT) []streamwal.VChannel {
	p, err := streamwal.NewPChannel("pchan", 0)
	require.NoError(t, err)
	var out []streamwal.VChannel
	for i := int64(1); i <= 3; i++ {
		v, err := p.VChannel(i, 0)
		require.NoError(t, err)
		out = append(out, v)
	}
	return out
}

// conflict is the rule, restated independently for the checker.
func conflict(a, b lock.Request) bool {
	norm := func(l messages.Lock) messages.Lock {
		if l == messages.NoLock {
			return messages.Lock{Mode: messages.LockShared, Scope: messages.ScopePChannel}
		}
		return l
	}
	la, lb := norm(a.Lock), norm(b.Lock)
	if la == messages.ExclusivePChannelLock || lb == messages.ExclusivePChannelLock {
		return true
	}
	if la.Scope == messages.ScopeVChannel && lb.Scope == messages.ScopeVChannel && a.VChannel == b.VChannel {
		return la.Mode == messages.LockExclusive || lb.Mode == messages.LockExclusive
	}
	return false
}

// TestTableModel drives the table with random acquires, releases and
// cancels and checks after every step: no two holders conflict; no waiter
// could be granted (it conflicts with a holder or an earlier waiter), so no
// wakeup is lost; and a waiter is never overtaken by a later request it
// conflicts with.
func TestTableModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vs := vchannels(t)
		tab := lock.NewTable()
		holders := map[uint64]lock.Request{}
		var waiting []lock.Request // in arrival order
		next := uint64(1)
		for range rapid.IntRange(1, 150).Draw(t, "steps") {
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				r := lock.Request{ID: next, Lock: rapid.SampledFrom(locks).Draw(t, "lock"), VChannel: rapid.SampledFrom(vs).Draw(t, "v")}
				next++
				ok, err := tab.Acquire(r)
				require.NoError(t, err)
				if ok {
					for _, w := range waiting {
						require.False(t, conflict(r, w), "request %d overtook earlier waiter %d", r.ID, w.ID)
					}
					holders[r.ID] = r
				} else {
					waiting = append(waiting, r)
				}
			case 1:
				if len(holders) == 0 {
					continue
				}
				id := pick(t, holders)
				granted, err := tab.Release(id)
				require.NoError(t, err)
				delete(holders, id)
				waiting = admit(t, granted, waiting, holders)
			case 2:
				if len(waiting) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(waiting)-1).Draw(t, "cancel")
				id := waiting[i].ID
				waiting = append(waiting[:i], waiting[i+1:]...)
				granted, err := tab.Cancel(id)
				require.NoError(t, err)
				waiting = admit(t, granted, waiting, holders)
			}
			check(t, tab, holders, waiting)
		}
	})
}

func pick(t *rapid.T, holders map[uint64]lock.Request) uint64 {
	ids := make([]uint64, 0, len(holders))
	for id := range holders {
		ids = append(ids, id)
	}
	return rapid.SampledFrom(ids).Draw(t, "release")
}

// admit moves granted requests from waiting to holders, checking that each
// was waiting and that no earlier still-waiting request conflicts with it.
func admit(t *rapid.T, granted []uint64, waiting []lock.Request, holders map[uint64]lock.Request) []lock.Request {
	for _, id := range granted {
		i := -1
		for j, w := range waiting {
			if w.ID == id {
				i = j
			}
		}
		require.GreaterOrEqual(t, i, 0, "granted %d was not waiting", id)
		for _, w := range waiting[:i] {
			if !contains(granted, w.ID) {
				require.False(t, conflict(waiting[i], w), "granted %d overtook waiter %d", id, w.ID)
			}
		}
		holders[id] = waiting[i]
	}
	var still []lock.Request
	for _, w := range waiting {
		if !contains(granted, w.ID) {
			still = append(still, w)
		}
	}
	return still
}

func contains(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func check(t *rapid.T, tab *lock.Table, holders map[uint64]lock.Request, waiting []lock.Request) {
	for a, ra := range holders {
		require.True(t, tab.Held(a))
		for b, rb := range holders {
			if a < b {
				require.False(t, conflict(ra, rb), "holders %d and %d conflict", a, b)
			}
		}
	}
	require.Equal(t, len(waiting), tab.Waiting())
	for i, w := range waiting {
		blocked := false
		for _, h := range holders {
			blocked = blocked || conflict(w, h)
		}
		for _, e := range waiting[:i] {
			blocked = blocked || conflict(w, e)
		}
		require.True(t, blocked, "waiter %d could have been granted", w.ID)
	}
}

func TestExclusiveVChannelWaitsForSharedAndBlocksLaterShared(t *testing.T) {
	vs := vchannels(t)
	tab := lock.NewTable()
	shared := func(id uint64, v streamwal.VChannel) lock.Request {
		return lock.Request{ID: id, Lock: messages.SharedVChannelLock, VChannel: v}
	}
	ok, err := tab.Acquire(shared(1, vs[0]))
	require.NoError(t, err)
	require.True(t, ok)
	ok, _ = tab.Acquire(lock.Request{ID: 2, Lock: messages.ExclusiveVChannelLock, VChannel: vs[0]})
	require.False(t, ok, "exclusive waits for the in-flight shared lock")
	ok, _ = tab.Acquire(shared(3, vs[0]))
	require.False(t, ok, "a later shared lock waits behind the exclusive one")
	ok, _ = tab.Acquire(shared(4, vs[1]))
	require.True(t, ok, "another vchannel is unaffected")
	granted, err := tab.Release(1)
	require.NoError(t, err)
	require.Equal(t, []uint64{2}, granted)
	granted, _ = tab.Release(2)
	require.Equal(t, []uint64{3}, granted)
}

func TestExclusivePChannelExcludesEverything(t *testing.T) {
	vs := vchannels(t)
	tab := lock.NewTable()
	ok, _ := tab.Acquire(lock.Request{ID: 1, Lock: messages.NoLock})
	require.True(t, ok)
	ok, _ = tab.Acquire(lock.Request{ID: 2, Lock: messages.ExclusivePChannelLock})
	require.False(t, ok)
	ok, _ = tab.Acquire(lock.Request{ID: 3, Lock: messages.SharedVChannelLock, VChannel: vs[2]})
	require.False(t, ok, "nothing starts while a cluster barrier waits")
	granted, _ := tab.Release(1)
	require.Equal(t, []uint64{2}, granted)
	granted, _ = tab.Release(2)
	require.Equal(t, []uint64{3}, granted)
}

func TestBadRequestsChangeNothing(t *testing.T) {
	tab := lock.NewTable()
	_, err := tab.Acquire(lock.Request{ID: 1, Lock: messages.SharedVChannelLock})
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	ok, err := tab.Acquire(lock.Request{ID: 1})
	require.NoError(t, err)
	require.True(t, ok)
	_, err = tab.Acquire(lock.Request{ID: 1})
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, err = tab.Release(99)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, err = tab.Cancel(1)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.True(t, tab.Held(1))
}
