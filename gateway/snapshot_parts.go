package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// hSnapshotPartDigest answers a staged part's upload with its SHA-256.
const hSnapshotPartDigest = "Stream-Snapshot-Part-Digest"

// maxSnapshotParts bounds a staged snapshot's part numbers (the engine
// enforces the same bound), maxCommitBodyBytes a commit's JSON body.
const (
	maxSnapshotParts   = 10000
	maxCommitBodyBytes = 1 << 20
)

// Staged-part errors.
var (
	ErrBadPartNumber = errors.New("gateway: a snapshot part number is an integer from 1 to 10000 without leading zeros")
	ErrEmptyPart     = errors.New("gateway: a snapshot part holds at least 1 byte (at most the gateway's max_body_bytes)")
	ErrBadCommit     = errors.New("gateway: a snapshot commit is a JSON object {\"parts\": [{\"part\": 1, \"digest\": \"<sha256 hex>\"}, ...]}")
)

// commitBody is the JSON body of POST …/snapshot/{offset}/commit.
type commitBody struct {
	Parts []struct {
		Part   uint32 `json:"part"`
		Digest string `json:"digest"`
	} `json:"parts"`
}

// serveSnapshotParts serves the staged-part routes under
// /{bucket}/{stream}/snapshot/{offset}/: parts/{n} (PUT) and commit (POST).
func (g *Gateway) serveSnapshotParts(w http.ResponseWriter, r *http.Request, t target, arg string) {
	offset, rest, _ := strings.Cut(arg, "/")
	if _, err := ParseOffset(offset); err != nil || offset == "-1" || offset == "now" {
		badRequest(w, ErrBadOffset)
		return
	}
	switch {
	case rest == "commit":
		if r.Method != http.MethodPost {
			methodNotAllowed(w, "POST, OPTIONS")
			return
		}
		g.commitSnapshot(w, r, t, offset)
	case strings.HasPrefix(rest, "parts/") && !strings.Contains(rest[len("parts/"):], "/"):
		if r.Method != http.MethodPut {
			methodNotAllowed(w, "PUT, OPTIONS")
			return
		}
		n, ok := parsePartNumber(rest[len("parts/"):])
		if !ok {
			badRequest(w, ErrBadPartNumber)
			return
		}
		g.putSnapshotPart(w, r, t, offset, n)
	default:
		notFound(w, "no such resource")
	}
}

// parsePartNumber parses a part number: 1 to maxSnapshotParts in decimal
// without sign or leading zeros.
func parsePartNumber(s string) (uint32, bool) {
	if s == "" || s[0] == '0' || len(s) > 5 {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n < 1 || n > maxSnapshotParts {
		return 0, false
	}
	return uint32(n), true
}

// putSnapshotPart serves PUT …/snapshot/{offset}/parts/{n}: 204 with the
// part's digest.
func (g *Gateway) putSnapshotPart(w http.ResponseWriter, r *http.Request, t target, offset string, n uint32) {
	body, err := g.readBody(r, g.cfg.MaxBodyBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	defer body.Release()
	if len(body.Bytes()) == 0 {
		badRequest(w, ErrEmptyPart)
		return
	}
	resp, err := g.client.PutSnapshotPart(r.Context(), &streamv1.PutSnapshotPartRequest{Ref: t.ref, Offset: offset, Part: n, Body: body.Bytes()})
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	w.Header()[hSnapshotPartDigest] = []string{resp.GetDigest()}
	w.WriteHeader(http.StatusNoContent)
}

// commitSnapshot serves POST …/snapshot/{offset}/commit: 204 with the
// snapshot's offset and digest.
func (g *Gateway) commitSnapshot(w http.ResponseWriter, r *http.Request, t target, offset string) {
	ct, _ := headerValue(r.Header, hContentType)
	if err := checkContentType(ct); err != nil {
		badRequest(w, err)
		return
	}
	raw, err := g.readBody(r, maxCommitBodyBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	var body commitBody
	err = json.Unmarshal(raw.Bytes(), &body)
	raw.Release()
	if err != nil || len(body.Parts) == 0 {
		badRequest(w, ErrBadCommit)
		return
	}
	req := &streamv1.CommitSnapshotRequest{Ref: t.ref, Offset: offset}
	for _, p := range body.Parts {
		req.Parts = append(req.Parts, &streamv1.SnapshotPartDigest{Part: p.Part, Digest: p.Digest})
	}
	req.ContentType = ct
	match, _ := headerValue(r.Header, hSnapshotMatch)
	req.Match = strings.TrimSpace(match)
	resp, err := g.client.CommitSnapshot(r.Context(), req)
	if err != nil {
		g.upstreamError(w, r, err)
		return
	}
	publishedSnapshot(w, resp.GetOffset(), resp.GetDigest())
}

// nextSnapshotPart reads part n of the snapshot first described (the one
// at its offset with its digest); another snapshot in its place is an
// error, since the bytes already sent belong to the first.
func (g *Gateway) nextSnapshotPart(r *http.Request, t target, first *streamv1.GetSnapshotResponse, n uint32) ([]byte, error) {
	resp, err := g.client.GetSnapshot(r.Context(), &streamv1.GetSnapshotRequest{Ref: t.ref, Offset: first.GetOffset(), Part: n})
	if err != nil {
		return nil, err
	}
	if resp.GetDigest() != first.GetDigest() || resp.GetParts() != first.GetParts() {
		return nil, errors.New("the snapshot changed while it was read")
	}
	return resp.GetBody(), nil
}
