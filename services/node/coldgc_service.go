package node

import (
	"context"

	"google.golang.org/grpc"

	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/storage/engine"
)

// coldGCService serves ColdGCService (the cold-GC worker's view of the
// node) on the client plane; a thin adapter over the engine.
type coldGCService struct {
	coldgcv1.UnimplementedColdGCServiceServer
	eng *engine.Engine
}

func (s *coldGCService) GetGCQueue(ctx context.Context, req *coldgcv1.GetGCQueueRequest) (*coldgcv1.GetGCQueueResponse, error) {
	limit := int(req.GetLimit())
	if limit <= 0 || limit > 4096 {
		limit = 4096
	}
	q, n, err := s.eng.GCQueue(ctx, req.GetGroup(), limit)
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return &coldgcv1.GetGCQueueResponse{Entries: q, Total: uint64(n), GroupCount: uint32(s.eng.GroupCount())}, nil
}

func (s *coldGCService) AckGC(ctx context.Context, req *coldgcv1.AckGCRequest) (*coldgcv1.AckGCResponse, error) {
	if err := s.eng.AckGC(ctx, req.GetGroup(), req.GetSeqs()); err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return &coldgcv1.AckGCResponse{}, nil
}

func (s *coldGCService) ListCompactions(ctx context.Context, req *coldgcv1.ListCompactionsRequest) (*coldgcv1.ListCompactionsResponse, error) {
	cs, err := s.eng.CompactionCandidates(ctx, req.GetGroup(), req.GetSmallBytes(), req.GetMaxBytes())
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	out := &coldgcv1.ListCompactionsResponse{}
	for _, c := range cs {
		out.Compactions = append(out.Compactions, &coldgcv1.Compaction{Bucket: c.Key.Bucket, Stream: c.Key.Stream, Incarnation: c.Incarnation, Run: c.Run})
	}
	return out, nil
}

func (s *coldGCService) CommitCompaction(ctx context.Context, req *coldgcv1.CommitCompactionRequest) (*coldgcv1.CommitCompactionResponse, error) {
	if err := s.eng.CommitCompaction(ctx, req.GetGroup(), req.GetSwap()); err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return &coldgcv1.CommitCompactionResponse{}, nil
}

func (s *coldGCService) ListLivePrefixes(context.Context, *coldgcv1.ListLivePrefixesRequest) (*coldgcv1.ListLivePrefixesResponse, error) {
	out := &coldgcv1.ListLivePrefixesResponse{}
	for p := range s.eng.LivePrefixes() {
		out.Prefixes = append(out.Prefixes, p)
	}
	return out, nil
}

func (s *coldGCService) GetColdReferences(ctx context.Context, req *coldgcv1.GetColdReferencesRequest) (*coldgcv1.GetColdReferencesResponse, error) {
	keys, live, err := s.eng.ColdReferences(ctx, req.GetPrefix())
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	return &coldgcv1.GetColdReferencesResponse{Live: live, Keys: keys}, nil
}

// ColdGCClient returns a ColdGCServiceClient that calls this node
// in-process (the all-in-one target's cold-GC worker).
func (s *Server) ColdGCClient() coldgcv1.ColdGCServiceClient { return localColdGC{s.coldgc} }

type localColdGC struct{ s *coldGCService }

func (c localColdGC) GetGCQueue(ctx context.Context, in *coldgcv1.GetGCQueueRequest, _ ...grpc.CallOption) (*coldgcv1.GetGCQueueResponse, error) {
	return c.s.GetGCQueue(ctx, in)
}

func (c localColdGC) AckGC(ctx context.Context, in *coldgcv1.AckGCRequest, _ ...grpc.CallOption) (*coldgcv1.AckGCResponse, error) {
	return c.s.AckGC(ctx, in)
}

func (c localColdGC) ListCompactions(ctx context.Context, in *coldgcv1.ListCompactionsRequest, _ ...grpc.CallOption) (*coldgcv1.ListCompactionsResponse, error) {
	return c.s.ListCompactions(ctx, in)
}

func (c localColdGC) CommitCompaction(ctx context.Context, in *coldgcv1.CommitCompactionRequest, _ ...grpc.CallOption) (*coldgcv1.CommitCompactionResponse, error) {
	return c.s.CommitCompaction(ctx, in)
}

func (c localColdGC) ListLivePrefixes(ctx context.Context, in *coldgcv1.ListLivePrefixesRequest, _ ...grpc.CallOption) (*coldgcv1.ListLivePrefixesResponse, error) {
	return c.s.ListLivePrefixes(ctx, in)
}

func (c localColdGC) GetColdReferences(ctx context.Context, in *coldgcv1.GetColdReferencesRequest, _ ...grpc.CallOption) (*coldgcv1.GetColdReferencesResponse, error) {
	return c.s.GetColdReferences(ctx, in)
}
