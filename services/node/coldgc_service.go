package node

import (
	"context"

	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	"github.com/ursula/ursula/storage/cold"
)

// coldGCService serves ColdGCService (the cold-GC worker's view of the
// node) on the client plane; a thin adapter over the engine.
type coldGCService struct {
	coldgcv1.UnimplementedColdGCServiceServer
	cold *cold.Tier
}

func (s *coldGCService) GetGCQueue(ctx context.Context, req *coldgcv1.GetGCQueueRequest) (*coldgcv1.GetGCQueueResponse, error) {
	limit := int(req.GetLimit())
	if limit <= 0 || limit > 4096 {
		limit = 4096
	}
	q, n, held, err := s.cold.GCQueue(ctx, req.GetGroup(), limit)
	if err != nil {
		return nil, toStatus(err)
	}
	return &coldgcv1.GetGCQueueResponse{Entries: q, Total: uint64(n), GroupCount: uint32(s.cold.GroupCount()), Held: held}, nil
}

func (s *coldGCService) AckGC(ctx context.Context, req *coldgcv1.AckGCRequest) (*coldgcv1.AckGCResponse, error) {
	if err := s.cold.AckGC(ctx, req.GetGroup(), req.GetSeqs()); err != nil {
		return nil, toStatus(err)
	}
	return &coldgcv1.AckGCResponse{}, nil
}

func (s *coldGCService) ListCompactions(ctx context.Context, req *coldgcv1.ListCompactionsRequest) (*coldgcv1.ListCompactionsResponse, error) {
	cs, err := s.cold.CompactionCandidates(ctx, req.GetGroup(), req.GetSmallBytes(), req.GetMaxBytes())
	if err != nil {
		return nil, toStatus(err)
	}
	out := &coldgcv1.ListCompactionsResponse{}
	for _, c := range cs {
		out.Compactions = append(out.Compactions, &coldgcv1.Compaction{Bucket: c.Key.Bucket, Stream: c.Key.Stream, Incarnation: c.Incarnation, Run: c.Run})
	}
	return out, nil
}

func (s *coldGCService) CommitCompaction(ctx context.Context, req *coldgcv1.CommitCompactionRequest) (*coldgcv1.CommitCompactionResponse, error) {
	if err := s.cold.CommitCompaction(ctx, req.GetGroup(), req.GetSwap()); err != nil {
		return nil, toStatus(err)
	}
	return &coldgcv1.CommitCompactionResponse{}, nil
}

func (s *coldGCService) ListLivePrefixes(ctx context.Context, _ *coldgcv1.ListLivePrefixesRequest) (*coldgcv1.ListLivePrefixesResponse, error) {
	live, err := s.cold.LivePrefixes(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &coldgcv1.ListLivePrefixesResponse{}
	for p := range live {
		out.Prefixes = append(out.Prefixes, p)
	}
	return out, nil
}

func (s *coldGCService) GetColdReferences(ctx context.Context, req *coldgcv1.GetColdReferencesRequest) (*coldgcv1.GetColdReferencesResponse, error) {
	keys, live, err := s.cold.ColdReferences(ctx, req.GetPrefix())
	if err != nil {
		return nil, toStatus(err)
	}
	return &coldgcv1.GetColdReferencesResponse{Live: live, Keys: keys}, nil
}
