package messages_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

func TestRegisterApplicationTypes(t *testing.T) {
	reg := messages.NewRegistry()
	before := reg.Types()

	vectorUpsert, err := reg.Register(messages.TypeSpec{
		Name: "VectorUpsert2", Dispatch: messages.DispatchVChannel, Lock: messages.SharedVChannelLock,
		Flags: messages.FlagTxnBody,
	})
	require.NoError(t, err)
	require.Equal(t, "VectorUpsert2", vectorUpsert.Name)
	require.Equal(t, streamwal.Token("vectorupsert2"), vectorUpsert.Token)
	require.Nil(t, vectorUpsert.Body, "application payloads are opaque")

	snapshot, err := reg.Register(messages.TypeSpec{
		Name: "CreateSnapshot", Dispatch: messages.DispatchVChannelsAndCChannel, Lock: messages.ExclusiveVChannelLock,
		Keys:  []messages.KeyRule{{Domain: messages.DomainDBName}, {Domain: messages.DomainSnapshotName, Exclusive: true}},
		Flags: messages.FlagAckSyncUp | messages.FlagUnreplicable | messages.FlagNotTraced,
	})
	require.NoError(t, err)

	everyP, err := reg.Register(messages.TypeSpec{
		Name: "AppBarrier", Dispatch: messages.DispatchAllPChannels, Lock: messages.ExclusivePChannelLock,
		Keys: []messages.KeyRule{{Domain: messages.DomainCluster, Exclusive: true}},
	})
	require.NoError(t, err)

	require.Equal(t, append(before, vectorUpsert, snapshot, everyP), reg.Types(), "built-ins first, then registration order")
	for _, typ := range []*messages.Type{vectorUpsert, snapshot, everyP} {
		got, err := reg.Lookup(typ.Name)
		require.NoError(t, err)
		require.Same(t, typ, got)
		got, err = reg.LookupToken(typ.Token)
		require.NoError(t, err)
		require.Same(t, typ, got)
		require.True(t, reg.Has(typ))
	}
	// Other registries are unaffected.
	other := messages.NewRegistry()
	_, err = other.Lookup("VectorUpsert2")
	requireInvalid(t, err, messages.ErrUnknownType)
	require.False(t, other.Has(vectorUpsert))

	c, err := messages.NewCodec(testCluster, reg)
	require.NoError(t, err)
	require.Same(t, reg, c.Registry())

	// A DML-like application type: opaque payload, txn body, properties.
	v := vch(t, 3, 1)
	m, err := c.New(vectorUpsert, v, []byte{0, 1, 2, 0xff}, messages.WithProperty("app", "x"),
		messages.WithTxn(messages.TxnContext{ID: 9, Keepalive: messages.DefaultKeepalive}))
	require.NoError(t, err)
	m.SetTimeTick(mustTick(t, 1_700_000_000_000, 3))
	m.SetLastConfirmed(12)
	nm, im := roundTrip(t, c, m, 13)
	require.Equal(t, testCluster.VChannelSubject(v, "vectorupsert2"), nm.Subject)
	require.Equal(t, "VectorUpsert2", nm.Header.Get(messages.HdrType))
	require.Equal(t, []byte{0, 1, 2, 0xff}, im.Payload())

	// A broadcast application type.
	b, err := c.NewBroadcast(snapshot, messages.Targets{VChannels: []streamwal.VChannel{v}, CChannel: cch(t)},
		messages.KeyScope{DBName: "db", SnapshotName: "s1"}, []byte("snap"))
	require.NoError(t, err)
	require.Equal(t, []string{"S:Cluster:", "S:DBName:db", "X:SnapshotName:s1"}, keyStrings(b.Keys()))
	b.SetID(77)
	for _, r := range b.Split() {
		require.True(t, r.Header().Unreplicable, "unreplicable type marks its messages")
		roundTrip(t, c, r, 20)
	}

	// A cluster-barrier application type.
	bb, err := c.NewBroadcast(everyP, messages.Targets{PChannels: []streamwal.PChannel{pch(t, 0), pch(t, 1)}}, messages.KeyScope{}, nil)
	require.NoError(t, err)
	bb.SetID(78)
	for i, r := range bb.Split() {
		nm, _ := roundTrip(t, c, r, 30)
		require.Equal(t, testCluster.PChannelSubject(pch(t, i), "appbarrier"), nm.Subject)
	}

	// The built-in codec does not know application types.
	plain := newCodec(t)
	_, err = plain.New(vectorUpsert, v, []byte("x"))
	requireInvalid(t, err, messages.ErrUnknownType)
	_, err = plain.Encode(m)
	requireInvalid(t, err, messages.ErrUnknownType)
	_, err = plain.Decode(nm, 13)
	requireInvalid(t, err, messages.ErrUnknownType)
}

