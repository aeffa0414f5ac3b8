package messages_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// The rules below restate DESIGN.md §5 (and the parts of §1 and §8 that
// speak about message types) one by one; they do not copy the catalog.

// Type names grouped as in the rows of the §5 table.
var (
	walInternalPChannel = []string{"TimeTick", "RecoveryBarrier"}
	walInternalVChannel = []string{"CreateSegment", "Flush"}
	txnControlTypes     = []string{"BeginTxn", "CommitTxn", "RollbackTxn"}
	syntheticTypes      = []string{"Txn"}
	dmlTypes            = []string{"Insert", "Delete", "Upsert"}
	manualFlushTypes    = []string{"ManualFlush"}
	collectionDDLTypes  = []string{"CreateCollection", "DropCollection", "AlterCollection", "CreatePartition", "DropPartition", "TruncateCollection"}
	indexLoadTypes      = []string{"CreateIndex", "AlterIndex", "DropIndex", "AlterLoadConfig", "DropLoadConfig"}
	importTypes         = []string{"Import"}
	databaseAliasTypes  = []string{"CreateDatabase", "AlterDatabase", "DropDatabase", "AlterAlias", "DropAlias"}
	rbacTypes           = []string{"AlterUser", "DropUser", "AlterRole", "DropRole", "AlterUserRole", "DropUserRole", "AlterPrivilege", "DropPrivilege", "AlterPrivilegeGroup", "DropPrivilegeGroup", "RestoreRBAC"}
	clusterBarrierTypes = []string{"FlushAll", "AlterReplicateConfig", "AlterWAL"}
	resourceGroupTypes  = []string{"AlterResourceGroup", "DropResourceGroup"}
	ackSyncUpTypes      = []string{"TruncateCollection", "FlushAll"}
)

func designTypeNames() []string {
	var all []string
	for _, g := range [][]string{walInternalPChannel, walInternalVChannel, txnControlTypes, syntheticTypes, dmlTypes,
		manualFlushTypes, collectionDDLTypes, indexLoadTypes, importTypes, databaseAliasTypes, rbacTypes,
		clusterBarrierTypes, resourceGroupTypes} {
		all = append(all, g...)
	}
	return all
}

func builtinByName(t *testing.T) map[string]*messages.Type {
	t.Helper()
	out := map[string]*messages.Type{}
	for _, typ := range messages.Builtins() {
		require.NotNil(t, typ)
		_, dup := out[typ.Name]
		require.False(t, dup, "built-in %s declared twice", typ.Name)
		out[typ.Name] = typ
	}
	return out
}

// forTypes runs check on the built-in of every name.
func forTypes(t *testing.T, names []string, check func(t *testing.T, typ *messages.Type)) {
	t.Helper()
	byName := builtinByName(t)
	for _, n := range names {
		typ, ok := byName[n]
		require.True(t, ok, "built-in %s missing", n)
		t.Run(n, func(t *testing.T) { check(t, typ) })
	}
}

func namesWhere(pred func(*messages.Type) bool) []string {
	var out []string
	for _, typ := range messages.Builtins() {
		if pred(typ) {
			out = append(out, typ.Name)
		}
	}
	slices.Sort(out)
	return out
}

func sorted(names ...[]string) []string {
	var out []string
	for _, n := range names {
		out = append(out, n...)
	}
	slices.Sort(out)
	return out
}

func TestCatalogHasExactlyTheDesignTypes(t *testing.T) {
	want := designTypeNames()
	require.Len(t, want, 45)
	var got []string
	for _, typ := range messages.Builtins() {
		got = append(got, typ.Name)
	}
	require.ElementsMatch(t, want, got)
	builtinByName(t) // no duplicates
}

