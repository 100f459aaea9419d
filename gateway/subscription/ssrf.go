package subscription

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
)

// errAddressBlocked is returned by the webhook dialer for a forbidden address.
var errAddressBlocked = errors.New("subscription: webhook address blocked")

// blockedPrefixes are ranges never dialled for a webhook unless private
// webhooks are allowed: RFC 1918, unique-local, link-local (which includes
// the 169.254.169.254 metadata address), carrier-grade NAT and "this network".
var blockedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
}

// metadataHosts are cloud metadata host names refused regardless of what
// they resolve to.
var metadataHosts = map[string]bool{
	"metadata":                 true,
	"metadata.google.internal": true,
	"metadata.goog":            true,
	"instance-data":            true,
}

// isLocalDevHost reports whether host (no port) is loopback by name or literal.
func isLocalDevHost(host string) bool {
	host = strings.ToLower(host)
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// checkAddr reports why addr must not be dialled, or nil.
func checkAddr(a netip.Addr, allowLoopback, allowPrivate bool) error {
	a = a.Unmap()
	switch {
	case a.IsLoopback():
		if allowLoopback {
			return nil
		}
		return fmt.Errorf("%w: loopback %s", errAddressBlocked, a)
	case a.IsUnspecified(), a.IsMulticast(), a.IsInterfaceLocalMulticast():
		return fmt.Errorf("%w: %s", errAddressBlocked, a)
	case allowPrivate:
		return nil
	case a.IsPrivate(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return fmt.Errorf("%w: private or link-local %s", errAddressBlocked, a)
	}
	for _, p := range blockedPrefixes {
		if p.Contains(a) {
			return fmt.Errorf("%w: reserved range %s", errAddressBlocked, a)
		}
	}
	return nil
}

// validateWebhookURL checks a webhook URL at subscription time. It returns
// a human-readable reason when the URL is rejected.
func validateWebhookURL(raw string, allowPrivate bool) error {
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return errors.New("webhook.url must be an absolute http(s) URL")
	}
	if u.User != nil {
		return errors.New("webhook.url must not carry credentials")
	}
	host := strings.ToLower(u.Hostname())
	switch u.Scheme {
	case "http":
		if !isLocalDevHost(host) && !allowPrivate {
			return errors.New("http webhook URLs are only allowed for localhost or 127.0.0.0/8; use https")
		}
	case "https":
	default:
		return errors.New("webhook.url must use https")
	}
	if isLocalDevHost(host) {
		return nil
	}
	if metadataHosts[strings.TrimSuffix(host, ".")] {
		return errors.New("webhook.url must not target a metadata service")
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if err := checkAddr(a, false, allowPrivate); err != nil {
			return fmt.Errorf("webhook.url must not target private, link-local or metadata addresses (%s)", a)
		}
	}
	return nil
}

// webhookDialer resolves and dials webhook hosts, refusing blocked
// addresses after resolution so a public name cannot point at an internal
// address. Loopback is dialled only when the URL named it explicitly.
type webhookDialer struct {
	dialer       net.Dialer
	resolver     *net.Resolver
	allowPrivate bool
}

func (d *webhookDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial webhook %s: %w", addr, err)
	}
	allowLoopback := isLocalDevHost(host)
	if metadataHosts[strings.TrimSuffix(strings.ToLower(host), ".")] {
		return nil, fmt.Errorf("dial webhook %s: %w: metadata host", addr, errAddressBlocked)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		addrs, err = d.resolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, fmt.Errorf("resolve webhook host %s: %w", host, err)
		}
	}
	var errs []error
	for _, a := range addrs {
		if err := checkAddr(a, allowLoopback, d.allowPrivate); err != nil {
			errs = append(errs, err)
			continue
		}
		conn, err := d.dialer.DialContext(ctx, network, net.JoinHostPort(a.Unmap().String(), port))
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("dial webhook %s: no addresses", addr)
	}
	return nil, fmt.Errorf("dial webhook %s: %w", addr, errors.Join(errs...))
}