func TestRegisterKeepsItsOwnCopyOfKeys(t *testing.T) {
	reg := messages.NewRegistry()
	keys := []messages.KeyRule{{Domain: messages.DomainDBName, Exclusive: true}}
	typ, err := reg.Register(messages.TypeSpec{Name: "AppDDL", Dispatch: messages.DispatchCChannel, Keys: keys})
	require.NoError(t, err)
	keys[0].Domain = messages.DomainSnapshotName
	require.Equal(t, messages.DomainDBName, typ.Keys[0].Domain)
}

func TestRegisterRefusals(t *testing.T) {
	okDispatch := messages.DispatchVChannel
	cases := []struct {
		name string
		spec messages.TypeSpec
	}{
		{"duplicate built-in name", messages.TypeSpec{Name: "Insert", Dispatch: okDispatch}},
		{"token clash with built-in", messages.TypeSpec{Name: "INSERT", Dispatch: okDispatch}},
		{"token clash with built-in, mixed case", messages.TypeSpec{Name: "CreateCOLLECTION", Dispatch: messages.DispatchCChannel}},
		{"token clash with synthetic Txn", messages.TypeSpec{Name: "TXN", Dispatch: okDispatch}},
		{"duplicate app name", messages.TypeSpec{Name: "AppType", Dispatch: okDispatch}},
		{"token clash with app type", messages.TypeSpec{Name: "APPTYPE", Dispatch: okDispatch}},
		{"empty name", messages.TypeSpec{Name: "", Dispatch: okDispatch}},
		{"lower-case start", messages.TypeSpec{Name: "insertX", Dispatch: okDispatch}},
		{"digit start", messages.TypeSpec{Name: "1Type", Dispatch: okDispatch}},
		{"underscore", messages.TypeSpec{Name: "My_Type", Dispatch: okDispatch}},
		{"dash", messages.TypeSpec{Name: "My-Type", Dispatch: okDispatch}},
		{"dot", messages.TypeSpec{Name: "My.Type", Dispatch: okDispatch}},
		{"space", messages.TypeSpec{Name: "My Type", Dispatch: okDispatch}},
		{"wildcard", messages.TypeSpec{Name: "My*", Dispatch: okDispatch}},
		{"non-ASCII", messages.TypeSpec{Name: "Ünsert", Dispatch: okDispatch}},
		{"too long", messages.TypeSpec{Name: "T" + strings.Repeat("x", streamwal.MaxTokenLen), Dispatch: okDispatch}},
		{"self-controlled flag", messages.TypeSpec{Name: "AppA", Dispatch: okDispatch, Flags: messages.FlagSelfControlled}},
		{"txn control flag", messages.TypeSpec{Name: "AppB", Dispatch: okDispatch, Flags: messages.FlagTxnControl}},
		{"synthetic flag", messages.TypeSpec{Name: "AppC", Dispatch: okDispatch, Flags: messages.FlagSynthetic}},
		{"unknown flag", messages.TypeSpec{Name: "AppD", Dispatch: okDispatch, Flags: 1 << 12}},
		{"pchannel dispatch", messages.TypeSpec{Name: "AppE", Dispatch: messages.DispatchPChannel}},
		{"zero dispatch", messages.TypeSpec{Name: "AppF"}},
		{"invalid dispatch", messages.TypeSpec{Name: "AppG", Dispatch: 42}},
		{"keys on non-broadcast", messages.TypeSpec{Name: "AppH", Dispatch: okDispatch,
			Keys: []messages.KeyRule{{Domain: messages.DomainDBName}}}},
		{"invalid key domain", messages.TypeSpec{Name: "AppI", Dispatch: messages.DispatchCChannel,
			Keys: []messages.KeyRule{{Domain: 0}}}},
		{"key domain out of range", messages.TypeSpec{Name: "AppJ", Dispatch: messages.DispatchCChannel,
			Keys: []messages.KeyRule{{Domain: 9, Exclusive: true}}}},
		{"lock without scope", messages.TypeSpec{Name: "AppK", Dispatch: okDispatch, Lock: messages.Lock{Mode: messages.LockExclusive}}},
		{"scope without mode", messages.TypeSpec{Name: "AppL", Dispatch: okDispatch, Lock: messages.Lock{Scope: messages.ScopeVChannel}}},
		{"unknown lock mode", messages.TypeSpec{Name: "AppM", Dispatch: okDispatch, Lock: messages.Lock{Mode: 7, Scope: messages.ScopeVChannel}}},
		{"unknown lock scope", messages.TypeSpec{Name: "AppN", Dispatch: okDispatch, Lock: messages.Lock{Mode: messages.LockShared, Scope: 9}}},
	}
	reg := messages.NewRegistry()
	_, err := reg.Register(messages.TypeSpec{Name: "AppType", Dispatch: okDispatch})
	require.NoError(t, err)
	before := reg.Types()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			typ, err := reg.Register(tc.spec)
			require.Nil(t, typ)
			requireInvalid(t, err, messages.ErrBadType)
			require.Equal(t, before, reg.Types(), "a refused registration changes nothing")
			if tc.spec.Name != "" && tc.spec.Name != "Insert" && tc.spec.Name != "AppType" {
				_, err := reg.Lookup(tc.spec.Name)
				requireInvalid(t, err, messages.ErrUnknownType)
			}
			// The original holders of clashing tokens are untouched.
			got, err := reg.LookupToken("insert")
			require.NoError(t, err)
			require.Same(t, messages.TypeInsert, got)
		})
	}
}

