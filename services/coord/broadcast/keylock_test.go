package broadcast_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord/broadcast"
)

func sk(d messages.Domain, key string) messages.ResourceKey {
	return messages.ResourceKey{Domain: d, Key: key}
}

func xk(d messages.Domain, key string) messages.ResourceKey {
	return messages.ResourceKey{Domain: d, Key: key, Exclusive: true}
}

var exclusiveCluster = messages.ResourceKey{Domain: messages.DomainCluster, Exclusive: true}

// acquire asks for keys and returns whether they were granted at once.
func acquire(t *testing.T, tab *broadcast.KeyLocks, id uint64, keys ...messages.ResourceKey) bool {
	t.Helper()
	ok, err := tab.Acquire(id, keys)
	require.NoError(t, err)
	return ok
}

func release(t *testing.T, tab *broadcast.KeyLocks, id uint64) []uint64 {
	t.Helper()
	granted, err := tab.Release(id)
	require.NoError(t, err)
	return granted
}

func TestKeyLocksSharedKeysCoexist(t *testing.T) {
	tab := broadcast.NewKeyLocks()
	for id := uint64(1); id <= 3; id++ {
		require.True(t, acquire(t, tab, id, messages.SharedCluster, sk(messages.DomainDBName, "db")))
	}
	require.Equal(t, 3, tab.Holders())
	require.Zero(t, tab.Waiting())
}

func TestKeyLocksExclusiveConflictsOnlyOnSameDomainAndKey(t *testing.T) {
	tab := broadcast.NewKeyLocks()
	require.True(t, acquire(t, tab, 1, xk(messages.DomainCollectionName, "db/a")))
	require.False(t, acquire(t, tab, 2, xk(messages.DomainCollectionName, "db/a")), "exclusive against exclusive")
	require.False(t, acquire(t, tab, 3, sk(messages.DomainCollectionName, "db/a")), "shared against exclusive")
	require.True(t, acquire(t, tab, 4, xk(messages.DomainCollectionName, "db/b")), "another key")
	require.True(t, acquire(t, tab, 5, xk(messages.DomainDBName, "db/a")), "same key, another domain")
	require.True(t, acquire(t, tab, 6, xk(messages.DomainSnapshotName, "db/a")), "same key, another domain")

	require.True(t, acquire(t, tab, 7, sk(messages.DomainDBName, "x")))
	require.False(t, acquire(t, tab, 8, xk(messages.DomainDBName, "x")), "exclusive against shared")

	require.Equal(t, []uint64{2}, release(t, tab, 1), "the exclusive waiter first; the shared one waits behind it")
	require.Equal(t, []uint64{3}, release(t, tab, 2))
	require.Equal(t, []uint64{8}, release(t, tab, 7))
	require.Zero(t, tab.Waiting())
}

func TestKeyLocksSharedAndExclusiveCluster(t *testing.T) {
	tab := broadcast.NewKeyLocks()
	// Ordinary broadcasts share the cluster key.
	require.True(t, acquire(t, tab, 1, messages.SharedCluster, xk(messages.DomainDBName, "a")))
	require.True(t, acquire(t, tab, 2, messages.SharedCluster, xk(messages.DomainDBName, "b")))
	// A cluster barrier waits for every one of them ...
	require.False(t, acquire(t, tab, 3, exclusiveCluster))
	// ... and nothing that starts later overtakes it, even on other keys.
	require.False(t, acquire(t, tab, 4, messages.SharedCluster, xk(messages.DomainDBName, "c")))
	require.False(t, acquire(t, tab, 5, messages.SharedCluster, xk(messages.DomainPrivilege, "")))
	require.Empty(t, release(t, tab, 1))
	require.Equal(t, []uint64{3}, release(t, tab, 2))
	require.Equal(t, []uint64{4, 5}, release(t, tab, 3), "both pass at once, in arrival order")
	require.False(t, acquire(t, tab, 6, exclusiveCluster))
	require.False(t, acquire(t, tab, 7, exclusiveCluster))
	require.Empty(t, release(t, tab, 4))
	require.Equal(t, []uint64{6}, release(t, tab, 5))
	require.Equal(t, []uint64{7}, release(t, tab, 6), "barriers one at a time")
}