func TestCatalogExportedVariables(t *testing.T) {
	byName := builtinByName(t)
	for name, v := range map[string]*messages.Type{
		"TimeTick": messages.TypeTimeTick, "RecoveryBarrier": messages.TypeRecoveryBarrier,
		"CreateSegment": messages.TypeCreateSegment, "Flush": messages.TypeFlush,
		"BeginTxn": messages.TypeBeginTxn, "CommitTxn": messages.TypeCommitTxn, "RollbackTxn": messages.TypeRollbackTxn,
		"Txn": messages.TypeTxn, "Insert": messages.TypeInsert, "Delete": messages.TypeDelete, "Upsert": messages.TypeUpsert,
		"ManualFlush": messages.TypeManualFlush, "CreateCollection": messages.TypeCreateCollection,
		"DropCollection": messages.TypeDropCollection, "AlterCollection": messages.TypeAlterCollection,
		"CreatePartition": messages.TypeCreatePartition, "DropPartition": messages.TypeDropPartition,
		"TruncateCollection": messages.TypeTruncateCollection, "CreateIndex": messages.TypeCreateIndex,
		"AlterIndex": messages.TypeAlterIndex, "DropIndex": messages.TypeDropIndex,
		"AlterLoadConfig": messages.TypeAlterLoadConfig, "DropLoadConfig": messages.TypeDropLoadConfig,
		"Import": messages.TypeImport, "CreateDatabase": messages.TypeCreateDatabase,
		"AlterDatabase": messages.TypeAlterDatabase, "DropDatabase": messages.TypeDropDatabase,
		"AlterAlias": messages.TypeAlterAlias, "DropAlias": messages.TypeDropAlias,
		"AlterUser": messages.TypeAlterUser, "DropUser": messages.TypeDropUser, "AlterRole": messages.TypeAlterRole,
		"DropRole": messages.TypeDropRole, "AlterUserRole": messages.TypeAlterUserRole,
		"DropUserRole": messages.TypeDropUserRole, "AlterPrivilege": messages.TypeAlterPrivilege,
		"DropPrivilege": messages.TypeDropPrivilege, "AlterPrivilegeGroup": messages.TypeAlterPrivilegeGroup,
		"DropPrivilegeGroup": messages.TypeDropPrivilegeGroup, "RestoreRBAC": messages.TypeRestoreRBAC,
		"AlterResourceGroup": messages.TypeAlterResourceGroup, "DropResourceGroup": messages.TypeDropResourceGroup,
		"FlushAll": messages.TypeFlushAll, "AlterReplicateConfig": messages.TypeAlterReplicateConfig,
		"AlterWAL": messages.TypeAlterWAL,
	} {
		require.Same(t, byName[name], v, name)
		require.Equal(t, name, v.String())
	}
}

func TestCatalogBuiltinsIsACopy(t *testing.T) {
	b := messages.Builtins()
	b[0] = nil
	require.NotNil(t, messages.Builtins()[0])
}

func TestCatalogEveryRegistryHoldsTheBuiltins(t *testing.T) {
	r := messages.NewRegistry()
	require.Equal(t, messages.Builtins(), r.Types())
	for _, typ := range messages.Builtins() {
		require.True(t, r.Has(typ))
		got, err := r.Lookup(typ.Name)
		require.NoError(t, err)
		require.Same(t, typ, got)
		got, err = r.LookupToken(typ.Token)
		require.NoError(t, err)
		require.Same(t, typ, got)
	}
}

func TestCatalogTokens(t *testing.T) {
	seen := map[streamwal.Token]string{}
	for _, typ := range messages.Builtins() {
		require.Equal(t, strings.ToLower(typ.Name), string(typ.Token), typ.Name)
		_, err := streamwal.ParseToken(string(typ.Token))
		require.NoError(t, err, typ.Name)
		prev, dup := seen[typ.Token]
		require.False(t, dup, "token %s of %s already used by %s", typ.Token, typ.Name, prev)
		seen[typ.Token] = typ.Name
	}
}

func TestCatalogDeclarationsAreValid(t *testing.T) {
	for _, typ := range messages.Builtins() {
		require.True(t, typ.Dispatch.Valid(), typ.Name)
		require.NotEqual(t, "invalid", typ.Dispatch.String(), typ.Name)
		for _, k := range typ.Keys {
			require.True(t, k.Domain.Valid(), typ.Name)
		}
	}
}