func TestLookupUnknown(t *testing.T) {
	reg := messages.NewRegistry()
	for _, n := range []string{"", "insert", "INSERT", "Nope", " Insert", "Insert "} {
		_, err := reg.Lookup(n)
		requireInvalid(t, err, messages.ErrUnknownType)
	}
	for _, tok := range []streamwal.Token{"", "Insert", "nope", "insert "} {
		_, err := reg.LookupToken(tok)
		requireInvalid(t, err, messages.ErrUnknownType)
	}
	require.False(t, reg.Has(nil))
	cp := *messages.TypeInsert
	require.False(t, reg.Has(&cp), "a copy of a type is not the registered type")
}

func TestRegistryConcurrentUse(t *testing.T) {
	reg := messages.NewRegistry()
	c, err := messages.NewCodec(testCluster, reg)
	require.NoError(t, err)
	v := vch(t, 3, 0)
	const workers = 16
	const perWorker = 20
	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker*4)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				name := fmt.Sprintf("App%dx%d", w, i)
				typ, err := reg.Register(messages.TypeSpec{Name: name, Dispatch: messages.DispatchVChannel})
				if err != nil {
					errs <- err
					continue
				}
				// Everyone races on one shared name too: exactly one wins.
				_, _ = reg.Register(messages.TypeSpec{Name: fmt.Sprintf("Shared%d", i), Dispatch: messages.DispatchVChannel})
				if _, err := reg.Lookup(name); err != nil {
					errs <- err
				}
				if _, err := reg.LookupToken(typ.Token); err != nil {
					errs <- err
				}
				if _, err := reg.Lookup("Insert"); err != nil {
					errs <- err
				}
				_ = reg.Types()
				m, err := c.New(typ, v, []byte(name))
				if err != nil {
					errs <- err
					continue
				}
				nm, err := c.Encode(m)
				if err != nil {
					errs <- err
					continue
				}
				im, err := c.Decode(nm, 1)
				if err != nil {
					errs <- err
					continue
				}
				if im.Type() != typ {
					errs <- fmt.Errorf("decoded %s as %s", name, im.Type())
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	types := reg.Types()
	require.Len(t, types, len(messages.Builtins())+workers*perWorker+perWorker)
	seen := map[string]bool{}
	for _, typ := range types {
		require.False(t, seen[typ.Name], "%s listed twice", typ.Name)
		seen[typ.Name] = true
	}
	for i := range perWorker {
		require.True(t, seen[fmt.Sprintf("Shared%d", i)])
	}
}

func TestRegisterNameLimits(t *testing.T) {
	reg := messages.NewRegistry()
	for _, name := range []string{"A", "Z9", "X" + strings.Repeat("y", streamwal.MaxTokenLen-1), "CamelCase123"} {
		typ, err := reg.Register(messages.TypeSpec{Name: name, Dispatch: messages.DispatchVChannel})
		require.NoError(t, err, name)
		require.Equal(t, strings.ToLower(name), string(typ.Token))
		_, err = streamwal.ParseToken(string(typ.Token))
		require.NoError(t, err)
	}
}
