package messages

import (
	"reflect"
	"strings"

	"github.com/streamwal/streamwal"
)

// The built-in catalog of DESIGN.md §5. Every registry starts with these.
var (
	TypeTimeTick        = builtin("TimeTick", DispatchPChannel, NoLock, nil, FlagSelfControlled|FlagNotTraced|FlagUnreplicable, TimeTickBody{})
	TypeRecoveryBarrier = builtin("RecoveryBarrier", DispatchPChannel, NoLock, nil, FlagSelfControlled|FlagUnreplicable, RecoveryBarrierBody{})

	TypeCreateSegment = builtin("CreateSegment", DispatchVChannel, NoLock, nil, FlagSelfControlled, CreateSegmentBody{})
	TypeFlush         = builtin("Flush", DispatchVChannel, NoLock, nil, FlagSelfControlled, FlushBody{})

	TypeBeginTxn    = builtin("BeginTxn", DispatchVChannel, NoLock, nil, FlagTxnControl, BeginTxnBody{})
	TypeCommitTxn   = builtin("CommitTxn", DispatchVChannel, NoLock, nil, FlagTxnControl, CommitTxnBody{})
	TypeRollbackTxn = builtin("RollbackTxn", DispatchVChannel, NoLock, nil, FlagTxnControl, RollbackTxnBody{})
	// TypeTxn is the synthetic message a reader sees for a committed
	// transaction; it is never appended.
	TypeTxn = builtin("Txn", DispatchVChannel, NoLock, nil, FlagSynthetic, nil)

	TypeInsert = builtin("Insert", DispatchVChannel, SharedVChannelLock, nil, FlagTxnBody, nil)
	TypeDelete = builtin("Delete", DispatchVChannel, SharedVChannelLock, nil, FlagTxnBody, nil)
	TypeUpsert = builtin("Upsert", DispatchVChannel, SharedVChannelLock, nil, FlagTxnBody, nil)

	TypeManualFlush = builtin("ManualFlush", DispatchVChannel, ExclusiveVChannelLock, nil, 0, ManualFlushBody{})

	TypeCreateCollection   = collectionDDL("CreateCollection", 0, CreateCollectionBody{})
	TypeDropCollection     = collectionDDL("DropCollection", 0, DropCollectionBody{})
	TypeAlterCollection    = collectionDDL("AlterCollection", 0, AlterCollectionBody{})
	TypeCreatePartition    = collectionDDL("CreatePartition", 0, PartitionBody{})
	TypeDropPartition      = collectionDDL("DropPartition", 0, PartitionBody{})
	TypeTruncateCollection = collectionDDL("TruncateCollection", FlagAckSyncUp, TruncateCollectionBody{})

	TypeCreateIndex         = controlOnly("CreateIndex", collectionKeys, 0)
	TypeAlterIndex          = controlOnly("AlterIndex", collectionKeys, 0)
	TypeDropIndex           = controlOnly("DropIndex", collectionKeys, 0)
	TypeAlterLoadConfig     = controlOnly("AlterLoadConfig", collectionKeys, 0)
	TypeDropLoadConfig      = controlOnly("DropLoadConfig", collectionKeys, 0)
	TypeImport              = builtin("Import", DispatchVChannels, NoLock, collectionKeys, 0, nil)
	TypeCreateDatabase      = controlOnly("CreateDatabase", databaseKeys, 0)
	TypeAlterDatabase       = controlOnly("AlterDatabase", databaseKeys, 0)
	TypeDropDatabase        = controlOnly("DropDatabase", databaseKeys, 0)
	TypeAlterAlias          = controlOnly("AlterAlias", databaseKeys, 0)
	TypeDropAlias           = controlOnly("DropAlias", databaseKeys, 0)
	TypeAlterUser           = controlOnly("AlterUser", privilegeKeys, 0)
	TypeDropUser            = controlOnly("DropUser", privilegeKeys, 0)
	TypeAlterRole           = controlOnly("AlterRole", privilegeKeys, 0)
	TypeDropRole            = controlOnly("DropRole", privilegeKeys, 0)
	TypeAlterUserRole       = controlOnly("AlterUserRole", privilegeKeys, 0)
	TypeDropUserRole        = controlOnly("DropUserRole", privilegeKeys, 0)
	TypeAlterPrivilege      = controlOnly("AlterPrivilege", privilegeKeys, 0)
	TypeDropPrivilege       = controlOnly("DropPrivilege", privilegeKeys, 0)
	TypeAlterPrivilegeGroup = controlOnly("AlterPrivilegeGroup", privilegeKeys, 0)
	TypeDropPrivilegeGroup  = controlOnly("DropPrivilegeGroup", privilegeKeys, 0)
	TypeRestoreRBAC         = controlOnly("RestoreRBAC", privilegeKeys, 0)
	TypeAlterResourceGroup  = controlOnly("AlterResourceGroup", clusterKeys, FlagUnreplicable)
	TypeDropResourceGroup   = controlOnly("DropResourceGroup", clusterKeys, FlagUnreplicable)

	TypeFlushAll = clusterBarrier("FlushAll", FlagAckSyncUp, FlushAllBody{})
	// AlterReplicateConfig is unreplicable: each member cluster is
	// configured by a broadcast of its own, so that a secondary's
	// topology can change without its primary (failover).
	TypeAlterReplicateConfig = clusterBarrier("AlterReplicateConfig", FlagUnreplicable, AlterReplicateConfigBody{})
	TypeAlterWAL             = clusterBarrier("AlterWAL", 0, AlterWALBody{})
)

// Key declarations shared by several types.
var (
	collectionKeys = []KeyRule{{Domain: DomainDBName}, {Domain: DomainCollectionName, Exclusive: true}}
	databaseKeys   = []KeyRule{{Domain: DomainDBName, Exclusive: true}}
	privilegeKeys  = []KeyRule{{Domain: DomainPrivilege, Exclusive: true}}
	clusterKeys    = []KeyRule{{Domain: DomainCluster, Exclusive: true}}
)

// builtinTypes lists the catalog in declaration order.
var builtinTypes []*Type

// Builtins returns the built-in catalog in declaration order.
func Builtins() []*Type { return append([]*Type(nil), builtinTypes...) }

// builtin declares one built-in type. A nil body means opaque bytes.
func builtin(name string, d Dispatch, l Lock, keys []KeyRule, f Flags, body any) *Type {
	t := &Type{Name: name, Token: streamwal.Token(strings.ToLower(name)), Dispatch: d, Lock: l, Keys: keys, Flags: f}
	if body != nil {
		t.Body = reflect.TypeOf(body)
	}
	if err := t.validate(); err != nil {
		panic("messages: bad built-in type: " + err.Error())
	}
	builtinTypes = append(builtinTypes, t)
	return t
}

// collectionDDL declares a collection lifecycle type: VChannels plus
// CChannel, exclusive VChannel lock, SharedDBName + ExclusiveCollectionName.
func collectionDDL(name string, f Flags, body any) *Type {
	return builtin(name, DispatchVChannelsAndCChannel, ExclusiveVChannelLock, collectionKeys, f, body)
}

// controlOnly declares a type broadcast to the CChannel only.
func controlOnly(name string, keys []KeyRule, f Flags) *Type {
	return builtin(name, DispatchCChannel, NoLock, keys, f, nil)
}

// clusterBarrier declares a type that takes every PChannel exclusively.
func clusterBarrier(name string, f Flags, body any) *Type {
	return builtin(name, DispatchAllPChannels, ExclusivePChannelLock, clusterKeys, f, body)
}
