package node

import (
	"context"

	"google.golang.org/protobuf/types/known/structpb"

	adminv1 "github.com/ursula/ursula/proto/gen/go/ursula/admin/v1"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// adminService serves the admin API; its REST mapping is generated.
type adminService struct {
	adminv1.UnimplementedAdminServiceServer
	srv *Server
}

func (a *adminService) GetMetrics(context.Context, *adminv1.GetMetricsRequest) (*structpb.Struct, error) {
	st, err := structpb.NewStruct(a.srv.metricsSnapshot())
	return st, grpcerr.ToStatus(err)
}

func (a *adminService) GetReady(context.Context, *adminv1.GetReadyRequest) (*adminv1.GetReadyResponse, error) {
	return a.srv.readiness(), nil
}