func TestCatalogDML(t *testing.T) {
	forTypes(t, dmlTypes, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchVChannel, typ.Dispatch, "DML goes to one VChannel")
		require.Equal(t, messages.SharedVChannelLock, typ.Lock, "DML takes the VChannel shared")
		require.True(t, typ.Is(messages.FlagTxnBody), "DML may be a txn body")
		require.Nil(t, typ.Body, "DML payload is the caller's bytes")
		require.Empty(t, typ.Keys)
	})
	require.Equal(t, sorted(dmlTypes), namesWhere(func(typ *messages.Type) bool { return typ.Is(messages.FlagTxnBody) }),
		"only DML may be a transaction body")
	require.Equal(t, sorted(dmlTypes), namesWhere(func(typ *messages.Type) bool { return typ.Lock == messages.SharedVChannelLock }),
		"only DML takes a shared lock")
}

func TestCatalogManualFlush(t *testing.T) {
	forTypes(t, manualFlushTypes, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchVChannel, typ.Dispatch)
		require.Equal(t, messages.ExclusiveVChannelLock, typ.Lock)
		require.Empty(t, typ.Keys)
	})
}

func TestCatalogClusterBarriers(t *testing.T) {
	forTypes(t, clusterBarrierTypes, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchAllPChannels, typ.Dispatch, "every PChannel")
		require.True(t, typ.Dispatch.PChannelLevel())
		require.True(t, typ.Dispatch.IsBroadcast())
		require.Equal(t, messages.ExclusivePChannelLock, typ.Lock, "takes the PChannel exclusively")
		requireKeysInclude(t, typ, messages.KeyRule{Domain: messages.DomainCluster, Exclusive: true})
		require.False(t, typ.Is(messages.FlagSelfControlled))
	})
	require.Equal(t, sorted(clusterBarrierTypes), namesWhere(func(typ *messages.Type) bool { return typ.Dispatch == messages.DispatchAllPChannels }))
	require.Equal(t, sorted(clusterBarrierTypes), namesWhere(func(typ *messages.Type) bool { return typ.Lock.Scope == messages.ScopePChannel }),
		"only cluster barriers lock a PChannel")
}

func TestCatalogCollectionDDL(t *testing.T) {
	forTypes(t, collectionDDLTypes, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchVChannelsAndCChannel, typ.Dispatch)
		require.Equal(t, messages.ExclusiveVChannelLock, typ.Lock)
		requireCollectionKeys(t, typ)
		require.NotNil(t, typ.Body, "the WAL interprets collection lifecycle bodies")
	})
	require.Equal(t, sorted(collectionDDLTypes), namesWhere(func(typ *messages.Type) bool {
		return typ.Dispatch == messages.DispatchVChannelsAndCChannel
	}))
	require.Equal(t, sorted(collectionDDLTypes, manualFlushTypes), namesWhere(func(typ *messages.Type) bool {
		return typ.Lock == messages.ExclusiveVChannelLock
	}), "DDL and flushes take the VChannel exclusively")
}

func TestCatalogAckSyncUp(t *testing.T) {
	require.Equal(t, sorted(ackSyncUpTypes), namesWhere(func(typ *messages.Type) bool { return typ.Is(messages.FlagAckSyncUp) }))
}

func TestCatalogResourceGroups(t *testing.T) {
	forTypes(t, resourceGroupTypes, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchCChannel, typ.Dispatch)
		require.True(t, typ.Is(messages.FlagUnreplicable))
		require.Equal(t, []messages.KeyRule{{Domain: messages.DomainCluster, Exclusive: true}}, typ.Keys)
		require.Equal(t, messages.NoLock, typ.Lock)
	})
	// Nothing a client writes is unreplicable but the resource groups and
	// the replication topology (each member cluster gets its own; the
	// WAL's own PChannel-level messages are per cluster too).
	for _, name := range namesWhere(func(typ *messages.Type) bool { return typ.Is(messages.FlagUnreplicable) }) {
		require.Contains(t, sorted(resourceGroupTypes, walInternalPChannel, []string{"AlterReplicateConfig"}), name)
	}
}

func TestCatalogRBAC(t *testing.T) {
	forTypes(t, rbacTypes, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchCChannel, typ.Dispatch)
		require.Equal(t, []messages.KeyRule{{Domain: messages.DomainPrivilege, Exclusive: true}}, typ.Keys)
		require.Equal(t, messages.NoLock, typ.Lock)
	})
}

