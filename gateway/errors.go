package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// toDomain converts an error from the node (a gRPC status) or from the
// gateway itself into a domain error. A client never sees NOT_LEADER: the
// gateway routes writes and tail reads itself, so a node that does not
// lead the group means, to its client, that the group's leader is out of
// reach for now (503 with Retry-After).
func toDomain(err error) *errcode.Error {
	de := domainOf(err)
	if de.Code == errcode.NotLeader {
		out := errcode.New(errcode.Unavailable, "no reachable leader for the stream's group: %s", de.Message)
		if ms := de.Metadata[errcode.KeyRetryAfterMS]; ms != "" {
			out.With(errcode.KeyRetryAfterMS, ms)
		}
		return out
	}
	return de
}

func domainOf(err error) *errcode.Error {
	var de *errcode.Error
	if errors.As(err, &de) {
		return de
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errcode.New(errcode.PayloadTooLarge, "request body exceeds %d bytes", mbe.Limit)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return errcode.New(errcode.Unavailable, "request ended: %v", err)
	}
	return grpcerr.FromStatus(err)
}

// errorBody is the JSON error document.
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// writeError writes err as a JSON error response with the protocol headers
// its metadata maps to.
func writeError(w http.ResponseWriter, err error) {
	de := toDomain(err)
	writeDomainError(w, de)
}

func writeDomainError(w http.ResponseWriter, de *errcode.Error) {
	h := w.Header()
	status := errcode.HTTPStatus(de.Code)
	md := de.Metadata
	if v := md[errcode.KeyNextOffset]; v != "" {
		h.Set(hStreamNextOffset, v)
	}
	if de.Code == errcode.StreamClosed || md[errcode.KeyClosed] == "true" {
		h.Set(hStreamClosed, "true")
	}
	if v := md[errcode.KeyProducerEpoch]; v != "" {
		h.Set(hProducerEpoch, v)
	}
	if v := md[errcode.KeyProducerSeq]; v != "" && de.Code != errcode.ProducerSeqGap {
		h.Set(hProducerSeq, v)
	}
	if v := md[errcode.KeyProducerOutcome]; v != "" {
		h.Set(hProducerOutcome, v)
	}
	if v := md[errcode.KeyRecordNext]; v != "" {
		h.Set(hStreamRecordNext, v)
	}
	if v := md[errcode.KeyExpectedSeq]; v != "" {
		h.Set(hProducerExpectedSeq, v)
	}
	if v := md[errcode.KeyReceivedSeq]; v != "" {
		h.Set(hProducerReceivedSeq, v)
	}
	if v := md[errcode.KeyIncarnation]; v != "" && de.Code == errcode.IncarnationMismatch {
		h.Set(hStreamIncarnation, v)
	}
	switch de.Code {
	case errcode.Unavailable, errcode.Overloaded, errcode.OutcomeUnknown:
		secs := int64(1)
		if ms, err := strconv.ParseInt(md[errcode.KeyRetryAfterMS], 10, 64); err == nil && ms > 0 {
			secs = (ms + 999) / 1000
		}
		h.Set(hRetryAfter, strconv.FormatInt(secs, 10))
	}
	body, _ := json.Marshal(errorBody{Code: errcode.Reason(de.Code), Message: de.Message})
	body = append(body, '\n')
	h.Set(hContentType, "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set(hCacheControl, "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// badRequest writes a 400 INVALID_ARGUMENT with err's message.
func badRequest(w http.ResponseWriter, err error) {
	writeDomainError(w, &errcode.Error{Code: errcode.InvalidArgument, Message: err.Error()})
}

// connRefusal is the whole answer to a connection accepted beyond
// Config.MaxConnections: written before its request is read, in the same
// form as every other 503 OVERLOADED, and the connection is closed.
func connRefusal(max int) []byte {
	body, _ := json.Marshal(errorBody{
		Code:    errcode.Reason(errcode.Overloaded),
		Message: "the gateway holds its most connections at once (" + strconv.Itoa(max) + ", gateway.max_connections); retry later",
	})
	body = append(body, '\n')
	head := "HTTP/1.1 503 Service Unavailable\r\n" +
		hContentType + ": application/json\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n" +
		hRetryAfter + ": 1\r\n" +
		hCacheControl + ": no-store\r\n" +
		"X-Content-Type-Options: nosniff\r\n" +
		"Cross-Origin-Resource-Policy: cross-origin\r\n" +
		"Access-Control-Allow-Origin: *\r\n" +
		"Access-Control-Expose-Headers: " + exposeHeaders + "\r\n" +
		"Connection: close\r\n\r\n"
	return append([]byte(head), body...)
}
