package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LastID returns the id of the newest message of writer among the last
// messages on each of subjects (see HighWater). Each is read with the
// stream's message get API, last_by_subj, which the server answers from
// its per-subject index without scanning. Not a direct get: with
// allow_direct, any replica answers one, and a lagging one would name an
// older message.
func (b *JetStream) LastID(ctx context.Context, writer string, subjects []string) (string, error) {
	prefix := writer + ":"
	var last string
	var lastSeq uint64
	for _, subj := range subjects {
		seq, id, err := b.lastOn(ctx, subj)
		if err != nil {
			return "", err
		}
		if seq > lastSeq && strings.HasPrefix(id, prefix) {
			last, lastSeq = id, seq
		}
	}
	return last, nil
}

// lastOn returns the sequence and Nats-Msg-Id of the stream's last message
// on subj (0 and "" when there is none).
func (b *JetStream) lastOn(ctx context.Context, subj string) (uint64, string, error) {
	seq, hdr, err := b.msgGet(ctx, struct {
		LastFor string `json:"last_by_subj"`
	}{subj})
	if err != nil {
		return 0, "", fmt.Errorf("jetstream: last message on %q: %w", subj, err)
	}
	return seq, hdr.Get(jetstream.MsgIDHeader), nil
}

// msgGet asks the stream's leader for one message (the API's message get,
// not a direct get, which a replica that has not stored it yet may answer)
// and returns its sequence and headers: 0 and none when there is no such
// message.
func (b *JetStream) msgGet(ctx context.Context, req any) (uint64, nats.Header, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return 0, nil, err
	}
	resp, err := b.core.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+b.cfg.Stream, data)
	if err != nil {
		return 0, nil, err
	}
	var r struct {
		Message *struct {
			Seq     uint64 `json:"seq"`
			Headers []byte `json:"hdrs"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return 0, nil, err
	}
	switch {
	case r.Error != nil && r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, nil, nil
	case r.Error != nil:
		return 0, nil, r.Error
	case r.Message == nil:
		return 0, nil, errors.New("an answer without a message")
	case len(r.Message.Headers) == 0:
		return r.Message.Seq, nil, nil
	}
	hdr, err := nats.DecodeHeadersMsg(r.Message.Headers)
	if err != nil {
		return 0, nil, fmt.Errorf("headers: %w", err)
	}
	return r.Message.Seq, hdr, nil
}

// registryBucket is the key-value bucket that holds the registry
// documents (see Registry), one key per stream.
const registryBucket = "fanwire_registry"

// registry opens (creating it if missing) the registry's bucket.
func (b *JetStream) registry(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := b.js.KeyValue(ctx, registryBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = b.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      registryBucket,
			Description: "fanwire: the writers of each stream (the ingests' subjects)",
			History:     1,
			Storage:     jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = b.js.KeyValue(ctx, registryBucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("jetstream: registry bucket %q: %w", registryBucket, err)
	}
	return kv, nil
}

// registryKey is the stream's key in the bucket: its name, which NATS
// limits to characters a key may hold but for a few, escaped.
func (b *JetStream) registryKey() string {
	var k strings.Builder
	for i := 0; i < len(b.cfg.Stream); i++ {
		c := b.cfg.Stream[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			k.WriteByte(c)
			continue
		}
		fmt.Fprintf(&k, "=%02X", c)
	}
	return "stream." + k.String()
}

// LoadRegistry returns the stream's registry document and its revision.
func (b *JetStream) LoadRegistry(ctx context.Context) ([]byte, uint64, error) {
	kv, err := b.registry(ctx)
	if err != nil {
		return nil, 0, err
	}
	e, err := kv.Get(ctx, b.registryKey())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("jetstream: registry: %w", err)
	}
	return e.Value(), e.Revision(), nil
}

// StoreRegistry replaces the stream's registry document if it is still at
// revision rev.
func (b *JetStream) StoreRegistry(ctx context.Context, doc []byte, rev uint64) (uint64, error) {
	kv, err := b.registry(ctx)
	if err != nil {
		return 0, err
	}
	var n uint64
	if rev == 0 {
		n, err = kv.Create(ctx, b.registryKey(), doc)
	} else {
		n, err = kv.Update(ctx, b.registryKey(), doc, rev)
	}
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyExists) || errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return 0, fmt.Errorf("jetstream: registry: %w: changed since revision %d", ErrConflict, rev)
	}
	if err != nil {
		return 0, fmt.Errorf("jetstream: registry: %w", err)
	}
	return n, nil
}
