package messages_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

func TestSmoke(t *testing.T) {
	c, err := messages.NewCodec("c1", nil)
	require.NoError(t, err)
	p, _ := streamwal.NewPChannel("pchan", 3)
	v, _ := p.VChannel(42, 0)
	m, err := c.New(messages.TypeInsert, v, []byte("hello"), messages.WithProperty("k", "v"), messages.WithDML(7, 3))
	require.NoError(t, err)
	m.SetTimeTick(12345)
	nm, err := c.Encode(m)
	require.NoError(t, err)
	t.Log(nm.Subject, nm.Header)
	im, err := c.Decode(nm, 9)
	require.NoError(t, err)
	require.Equal(t, m.Header(), im.Header())
	b, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{v}, CChannel: p.CChannel()},
		messages.KeyScope{DBName: "db", CollectionName: "coll"}, mustBody(t, messages.TypeCreateCollection, messages.CreateCollectionBody{VChannels: []string{v.String()}}))
	require.NoError(t, err)
	b.SetID(5)
	for _, r := range b.Split() {
		nm, err := c.Encode(r)
		require.NoError(t, err)
		t.Log(nm.Subject, nm.Header)
		im, err := c.Decode(nm, 10)
		require.NoError(t, err)
		require.Equal(t, r.Header(), im.Header())
	}
}

func mustBody(t *testing.T, typ *messages.Type, body any) []byte {
	b, err := messages.MarshalBody(typ, body)
	require.NoError(t, err)
	return b
}
