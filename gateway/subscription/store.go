package subscription

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// recordVersion is the version written in every state record.
const recordVersion = 1

// Record operations; see doc.go for the format.
const (
	opCreate = "create"
	opLinks  = "links"
	opDelete = "delete"
)

// definition is the persisted, immutable part of a subscription.
type definition struct {
	ID          string   `json:"id"`
	Type        string   `json:"type"`
	Pattern     string   `json:"pattern,omitempty"`
	Streams     []string `json:"streams,omitempty"`
	WebhookURL  string   `json:"webhook_url,omitempty"`
	WakeStream  string   `json:"wake_stream,omitempty"`
	LeaseTTLMS  int64    `json:"lease_ttl_ms"`
	Description *string  `json:"description,omitempty"`
	CreatedAt   string   `json:"created_at"`
	BaseURL     string   `json:"base_url,omitempty"`
	ConfigHash  string   `json:"config_hash"`
}

// linkState is the persisted state of one subscription-to-stream link. A
// link with neither Glob nor Explicit set is removed.
type linkState struct {
	Path     string `json:"path"`
	Glob     bool   `json:"glob,omitempty"`
	Explicit bool   `json:"explicit,omitempty"`
	Acked    string `json:"acked"`
}

// record is one line of the state stream.
type record struct {
	V     int         `json:"v"`
	Op    string      `json:"op"`
	ID    string      `json:"id"`
	Def   *definition `json:"def,omitempty"`
	Links []linkState `json:"links,omitempty"`
}

// stateStore persists records in a JSON stream through StreamService.
type stateStore struct {
	client streamv1.StreamServiceClient
	ref    *streamv1.StreamRef
}

func (s *stateStore) ensure(ctx context.Context) error {
	_, err := s.client.CreateStream(ctx, &streamv1.CreateStreamRequest{
		Ref:         s.ref,
		ContentType: jsonContentType,
	})
	if err != nil {
		return fmt.Errorf("create state stream %s/%s: %w", s.ref.GetBucket(), s.ref.GetStream(), err)
	}
	return nil
}

// replay creates the state stream if needed and calls apply for every
// record in order.
func (s *stateStore) replay(ctx context.Context, apply func(record)) (int, error) {
	if err := s.ensure(ctx); err != nil {
		return 0, err
	}
	offset := "-1"
	n := 0
	for {
		resp, err := s.client.Read(ctx, &streamv1.ReadRequest{Ref: s.ref, Offset: offset, NoTouch: true})
		if err != nil {
			return n, fmt.Errorf("read state stream at %s: %w", offset, err)
		}
		for line := range bytes.SplitSeq(resp.GetData(), []byte("\n")) {
			line = bytes.TrimSpace(line)
			if len(line) == 0 {
				continue
			}
			var rec record
			if err := json.Unmarshal(line, &rec); err != nil {
				return n, fmt.Errorf("decode state record after %s: %w", offset, err)
			}
			apply(rec)
			n++
		}
		next := resp.GetNextOffset()
		if resp.GetUpToDate() || next == "" || (next == offset && len(resp.GetData()) == 0) {
			return n, nil
		}
		offset = next
	}
}

// append writes one record, recreating the stream once if it vanished.
func (s *stateStore) append(ctx context.Context, rec record) error {
	rec.V = recordVersion
	body, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode state record: %w", err)
	}
	req := &streamv1.AppendRequest{Ref: s.ref, ContentType: jsonContentType, Body: body}
	_, err = s.client.Append(ctx, req)
	if err != nil && grpcerr.FromStatus(err).Code == errcode.StreamNotFound {
		if err := s.ensure(ctx); err != nil {
			return err
		}
		_, err = s.client.Append(ctx, req)
	}
	if err != nil {
		return fmt.Errorf("append state record %s %s: %w", rec.Op, rec.ID, err)
	}
	return nil
}
