package ursulactl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"google.golang.org/grpc"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// BackupDigestHeader carries the BLAKE3 digest of a group object on an
// import (and an export's answer).
const BackupDigestHeader = "x-ursula-backup-blake3"

// adminBackupClient is one node's BackupService over its admin plane's
// REST surface (/__ursula/backup/...), so that the backup library drives
// ursulactl's operations with the same code as ursula-backup's gRPC calls.
// Errors come back as the gRPC statuses the client plane would answer,
// ErrorInfo reason and metadata (leader_id) included.
type adminBackupClient struct {
	p *Pinned
	// proof, when set, is the restore plan's proof, sent with every
	// request for the nodes' audit trails.
	proof string
}

var _ backupv1.BackupServiceClient = (*adminBackupClient)(nil)

func (a *adminBackupClient) GetBackupInfo(ctx context.Context, _ *backupv1.GetBackupInfoRequest, _ ...grpc.CallOption) (*backupv1.BackupInfo, error) {
	var out struct {
		FormatVersion uint32 `json:"format_version"`
		ClusterID     string `json:"cluster_id"`
		GroupCount    uint32 `json:"group_count"`
		NodeID        uint64 `json:"node_id"`
		ColdStore     string `json:"cold_store"`
		ColdEndpoint  string `json:"cold_endpoint"`
		MaxImport     uint64 `json:"max_import_bytes"`
	}
	if err := a.call(ctx, http.MethodGet, "/__ursula/backup/info", nil, nil, &out); err != nil {
		return nil, err
	}
	return &backupv1.BackupInfo{FormatVersion: out.FormatVersion, ClusterId: out.ClusterID, GroupCount: out.GroupCount,
		NodeId: out.NodeID, ColdStore: out.ColdStore, ColdEndpoint: out.ColdEndpoint, MaxImportBytes: out.MaxImport}, nil
}

func (a *adminBackupClient) HoldColdGC(ctx context.Context, in *backupv1.HoldColdGCRequest, _ ...grpc.CallOption) (*backupv1.HoldColdGCResponse, error) {
	q := url.Values{"holder": {in.GetHolder()}, "ttl_ms": {strconv.FormatInt(in.GetTtlMs(), 10)}}
	var out struct {
		Index uint64 `json:"index"`
	}
	if err := a.call(ctx, http.MethodPost, fmt.Sprintf("/__ursula/backup/group/%d/hold?%s", in.GetGroup(), q.Encode()), nil, nil, &out); err != nil {
		return nil, err
	}
	return &backupv1.HoldColdGCResponse{Index: out.Index}, nil
}

func (a *adminBackupClient) ExportGroup(ctx context.Context, in *backupv1.ExportGroupRequest, _ ...grpc.CallOption) (*backupv1.ExportGroupResponse, error) {
	path := fmt.Sprintf("/__ursula/backup/group/%d/export?min_applied_index=%d", in.GetGroup(), in.GetMinAppliedIndex())
	body, h, err := a.p.doRaw(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return nil, toStatus(err)
	}
	num := func(k string) uint64 {
		v, _ := strconv.ParseUint(h.Get(k), 10, 64)
		return v
	}
	return &backupv1.ExportGroupResponse{Object: body, Blake3: h.Get(BackupDigestHeader),
		CommitIndex: num("x-ursula-commit-index"), AppliedIndex: num("x-ursula-applied-index"), NodeId: num("x-ursula-node-id")}, nil
}

func (a *adminBackupClient) ColdCheck(ctx context.Context, in *backupv1.ColdCheckRequest, _ ...grpc.CallOption) (*backupv1.ColdCheckResponse, error) {
	var out struct {
		Checked      uint64   `json:"checked"`
		Missing      uint64   `json:"missing"`
		FirstMissing []string `json:"first_missing"`
		Refusal      string   `json:"import_refusal"`
		Imported     bool     `json:"imported"`
	}
	if err := a.call(ctx, http.MethodPost, fmt.Sprintf("/__ursula/backup/group/%d/cold-check", in.GetGroup()), nil, in.GetObject(), &out); err != nil {
		return nil, err
	}
	return &backupv1.ColdCheckResponse{Checked: out.Checked, Missing: out.Missing, FirstMissing: out.FirstMissing,
		ImportRefusal: out.Refusal, Imported: out.Imported}, nil
}

func (a *adminBackupClient) ImportGroup(ctx context.Context, in *backupv1.ImportGroupRequest, _ ...grpc.CallOption) (*backupv1.ImportGroupResponse, error) {
	h := http.Header{}
	h.Set(BackupDigestHeader, in.GetBlake3())
	var out struct {
		Already bool   `json:"already"`
		Index   uint64 `json:"index"`
		Streams uint64 `json:"streams"`
	}
	if err := a.call(ctx, http.MethodPost, fmt.Sprintf("/__ursula/backup/group/%d/import", in.GetGroup()), h, in.GetObject(), &out); err != nil {
		return nil, err
	}
	return &backupv1.ImportGroupResponse{Already: out.Already, Index: out.Index, Streams: out.Streams}, nil
}

// call sends one request (body: raw bytes, nil for none) and decodes its
// JSON answer into out.
func (a *adminBackupClient) call(ctx context.Context, method, path string, h http.Header, body []byte, out any) error {
	if a.proof != "" {
		if h == nil {
			h = http.Header{}
		}
		h.Set(ProofHeader, a.proof)
	}
	resp, _, err := a.p.doRaw(ctx, method, path, h, body)
	if err != nil {
		return toStatus(err)
	}
	if err := json.Unmarshal(resp, out); err != nil {
		return fmt.Errorf("%s %s: decode the answer: %w", method, path, err)
	}
	return nil
}

// toStatus turns a node's error answer into the gRPC status its client
// plane would have answered; a safety abort (412, 428) and a transport
// error stay as they are.
func toStatus(err error) error {
	se, ok := err.(*StatusError)
	if !ok {
		return err
	}
	code, known := errcode.Parse(se.Code)
	if !known {
		switch {
		case se.Status == http.StatusServiceUnavailable:
			code = errcode.Unavailable
		case se.Status >= 400 && se.Status < 500:
			code = errcode.InvalidArgument
		default:
			code = errcode.Internal
		}
	}
	msg := se.Message
	if msg == "" {
		msg = se.Error()
	}
	de := errcode.New(code, "%s", msg)
	if se.LeaderID != 0 {
		de = de.With(errcode.KeyLeaderID, strconv.FormatUint(se.LeaderID, 10))
	}
	return grpcerr.ToStatus(de)
}

// doRaw sends one admin request with a raw body (octet-stream) and returns
// the 2xx answer's body and headers; errors as Do.
func (p *Pinned) doRaw(ctx context.Context, method, pathAndQuery string, h http.Header, body []byte) ([]byte, http.Header, error) {
	if h == nil {
		h = http.Header{}
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
		h.Set("Content-Type", "application/octet-stream")
	}
	return p.send(ctx, method, pathAndQuery, h, rd)
}
