package ursulactl

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Exit codes of the ursulactl command.
const (
	// ExitOK: the operation is done.
	ExitOK = 0
	// ExitError: any other failure (unreachable node, timeout, a check
	// that found problems, a refused request, bad arguments).
	ExitError = 1
	// ExitAborted: a safety check stopped the operation: a node answered
	// 412 (it restarted since its incarnation was pinned) or 428, a target
	// was not eligible, or a precondition did not hold (another node
	// unready, a group that would lose its quorum).
	ExitAborted = 2
)

// ErrAborted is matched (errors.Is) by every error of an operation that a
// safety check stopped; ExitCode maps it to ExitAborted.
var ErrAborted = errors.New("ursulactl: aborted by a safety check")

// abortError is a safety abort; it may wrap the answer that caused it.
type abortError struct {
	msg   string
	cause error
}

func (e *abortError) Error() string        { return "aborted: " + e.msg }
func (e *abortError) Unwrap() error        { return e.cause }
func (e *abortError) Is(target error) bool { return target == ErrAborted }

// abortf returns a safety abort.
func abortf(format string, args ...any) error {
	return &abortError{msg: fmt.Sprintf(format, args...)}
}

// ExitCode maps an operation's error to the command's exit status.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	}
	var ce *codedError
	switch {
	case errors.As(err, &ce):
		return ce.code
	case errors.Is(err, ErrAborted):
		return ExitAborted
	default:
		return ExitError
	}
}

// StatusError is an answer of a node other than the one expected.
type StatusError struct {
	Method string
	URL    string
	Status int
	// Code and Message are the JSON error body's, when it has them.
	Code    string
	Message string
	// LeaderID is the body's leader_id (409 NOT_LEADER), 0 without one.
	LeaderID uint64
	// RetryAfter is the Retry-After header (seconds); HasRetryAfter says
	// whether the answer had one.
	RetryAfter    time.Duration
	HasRetryAfter bool
	// Body is the raw body when it is not a JSON error.
	Body string
}

func (e *StatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d %s", e.Method, e.URL, e.Status, http.StatusText(e.Status))
	if e.Code != "" {
		fmt.Fprintf(&b, ": %s", e.Code)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	if e.LeaderID != 0 {
		fmt.Fprintf(&b, " (leader_id %d)", e.LeaderID)
	}
	if e.Code == "" && e.Message == "" && e.Body != "" {
		fmt.Fprintf(&b, ": %s", e.Body)
	}
	return b.String()
}

// oneLine flattens an error message to one line for stderr.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	s = strings.ReplaceAll(s, "\r\n", "; ")
	return strings.ReplaceAll(s, "\n", "; ")
}
