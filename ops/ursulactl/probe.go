package ursulactl

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// probeCommand asks one HTTP endpoint whether it is ready: the container
// image has no shell or curl, so a healthcheck execs this. It needs no
// manifest.
func probeCommand(a *app) *cobra.Command {
	var caFile string
	cmd := &cobra.Command{
		Use:   "probe URL",
		Short: "GET URL once (e.g. http://127.0.0.1:4437/__ursula/ready) and succeed on a 2xx answer: a healthcheck for containers",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, err := probeClient(args[0], caFile)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), a.o.timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
			if err != nil {
				return fmt.Errorf("probe %s: %w", args[0], err)
			}
			resp, err := client.Do(req)
			if err != nil {
				return fmt.Errorf("probe: %w", err)
			}
			defer resp.Body.Close()
			// The first line of the answer says why (a readiness
			// document names its reason).
			line, _ := bufio.NewReader(http.MaxBytesReader(nil, resp.Body, 4096)).ReadString('\n')
			line = strings.TrimSpace(line)
			if resp.StatusCode/100 != 2 {
				return fmt.Errorf("probe %s: %s: %s", args[0], resp.Status, line)
			}
			if a.o.json {
				return a.emit(map[string]any{"url": args[0], "status": resp.StatusCode, "line": line})
			}
			fmt.Fprintf(a.env.Stdout, "%s: %s\n", resp.Status, line)
			return nil
		},
	}
	cmd.Flags().StringVar(&caFile, "ca-file", "", "PEM bundle of the CA of an https URL's server (default: the system's roots)")
	return cmd
}

// probeClient is an HTTP client for one probe of raw: no redirects, TLS
// against caFile's roots when set.
func probeClient(raw, caFile string) (*http.Client, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("probe: %q: want http(s)://host:port/path", raw)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("probe: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("probe: %s holds no PEM certificate", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return errors.New("a probe follows no redirect")
		},
	}, nil
}