func TestCatalogDatabaseAndAlias(t *testing.T) {
	forTypes(t, databaseAliasTypes, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchCChannel, typ.Dispatch)
		require.Equal(t, []messages.KeyRule{{Domain: messages.DomainDBName, Exclusive: true}}, typ.Keys)
		require.Equal(t, messages.NoLock, typ.Lock)
	})
}

func TestCatalogIndexAndLoadConfig(t *testing.T) {
	forTypes(t, indexLoadTypes, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchCChannel, typ.Dispatch, "CChannel only")
		require.Equal(t, messages.NoLock, typ.Lock)
		requireCollectionKeys(t, typ)
	})
	require.Equal(t, sorted(indexLoadTypes, databaseAliasTypes, rbacTypes, resourceGroupTypes),
		namesWhere(func(typ *messages.Type) bool { return typ.Dispatch == messages.DispatchCChannel }))
}

func TestCatalogImport(t *testing.T) {
	forTypes(t, importTypes, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchVChannels, typ.Dispatch, "VChannels only")
		require.Equal(t, messages.NoLock, typ.Lock)
		requireCollectionKeys(t, typ)
	})
	require.Equal(t, sorted(importTypes), namesWhere(func(typ *messages.Type) bool { return typ.Dispatch == messages.DispatchVChannels }))
}

func TestCatalogWALInternal(t *testing.T) {
	forTypes(t, walInternalPChannel, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchPChannel, typ.Dispatch)
		require.True(t, typ.Dispatch.PChannelLevel())
		require.False(t, typ.Dispatch.IsBroadcast())
		require.True(t, typ.Is(messages.FlagSelfControlled))
		require.Equal(t, messages.NoLock, typ.Lock)
		require.Empty(t, typ.Keys)
		require.NotNil(t, typ.Body)
	})
	forTypes(t, walInternalVChannel, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchVChannel, typ.Dispatch, "single VChannel")
		require.True(t, typ.Is(messages.FlagSelfControlled))
		require.Equal(t, messages.NoLock, typ.Lock)
		require.Empty(t, typ.Keys)
		require.NotNil(t, typ.Body)
	})
	require.Equal(t, sorted(walInternalPChannel, walInternalVChannel),
		namesWhere(func(typ *messages.Type) bool { return typ.Is(messages.FlagSelfControlled) }))
	require.Equal(t, sorted(walInternalPChannel), namesWhere(func(typ *messages.Type) bool { return typ.Dispatch == messages.DispatchPChannel }))
	// §8: TimeTick messages are never traced.
	require.Equal(t, []string{"TimeTick"}, namesWhere(func(typ *messages.Type) bool { return typ.Is(messages.FlagNotTraced) }))
}

func TestCatalogTxn(t *testing.T) {
	forTypes(t, syntheticTypes, func(t *testing.T, typ *messages.Type) {
		require.True(t, typ.Is(messages.FlagSynthetic))
		require.False(t, typ.Is(messages.FlagTxnBody))
		require.False(t, typ.Is(messages.FlagTxnControl))
	})
	forTypes(t, txnControlTypes, func(t *testing.T, typ *messages.Type) {
		require.Equal(t, messages.DispatchVChannel, typ.Dispatch, "transactions are scoped to one VChannel")
		require.True(t, typ.Is(messages.FlagTxnControl))
		require.False(t, typ.Is(messages.FlagTxnBody))
		require.Equal(t, messages.NoLock, typ.Lock)
	})
	require.Equal(t, sorted(syntheticTypes), namesWhere(func(typ *messages.Type) bool { return typ.Is(messages.FlagSynthetic) }))
	require.Equal(t, sorted(txnControlTypes), namesWhere(func(typ *messages.Type) bool { return typ.Is(messages.FlagTxnControl) }))
}

func TestCatalogKeysOnlyOnBroadcastTypes(t *testing.T) {
	for _, typ := range messages.Builtins() {
		if !typ.Dispatch.IsBroadcast() {
			require.Empty(t, typ.Keys, "%s is not a broadcast type", typ.Name)
		} else {
			require.NotEmpty(t, typ.Keys, "§5 gives every broadcast type resource keys: %s", typ.Name)
		}
	}
}

