package jetstream

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
)

// objectChunk is the size of the object store's chunks (messages of its
// stream): under every server's default payload limit of 1 MiB.
const objectChunk = 512 << 10

// objectDedupe is the duplicate window of the object store's stream: the
// smallest the server accepts. Object writes carry no message IDs, but a
// stream remembers them for its window (2 minutes unless set), and a
// restarted server reloads every message stored within it to do so: after
// a truncation had just archived a million messages, that was reading
// 940 MB of objects back at every start (0.43 s of a 0.69 s restart).
const objectDedupe = 100 * time.Millisecond

// ErrChecksumMismatch: an archived range or a flushed segment does not hold
// the bytes its checksum was computed over.
var ErrChecksumMismatch = errors.New("checksum mismatch")

// ErrNoSegment: no flushed segment of that VChannel and ID is stored.
var ErrNoSegment = errors.New("no such flushed segment")

// objects returns the object store of archived ranges and flushed
// segments, creating it on first use with the backend's storage and
// replicas.
func (b *JetStream) objects(ctx context.Context) (njs.ObjectStore, error) {
	b.objMu.Lock()
	defer b.objMu.Unlock()
	if b.obs != nil {
		return b.obs, nil
	}
	name := b.codec.Cluster().ObjectStoreName(streamwal.ObjectStoreSegments)
	var obs njs.ObjectStore
	err := InAttempts(ctx, func(ctx context.Context) (err error) {
		for {
			obs, err = b.js.ObjectStore(ctx, name)
			if !errors.Is(err, njs.ErrBucketNotFound) {
				return err
			}
			obs, err = b.js.CreateObjectStore(ctx, njs.ObjectStoreConfig{
				Bucket:      name,
				Description: "streamwal archived ranges and flushed segments of cluster " + string(b.codec.Cluster()),
				Storage:     b.opts.storage(),
				Replicas:    b.opts.Replicas,
			})
			if !errors.Is(err, njs.ErrBucketExists) && !errors.Is(err, njs.ErrStreamNameAlreadyInUse) {
				return err
			}
			// Being created by another process: look until it is there.
			if err := pause(ctx); err != nil {
				return err
			}
		}
	})
	if err != nil {
		return nil, classify(fmt.Errorf("object store %s: %w", name, err))
	}
	b.obs = obs
	return obs, nil
}

// writableObjects is objects for a backend about to write to it: the
// first time, it sets the duplicate window of the store's stream to
// objectDedupe (nats.go creates object stores with the server's
// default). Readers, which may not update the stream, never ask; a
// failure leaves the window as it is, which costs restart time, never
// correctness.
func (b *JetStream) writableObjects(ctx context.Context) (njs.ObjectStore, error) {
	obs, err := b.objects(ctx)
	if err != nil {
		return nil, err
	}
	b.objMu.Lock()
	defer b.objMu.Unlock()
	if b.shrunk {
		return obs, nil
	}
	stream := streamwal.ObjectStreamName(b.codec.Cluster().ObjectStoreName(streamwal.ObjectStoreSegments))
	s, err := b.js.Stream(ctx, stream)
	if err == nil {
		cfg := s.CachedInfo().Config
		if cfg.Duplicates != objectDedupe {
			cfg.Duplicates = objectDedupe
			_, err = b.js.UpdateStream(ctx, cfg)
		}
	}
	if err != nil {
		b.log.Warn().Err(err).Str("stream", stream).Msg("object store's duplicate window not shrunk: a restart reads back the objects of the last window")
	}
	b.shrunk = true
	return obs, nil
}

// putObject stores data under name with metadata, replacing any object of
// that name.
func (b *JetStream) putObject(ctx context.Context, name string, data []byte, meta map[string]string) (*njs.ObjectInfo, error) {
	obs, err := b.writableObjects(ctx)
	if err != nil {
		return nil, err
	}
	info, err := obs.Put(ctx, njs.ObjectMeta{Name: name, Metadata: meta, Opts: &njs.ObjectMetaOptions{ChunkSize: objectChunk}},
		bytes.NewReader(data))
	if err != nil {
		return nil, classify(fmt.Errorf("put object %s: %w", name, err))
	}
	return info, nil
}

// getObject reads the object name and its info; a missing object is
// njs.ErrObjectNotFound.
func (b *JetStream) getObject(ctx context.Context, name string) ([]byte, *njs.ObjectInfo, error) {
	obs, err := b.objects(ctx)
	if err != nil {
		return nil, nil, err
	}
	r, err := obs.Get(ctx, name)
	if err != nil {
		return nil, nil, objectErr(name, err)
	}
	defer func() { _ = r.Close() }()
	info, err := r.Info()
	if err != nil {
		return nil, nil, objectErr(name, err)
	}
	data := make([]byte, 0, info.Size)
	buf := bytes.NewBuffer(data)
	if _, err := io.Copy(buf, r); err != nil {
		return nil, nil, objectErr(name, err)
	}
	return buf.Bytes(), info, nil
}

// objectInfo reads the info of the object name.
func (b *JetStream) objectInfo(ctx context.Context, name string) (*njs.ObjectInfo, error) {
	obs, err := b.objects(ctx)
	if err != nil {
		return nil, err
	}
	info, err := obs.GetInfo(ctx, name)
	if err != nil {
		return nil, objectErr(name, err)
	}
	return info, nil
}

// deleteObject deletes name; a missing object is no error.
func (b *JetStream) deleteObject(ctx context.Context, name string) error {
	obs, err := b.writableObjects(ctx)
	if err != nil {
		return err
	}
	if err := obs.Delete(ctx, name); err != nil && !errors.Is(err, njs.ErrObjectNotFound) {
		return classify(fmt.Errorf("delete object %s: %w", name, err))
	}
	return nil
}

// objectErr keeps njs.ErrObjectNotFound reachable and classifies the rest.
func objectErr(name string, err error) error {
	if errors.Is(err, njs.ErrObjectNotFound) {
		return fmt.Errorf("object %s: %w", name, err)
	}
	if errors.Is(err, njs.ErrDigestMismatch) {
		return streamwal.Errorf(streamwal.CodeUnrecoverable, "object %s: %w", name, ErrChecksumMismatch)
	}
	return classify(fmt.Errorf("object %s: %w", name, err))
}

// checksum is the hex SHA-256 of data.
func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// verify checks an object read with getObject against its recorded
// checksum. The object store checked the bytes read against the object's
// SHA-256 digest, so comparing that digest with the checksum is enough;
// an object without a digest is hashed here.
func verify(what string, data []byte, info *njs.ObjectInfo, want string) error {
	got := ""
	if sum, err := njs.DecodeObjectDigest(info.Digest); err == nil && len(sum) == sha256.Size {
		got = hex.EncodeToString(sum)
	} else {
		got = checksum(data)
	}
	if got != want {
		return streamwal.Errorf(streamwal.CodeUnrecoverable, "%s: sha256 %s, recorded %s: %w", what, got, want, ErrChecksumMismatch)
	}
	return nil
}