func TestKeyLocksAllOrNone(t *testing.T) {
	tab := broadcast.NewKeyLocks()
	require.True(t, acquire(t, tab, 1, xk(messages.DomainCollectionName, "db/a")))
	// 2 needs db/b (free) and db/a (held): it takes neither.
	require.False(t, acquire(t, tab, 2, xk(messages.DomainCollectionName, "db/b"), xk(messages.DomainCollectionName, "db/a")))
	require.False(t, tab.Held(2))
	require.Equal(t, 1, tab.Holders())
	// A release of something else does not hand 2 part of its keys.
	require.True(t, acquire(t, tab, 3, xk(messages.DomainCollectionName, "db/c")))
	require.Empty(t, release(t, tab, 3))
	require.False(t, tab.Held(2))
	// Once db/a is free, 2 gets both.
	require.Equal(t, []uint64{2}, release(t, tab, 1))
	require.True(t, tab.Held(2))
	require.False(t, acquire(t, tab, 4, sk(messages.DomainCollectionName, "db/b")))
	require.False(t, acquire(t, tab, 5, sk(messages.DomainCollectionName, "db/a")))
	require.Equal(t, []uint64{4, 5}, release(t, tab, 2))
}

func TestKeyLocksFairness(t *testing.T) {
	tab := broadcast.NewKeyLocks()
	require.True(t, acquire(t, tab, 1, sk(messages.DomainDBName, "a")))
	// An exclusive waiter ...
	require.False(t, acquire(t, tab, 2, xk(messages.DomainDBName, "a")))
	// ... is not overtaken by a later shared request that the holder
	// alone would let through,
	require.False(t, acquire(t, tab, 3, sk(messages.DomainDBName, "a")))
	// nor by one that conflicts with it through one of several keys,
	require.False(t, acquire(t, tab, 4, sk(messages.DomainCollectionName, "x"), sk(messages.DomainDBName, "a")))
	// while later requests it does not conflict with pass, also those
	// sharing a key with a waiter.
	require.True(t, acquire(t, tab, 5, xk(messages.DomainDBName, "b")))
	require.True(t, acquire(t, tab, 6, sk(messages.DomainCollectionName, "x")))
	require.Equal(t, 3, tab.Waiting())
	// A later exclusive request on 4's other key waits behind 4.
	require.False(t, acquire(t, tab, 7, xk(messages.DomainCollectionName, "x")))

	require.Equal(t, []uint64{2}, release(t, tab, 1))
	require.Equal(t, []uint64{3, 4}, release(t, tab, 2))
	require.Empty(t, release(t, tab, 4), "6 still shares x")
	require.Equal(t, []uint64{7}, release(t, tab, 6))
}

func TestKeyLocksReleaseAndCancelReturnNewlyGrantedInOrder(t *testing.T) {
	tab := broadcast.NewKeyLocks()
	require.True(t, acquire(t, tab, 1, exclusiveCluster))
	require.False(t, acquire(t, tab, 2, messages.SharedCluster, xk(messages.DomainDBName, "a")))
	require.False(t, acquire(t, tab, 3, messages.SharedCluster, xk(messages.DomainDBName, "b")))
	require.False(t, acquire(t, tab, 4, messages.SharedCluster, xk(messages.DomainDBName, "a")))
	require.False(t, acquire(t, tab, 5, messages.SharedCluster, xk(messages.DomainDBName, "c")))
	require.Equal(t, []uint64{2, 3, 5}, release(t, tab, 1))
	require.True(t, tab.Held(2) && tab.Held(3) && tab.Held(5))
	require.False(t, tab.Held(4))

	// Cancel: 7 waits for 6 and blocks 8; withdrawing 7 lets 8 through,
	// 9 passed at once because it conflicts with nobody.
	tab = broadcast.NewKeyLocks()
	require.True(t, acquire(t, tab, 6, xk(messages.DomainDBName, "a")))
	require.False(t, acquire(t, tab, 7, xk(messages.DomainDBName, "a"), xk(messages.DomainDBName, "b")))
	require.False(t, acquire(t, tab, 8, xk(messages.DomainDBName, "b")))
	require.False(t, acquire(t, tab, 10, sk(messages.DomainDBName, "b")))
	require.True(t, acquire(t, tab, 9, xk(messages.DomainDBName, "c")))
	granted, err := tab.Cancel(7)
	require.NoError(t, err)
	require.Equal(t, []uint64{8}, granted, "10 still waits behind 8")
	require.Equal(t, []uint64{10}, release(t, tab, 8))
	granted, err = tab.Cancel(10)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "10 holds now")
	require.Nil(t, granted)
}

