package ursulactl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ursula/ursula/internal/buildinfo"
)

// ErrNotConfirmed is matched (errors.Is) by the error of a destructive
// verb that ran without --yes where it cannot ask (stdin not a terminal).
var ErrNotConfirmed = errors.New("ursulactl: not confirmed")

// notConfirmedError matches ErrNotConfirmed.
type notConfirmedError struct{ msg string }

func (e *notConfirmedError) Error() string        { return e.msg }
func (e *notConfirmedError) Is(target error) bool { return target == ErrNotConfirmed }

// Confirmation describes what a destructive verb is about to do.
type Confirmation struct {
	// Verb names the verb in the messages ("purge-bucket").
	Verb string
	// Action says what it will do, for the prompt.
	Action string
	// Token is what the operator types to confirm (the bucket's name);
	// empty means "yes".
	Token string
}

// maxAnswer bounds the line read as an answer to a prompt.
const maxAnswer = 4096

// confirm asks for cf on a terminal. It returns nil with --yes; an error
// matching ErrNotConfirmed (exit 1) when stdin is not a terminal, telling
// to pass --yes; and a safety abort (exit 2) when the operator answers
// anything but the token. It prints the prompt on stderr.
func (a *app) confirm(_ context.Context, cf Confirmation) error {
	if a.o.yes {
		return nil
	}
	if !isTerminal(a.env.StdinTTY, a.env.Stdin) || a.env.Stdin == nil {
		return &notConfirmedError{msg: fmt.Sprintf("%s would %s; refusing without confirmation: stdin is not a terminal, pass --yes to confirm (nothing changed)",
			cf.Verb, cf.Action)}
	}
	token := cf.Token
	if token == "" {
		token = "yes"
	}
	fmt.Fprintf(a.env.Stderr, "%s will %s.\nType %q to confirm: ", cf.Verb, cf.Action, token)
	line, err := readLine(a.env.Stdin)
	if err != nil && line == "" {
		fmt.Fprintln(a.env.Stderr) // end the prompt's line
		return &abortError{msg: fmt.Sprintf("%s: no confirmation (%v); nothing changed", cf.Verb, err), cause: err}
	}
	if strings.TrimSpace(line) != token {
		return abortf("%s: not confirmed (expected %q); nothing changed", cf.Verb, token)
	}
	return nil
}

// readLine reads one line of at most maxAnswer bytes, byte by byte so that
// nothing after it is consumed.
func readLine(r io.Reader) (string, error) {
	var b strings.Builder
	br := bufio.NewReaderSize(io.LimitReader(r, maxAnswer), 16)
	for {
		c, err := br.ReadByte()
		if err != nil {
			return b.String(), err
		}
		if c == '\n' {
			return b.String(), nil
		}
		b.WriteByte(c)
	}
}

// stdinOrEmpty is r, or an empty reader.
func stdinOrEmpty(r io.Reader) io.Reader {
	if r == nil {
		return strings.NewReader("")
	}
	return r
}

// errorDocument is the --json document of a verb that failed before it
// had a result: {"error": {"message", "exit_code", "aborted"}}.
func errorDocument(err error, code int) any {
	type errDoc struct {
		Message  string `json:"message"`
		ExitCode int    `json:"exit_code"`
		// Aborted says that a safety check stopped the verb (exit 2).
		Aborted bool `json:"aborted"`
	}
	return map[string]errDoc{"error": {Message: oneLine(err.Error()), ExitCode: code, Aborted: errors.Is(err, ErrAborted)}}
}

// jsonRequested reports whether args ask for --json before a "--"; Run
// uses it when the flags did not parse.
func jsonRequested(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--json", "--json=true":
			return true
		}
	}
	return false
}

// printVersion prints buildinfo's line for ursulactl, or its Info with
// --json.
func printVersion(a *app) error {
	info := buildinfo.Get()
	if a.o.json {
		return a.emit(info)
	}
	_, err := fmt.Fprintln(a.env.Stdout, info.String("ursulactl"))
	return err
}

func versionCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print ursulactl's version, commit and Go version (also --version)",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return printVersion(a) },
	}
}
