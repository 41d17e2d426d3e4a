// Package peeraddr holds the rules for an address a peer advertises about
// itself (docs/protocol.md §4.7 step 2): what may be dialled on a peer's say-so.
package peeraddr

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// blockedHosts are names that resolve to this machine or to a cloud
// metadata service: a member advertising one would turn the operator's
// poller against its own host or its credentials.
var blockedHosts = map[string]bool{
	"localhost":                true,
	"localhost.localdomain":    true,
	"ip6-localhost":            true,
	"ip6-loopback":             true,
	"metadata":                 true,
	"metadata.google.internal": true,
	"instance-data":            true,
}

// blockedAddrs are metadata services that are neither loopback nor
// link-local: Alibaba's and AWS's IPv6 one (docs/protocol.md §4.7 step 2).
var blockedAddrs = []netip.Addr{
	netip.MustParseAddr("100.100.100.200"),
	netip.MustParseAddr("fd00:ec2::254"),
}

// Check reports why an advertised https URL must not be dialled, or
// nil: it must be https with an authority that is an IP address or a DNS
// name and a port in 1..65535, nothing else (no user, path, query or
// fragment), and not loopback, link-local, unspecified, multicast, a cloud
// metadata address or a blocked host name. Gossip proves membership only:
// an address is a claim, and this keeps the claim from aiming the poller at
// the operator's own host. Names are not resolved here: the TLS check of
// every poll is what binds a name to the site.
func Check(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q: %w", raw, err)
	}
	if u.Scheme != "https" {
		return fmt.Errorf("%q: scheme must be https", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") || u.Opaque != "" {
		return fmt.Errorf("%q: only scheme, host and port are allowed", raw)
	}
	host, portText, err := net.SplitHostPort(u.Host)
	if err != nil {
		return fmt.Errorf("%q: want host:port: %w", raw, err)
	}
	if port, err := strconv.Atoi(portText); err != nil || port < 1 || port > 65535 {
		return fmt.Errorf("%q: port %q is not in 1..65535", raw, portText)
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		return checkAddr(raw, addr.Unmap())
	}
	return checkHostname(raw, host)
}

func checkAddr(raw string, a netip.Addr) error {
	switch {
	case a.Zone() != "":
		return fmt.Errorf("%q: an address with a zone is link-local", raw)
	case a.IsLoopback():
		return fmt.Errorf("%q: loopback address", raw)
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast():
		return fmt.Errorf("%q: link-local address (cloud metadata lives there)", raw)
	case a.IsUnspecified():
		return fmt.Errorf("%q: unspecified address", raw)
	case a.IsMulticast():
		return fmt.Errorf("%q: multicast address", raw)
	}
	for _, b := range blockedAddrs {
		if a == b {
			return fmt.Errorf("%q: cloud metadata address", raw)
		}
	}
	return nil
}

// checkHostname applies the DNS rules of docs/protocol.md §4.7: labels of 1–63
// characters of [A-Za-z0-9-], not starting or ending with '-', at most 253
// in all, the last label not all digits (that would be a mangled IP).
func checkHostname(raw, host string) error {
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if len(name) == 0 || len(name) > 253 {
		return fmt.Errorf("%q: host name length %d not in 1..253", raw, len(name))
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("%q: %q is not a DNS label", raw, l)
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("%q: %q is not a DNS label", raw, l)
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return fmt.Errorf("%q: the last label is all digits", raw)
	}
	if blockedHosts[name] || strings.HasSuffix(name, ".localhost") {
		return fmt.Errorf("%q: blocked host name", raw)
	}
	return nil
}