func TestKeyLocksErrorsChangeNothing(t *testing.T) {
	tab := broadcast.NewKeyLocks()
	require.True(t, acquire(t, tab, 1, xk(messages.DomainDBName, "a")))
	require.False(t, acquire(t, tab, 2, xk(messages.DomainDBName, "a")))
	state := func() (bool, bool, int, int) { return tab.Held(1), tab.Held(2), tab.Holders(), tab.Waiting() }
	h1, h2, holders, waiting := state()

	// Acquire by an id that holds or waits, whatever the keys.
	for _, id := range []uint64{1, 2} {
		ok, err := tab.Acquire(id, []messages.ResourceKey{xk(messages.DomainDBName, "z")})
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
		require.False(t, ok)
	}
	// Release of a waiter or of an unknown id.
	for _, id := range []uint64{2, 3} {
		granted, err := tab.Release(id)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
		require.Nil(t, granted)
	}
	// Cancel of a holder or of an unknown id.
	for _, id := range []uint64{1, 3} {
		granted, err := tab.Cancel(id)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
		require.Nil(t, granted)
	}
	g1, g2, gh, gw := state()
	require.Equal(t, []any{h1, h2, holders, waiting}, []any{g1, g2, gh, gw})
	// z was never taken by the refused Acquire of 1.
	require.True(t, acquire(t, tab, 4, xk(messages.DomainDBName, "z")))
	// The table still works as before.
	require.Equal(t, []uint64{2}, release(t, tab, 1))
	granted, err := tab.Release(1)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "a double release")
	require.Nil(t, granted)
}

func TestKeyLocksDuplicateKeysMergeExclusiveWins(t *testing.T) {
	tab := broadcast.NewKeyLocks()
	require.True(t, acquire(t, tab, 1, sk(messages.DomainDBName, "a"), xk(messages.DomainDBName, "a")))
	require.False(t, acquire(t, tab, 2, sk(messages.DomainDBName, "a")), "the merged key is exclusive")
	require.Equal(t, []uint64{2}, release(t, tab, 1))
}

// request is one Acquire as the model sees it.
type request struct {
	id   uint64
	keys []messages.ResourceKey
	seq  int // arrival order
}

// conflicts restates the rule independently: two requests conflict when
// some key of one and some key of the other name the same resource (domain
// and key) and at least one of the two is exclusive.
func conflicts(a, b request) bool {
	for _, x := range a.keys {
		for _, y := range b.keys {
			if x.Domain == y.Domain && x.Key == y.Key && (x.Exclusive || y.Exclusive) {
				return true
			}
		}
	}
	return false
}

var modelDomains = []messages.Domain{messages.DomainCluster, messages.DomainDBName, messages.DomainCollectionName}