func TestCatalogDispatchPredicates(t *testing.T) {
	for d, want := range map[messages.Dispatch]struct {
		broadcast, plevel bool
		name              string
	}{
		messages.DispatchPChannel:             {false, true, "pchannel"},
		messages.DispatchVChannel:             {false, false, "vchannel"},
		messages.DispatchVChannelsAndCChannel: {true, false, "vchannels+cchannel"},
		messages.DispatchCChannel:             {true, false, "cchannel"},
		messages.DispatchVChannels:            {true, false, "vchannels"},
		messages.DispatchAllPChannels:         {true, true, "all-pchannels"},
	} {
		require.True(t, d.Valid())
		require.Equal(t, want.broadcast, d.IsBroadcast(), d.String())
		require.Equal(t, want.plevel, d.PChannelLevel(), d.String())
		require.Equal(t, want.name, d.String())
	}
	for _, d := range []messages.Dispatch{0, 7, 255} {
		require.False(t, d.Valid())
		require.Equal(t, "invalid", d.String())
	}
	require.False(t, messages.Domain(0).Valid())
	require.Equal(t, "invalid", messages.Domain(99).String())
	require.True(t, messages.Flags(messages.FlagAckSyncUp|messages.FlagTxnBody).Has(messages.FlagTxnBody))
	require.False(t, messages.Flags(messages.FlagAckSyncUp).Has(messages.FlagAckSyncUp|messages.FlagTxnBody))
}

func requireKeysInclude(t *testing.T, typ *messages.Type, rule messages.KeyRule) {
	t.Helper()
	require.Contains(t, typ.Keys, rule, "%s", typ.Name)
}

func requireCollectionKeys(t *testing.T, typ *messages.Type) {
	t.Helper()
	require.ElementsMatch(t, []messages.KeyRule{
		{Domain: messages.DomainDBName},
		{Domain: messages.DomainCollectionName, Exclusive: true},
	}, typ.Keys, "%s: SharedDBName + ExclusiveCollectionName", typ.Name)
}

// --- ResourceKeys ---

var fullScope = messages.KeyScope{DBName: "db1", CollectionName: "coll1", SnapshotName: "snap1"}

func TestResourceKeysOfEveryBroadcastBuiltin(t *testing.T) {
	for _, typ := range messages.Builtins() {
		if !typ.Dispatch.IsBroadcast() {
			continue
		}
		t.Run(typ.Name, func(t *testing.T) {
			keys, err := messages.ResourceKeys(typ, fullScope)
			require.NoError(t, err)
			requireNormalized(t, keys)
			requireHasCluster(t, keys)
			for _, r := range typ.Keys {
				requireCovers(t, keys, r, fullScope)
			}
		})
	}
}

func TestResourceKeysExactForms(t *testing.T) {
	keys, err := messages.ResourceKeys(messages.TypeCreateCollection, fullScope)
	require.NoError(t, err)
	require.Equal(t, []messages.ResourceKey{
		messages.SharedCluster,
		{Domain: messages.DomainDBName, Key: "db1"},
		{Domain: messages.DomainCollectionName, Key: "db1/coll1", Exclusive: true},
	}, keys)
	require.Equal(t, []string{"S:Cluster:", "S:DBName:db1", "X:CollectionName:db1/coll1"}, keyStrings(keys))

	keys, err = messages.ResourceKeys(messages.TypeFlushAll, messages.KeyScope{})
	require.NoError(t, err)
	require.Equal(t, []string{"X:Cluster:"}, keyStrings(keys), "exclusive wins over the implicit SharedCluster")

	keys, err = messages.ResourceKeys(messages.TypeAlterUser, messages.KeyScope{})
	require.NoError(t, err)
	require.Equal(t, []string{"S:Cluster:", "X:Privilege:"}, keyStrings(keys))

	keys, err = messages.ResourceKeys(messages.TypeDropDatabase, messages.KeyScope{DBName: "db9"})
	require.NoError(t, err)
	require.Equal(t, []string{"S:Cluster:", "X:DBName:db9"}, keyStrings(keys))

	// A type without rules still takes SharedCluster.
	keys, err = messages.ResourceKeys(messages.TypeInsert, messages.KeyScope{})
	require.NoError(t, err)
	require.Equal(t, []messages.ResourceKey{messages.SharedCluster}, keys)
}

func keyStrings(keys []messages.ResourceKey) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.String()
	}
	return out
}