// TestKeyLocksModel drives the table with random acquires, releases and
// cancels (and invalid calls) and checks after every step: (a) no two
// holders conflict; (b) every waiter conflicts with a holder or an earlier
// waiter, so it could not have been granted and no wakeup was lost; (c)
// among conflicting requests grants follow arrival: when a request is
// granted, every earlier request it conflicts with was granted before or
// withdrawn. Invalid calls fail with ErrInvalidArgument and change
// nothing; Release and Cancel return exactly the newly granted IDs in
// arrival order.
func TestKeyLocksModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tab := broadcast.NewKeyLocks()
		holders := map[uint64]request{}
		var waiting []request // arrival order
		granted := map[uint64]bool{}
		cancelled := map[uint64]bool{}
		var all []request
		next := uint64(1)

		keyGen := rapid.Custom(func(t *rapid.T) messages.ResourceKey {
			return messages.ResourceKey{
				Domain:    rapid.SampledFrom(modelDomains).Draw(t, "domain"),
				Key:       rapid.SampledFrom([]string{"a", "b"}).Draw(t, "key"),
				Exclusive: rapid.Bool().Draw(t, "exclusive"),
			}
		})
		// grantedNow records a grant and checks (c).
		grantedNow := func(r request) {
			for _, e := range all[:r.seq] {
				if conflicts(r, e) {
					require.True(t, granted[e.id] || cancelled[e.id], "%d granted before earlier conflicting %d", r.id, e.id)
				}
			}
			granted[r.id] = true
			holders[r.id] = r
		}
		// expectGrants computes which waiters a release or cancel must
		// let through, in order, and applies them to the model.
		expectGrants := func() []uint64 {
			var want []uint64
			var still []request
			for _, w := range waiting {
				free := true
				for _, h := range holders {
					free = free && !conflicts(w, h)
				}
				for _, e := range still {
					free = free && !conflicts(w, e)
				}
				if free {
					want = append(want, w.id)
					grantedNow(w)
					continue
				}
				still = append(still, w)
			}
			waiting = still
			return want
		}

		for range rapid.IntRange(1, 120).Draw(t, "steps") {
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0, 1: // acquire
				r := request{id: next, keys: rapid.SliceOfN(keyGen, 1, 3).Draw(t, "keys"), seq: len(all)}
				next++
				all = append(all, r)
				ok, err := tab.Acquire(r.id, slices.Clone(r.keys))
				require.NoError(t, err)
				free := true
				for _, h := range holders {
					free = free && !conflicts(r, h)
				}
				for _, w := range waiting {
					free = free && !conflicts(r, w)
				}
				require.Equal(t, free, ok, "acquire %d %v", r.id, r.keys)
				if ok {
					grantedNow(r)
				} else {
					waiting = append(waiting, r)
				}
			case 2: // release a holder
				if len(holders) == 0 {
					continue
				}
				ids := make([]uint64, 0, len(holders))
				for id := range holders {
					ids = append(ids, id)
				}
				slices.Sort(ids)
				id := rapid.SampledFrom(ids).Draw(t, "release")
				got, err := tab.Release(id)
				require.NoError(t, err)
				delete(holders, id)
				require.Equal(t, expectGrants(), got, "release %d", id)
			case 3: // cancel a waiter
				if len(waiting) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(waiting)-1).Draw(t, "cancel")
				id := waiting[i].id
				waiting = slices.Delete(waiting, i, i+1)
				cancelled[id] = true
				got, err := tab.Cancel(id)
				require.NoError(t, err)
				require.Equal(t, expectGrants(), got, "cancel %d", id)
			case 4: // an invalid acquire: an id that holds or waits
				if len(all) == 0 {
					continue
				}
				id := all[rapid.IntRange(0, len(all)-1).Draw(t, "dup")].id
				_, live := holders[id]
				live = live || slices.ContainsFunc(waiting, func(w request) bool { return w.id == id })
				if !live {
					continue
				}
				ok, err := tab.Acquire(id, []messages.ResourceKey{keyGen.Draw(t, "dupkey")})
				require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
				require.False(t, ok)
			case 5: // an invalid release (non-holder) or cancel (non-waiter)
				id := rapid.Uint64Range(1, next).Draw(t, "bad")
				_, held := holders[id]
				waits := slices.ContainsFunc(waiting, func(w request) bool { return w.id == id })
				if !held {
					got, err := tab.Release(id)
					require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
					require.Nil(t, got)
				}
				if !waits {
					got, err := tab.Cancel(id)
					require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
					require.Nil(t, got)
				}
			}
			checkTable(t, tab, holders, waiting, next)
		}
	})
}

func checkTable(t *rapid.T, tab *broadcast.KeyLocks, holders map[uint64]request, waiting []request, next uint64) {
	require.Equal(t, len(holders), tab.Holders())
	require.Equal(t, len(waiting), tab.Waiting())
	for id := uint64(1); id < next; id++ {
		_, held := holders[id]
		require.Equal(t, held, tab.Held(id), "held %d", id)
	}
	// (a) no two holders conflict.
	for a, ra := range holders {
		for b, rb := range holders {
			if a < b {
				require.False(t, conflicts(ra, rb), "holders %d and %d conflict", a, b)
			}
		}
	}
	// (b) every waiter is blocked by a holder or an earlier waiter.
	for i, w := range waiting {
		blocked := false
		for _, h := range holders {
			blocked = blocked || conflicts(w, h)
		}
		for _, e := range waiting[:i] {
			blocked = blocked || conflicts(w, e)
		}
		require.True(t, blocked, "waiter %d could have been granted", w.id)
	}
}