func TestResourceKeysMissingScope(t *testing.T) {
	for _, typ := range messages.Builtins() {
		for _, r := range typ.Keys {
			var scopes []messages.KeyScope
			switch r.Domain {
			case messages.DomainDBName:
				scopes = []messages.KeyScope{{CollectionName: "c", SnapshotName: "s"}}
			case messages.DomainCollectionName:
				scopes = []messages.KeyScope{{DBName: "db", SnapshotName: "s"}, {CollectionName: "c"}}
			case messages.DomainSnapshotName:
				scopes = []messages.KeyScope{{DBName: "db", CollectionName: "c"}}
			}
			for _, s := range scopes {
				_, err := messages.ResourceKeys(typ, s)
				requireInvalid(t, err, messages.ErrBadTarget)
			}
		}
	}
	// Unprintable or oversized names are refused too.
	for _, s := range []messages.KeyScope{
		{DBName: "d\nb", CollectionName: "c"},
		{DBName: "db", CollectionName: "c\x00"},
		{DBName: strings.Repeat("d", messages.MaxKeyLen+1), CollectionName: "c"},
	} {
		_, err := messages.ResourceKeys(messages.TypeCreateCollection, s)
		requireInvalid(t, err, messages.ErrBadTarget)
	}
	_, err := messages.ResourceKeys(messages.TypeCreateDatabase, messages.KeyScope{DBName: "\x7f"})
	requireInvalid(t, err, messages.ErrBadTarget)
}

func requireNormalized(t require.TestingT, keys []messages.ResourceKey) {
	for i := 1; i < len(keys); i++ {
		a, b := keys[i-1], keys[i]
		less := a.Domain < b.Domain || a.Domain == b.Domain && a.Key < b.Key
		require.True(t, less, "keys not strictly sorted by (domain, key): %v", keys)
	}
}

func requireHasCluster(t require.TestingT, keys []messages.ResourceKey) {
	for _, k := range keys {
		if k.Domain == messages.DomainCluster && k.Key == "" {
			return
		}
	}
	require.Fail(t, "no Cluster key", "%v", keys)
}

// requireCovers checks that a rule is held, at least as strongly as
// declared, in keys.
func requireCovers(t require.TestingT, keys []messages.ResourceKey, r messages.KeyRule, s messages.KeyScope) {
	want := ""
	switch r.Domain {
	case messages.DomainDBName:
		want = s.DBName
	case messages.DomainCollectionName:
		want = s.DBName + "/" + s.CollectionName
	case messages.DomainSnapshotName:
		want = s.SnapshotName
	}
	for _, k := range keys {
		if k.Domain == r.Domain && k.Key == want {
			require.True(t, k.Exclusive || !r.Exclusive, "rule %+v held shared: %v", r, keys)
			return
		}
	}
	require.Fail(t, "rule not covered", "rule %+v keys %v", r, keys)
}

func TestResourceKeysProperty(t *testing.T) {
	domains := []messages.Domain{messages.DomainCluster, messages.DomainDBName, messages.DomainCollectionName,
		messages.DomainPrivilege, messages.DomainSnapshotName}
	name := rapid.StringMatching(`[a-z0-9_]{1,8}`)
	rapid.Check(t, func(rt *rapid.T) {
		rules := rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) messages.KeyRule {
			return messages.KeyRule{Domain: rapid.SampledFrom(domains).Draw(rt, "domain"), Exclusive: rapid.Bool().Draw(rt, "x")}
		}), 0, 8).Draw(rt, "rules")
		scope := messages.KeyScope{DBName: name.Draw(rt, "db"), CollectionName: name.Draw(rt, "coll"), SnapshotName: name.Draw(rt, "snap")}
		typ := &messages.Type{Name: "Probe", Token: "probe", Dispatch: messages.DispatchCChannel, Keys: rules}
		keys, err := messages.ResourceKeys(typ, scope)
		require.NoError(rt, err)
		requireNormalized(rt, keys)
		requireHasCluster(rt, keys)
		for _, r := range rules {
			requireCovers(rt, keys, r, scope)
		}
		// Nothing else: every key comes from a rule or is SharedCluster, and
		// is exclusive only if some rule made it so.
		require.LessOrEqual(rt, len(keys), len(rules)+1)
		for _, k := range keys {
			if k.Exclusive {
				found := false
				for _, r := range rules {
					found = found || r.Domain == k.Domain && r.Exclusive
				}
				require.True(rt, found, "key %v exclusive without a rule", k)
			}
		}
		// Idempotent.
		require.Equal(rt, keys, messages.NormalizeKeys(keys))
	})
}

func TestNormalizeKeysProperty(t *testing.T) {
	gen := rapid.Custom(func(rt *rapid.T) messages.ResourceKey {
		return messages.ResourceKey{
			Domain:    messages.Domain(rapid.IntRange(1, 5).Draw(rt, "d")),
			Key:       rapid.SampledFrom([]string{"", "a", "b", "a/b"}).Draw(rt, "k"),
			Exclusive: rapid.Bool().Draw(rt, "x"),
		}
	})
	rapid.Check(t, func(rt *rapid.T) {
		in := rapid.SliceOf(gen).Draw(rt, "keys")
		orig := slices.Clone(in)
		out := messages.NormalizeKeys(in)
		require.Equal(rt, orig, in, "input must not be modified")
		requireNormalized(rt, out)
		for _, k := range in {
			found := false
			for _, o := range out {
				if o.Domain == k.Domain && o.Key == k.Key {
					found = true
					require.True(rt, o.Exclusive || !k.Exclusive)
				}
			}
			require.True(rt, found)
		}
		for _, o := range out {
			anyX := false
			present := false
			for _, k := range in {
				if o.Domain == k.Domain && o.Key == k.Key {
					present = true
					anyX = anyX || k.Exclusive
				}
			}
			require.True(rt, present)
			require.Equal(rt, anyX, o.Exclusive)
		}
		// Order of the input does not matter.
		perm := rapid.Permutation(in).Draw(rt, "perm")
		require.True(rt, slices.Equal(out, messages.NormalizeKeys(perm)))
	})
}

func TestResourceKeyStringParse(t *testing.T) {
	for _, k := range []messages.ResourceKey{
		messages.SharedCluster,
		{Domain: messages.DomainCluster, Exclusive: true},
		{Domain: messages.DomainPrivilege, Exclusive: true},
		{Domain: messages.DomainDBName, Key: "db"},
		{Domain: messages.DomainCollectionName, Key: "db/coll:with:colons", Exclusive: true},
		{Domain: messages.DomainSnapshotName, Key: "snap shot"},
	} {
		back, err := messages.ParseResourceKey(k.String())
		require.NoError(t, err, k.String())
		require.Equal(t, k, back)
	}
	for _, s := range []string{
		"", "S", "S:", "S:Cluster", "Q:Cluster:", "s:Cluster:", "S:cluster:", "S:Bogus:x",
		"S:Cluster:x", "X:Privilege:p", "S:DBName:", "S:CollectionName:", "S:SnapshotName:",
		"S:DBName:a\x00b", "S:DBName:\x7f", "S:DBName:" + strings.Repeat("k", messages.MaxKeyLen+1),
	} {
		_, err := messages.ParseResourceKey(s)
		requireInvalid(t, err, messages.ErrMalformed)
	}
}

func TestResourceKeyConflicts(t *testing.T) {
	sdb := messages.ResourceKey{Domain: messages.DomainDBName, Key: "db"}
	xdb := messages.ResourceKey{Domain: messages.DomainDBName, Key: "db", Exclusive: true}
	sother := messages.ResourceKey{Domain: messages.DomainDBName, Key: "other"}
	xcoll := messages.ResourceKey{Domain: messages.DomainCollectionName, Key: "db", Exclusive: true}
	require.False(t, sdb.Conflicts(sdb), "shared with shared")
	require.True(t, sdb.Conflicts(xdb))
	require.True(t, xdb.Conflicts(sdb))
	require.True(t, xdb.Conflicts(xdb))
	require.False(t, xdb.Conflicts(sother), "different key")
	require.False(t, xdb.Conflicts(xcoll), "different domain")
	xcl := messages.ResourceKey{Domain: messages.DomainCluster, Exclusive: true}
	require.True(t, xcl.Conflicts(messages.SharedCluster), "ExclusiveCluster excludes every broadcast")
}
