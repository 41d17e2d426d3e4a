package peeraddr

import (
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want string // "" accepts; otherwise a fragment of the error
	}{
		{"https://10.0.0.7:9091", ""},
		{"https://east.grid.example:9091", ""},
		{"https://EAST.Grid.Example.:9091", ""},
		{"https://[2001:db8::7]:9091", ""},
		{"https://203.0.113.9:9091/", ""},
		{"http://10.0.0.7:9091", "scheme"},
		{"https://10.0.0.7", "host:port"},
		{"https://10.0.0.7:0", "port"},
		{"https://10.0.0.7:65536", "port"},
		{"https://10.0.0.7:9091/v1/site/signals", "only scheme"},
		{"https://10.0.0.7:9091?target=x", "only scheme"},
		{"https://u:p@10.0.0.7:9091", "only scheme"},
		{"https://127.0.0.1:9091", "loopback"},
		{"https://127.9.9.9:9091", "loopback"},
		{"https://[::1]:9091", "loopback"},
		{"https://[::ffff:127.0.0.1]:9091", "loopback"},
		{"https://169.254.169.254:80", "link-local"},
		{"https://[fe80::1%25eth0]:9091", "zone"},
		{"https://[fe80::1]:9091", "link-local"},
		{"https://0.0.0.0:9091", "unspecified"},
		{"https://[::]:9091", "unspecified"},
		{"https://239.1.1.1:9091", "multicast"},
		{"https://100.100.100.200:80", "metadata"},
		{"https://[fd00:ec2::254]:80", "metadata"},
		{"https://localhost:9091", "blocked"},
		{"https://api.localhost:9091", "blocked"},
		{"https://metadata.google.internal:80", "blocked"},
		{"https://-east.example:9091", "DNS label"},
		{"https://east_1.example:9091", "DNS label"},
		{"https://" + strings.Repeat("a", 64) + ".example:9091", "DNS label"},
		{"https://" + strings.Repeat("abcdefghi.", 26) + "com:9091", "length"},
		{"https://10.0.0.300:9091", "all digits"},
		{"https://east..example:9091", "DNS label"},
	} {
		err := Check(tc.url)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.url, err)
		case tc.want != "" && err == nil:
			t.Errorf("%s: accepted, want refusal (%s)", tc.url, tc.want)
		case tc.want != "" && !strings.Contains(err.Error(), tc.want):
			t.Errorf("%s: %v, want it to say %q", tc.url, err, tc.want)
		}
	}
}

func FuzzCheck(f *testing.F) {
	for _, s := range []string{"https://10.0.0.7:9091", "https://[::1]:1", "https://a.b:9", "https://%zz"} {
		f.Add(s)
	}
	f.Add("htTps://A:1") // schemes are case-insensitive: this is https
	f.Fuzz(func(t *testing.T, s string) {
		if Check(s) != nil {
			return
		}
		// Whatever is accepted is https to a host:port and nothing else,
		// and never a loopback or unspecified literal.
		u, err := url.Parse(s)
		if err != nil || u.Scheme != "https" || u.Port() == "" || u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil {
			t.Fatalf("%q accepted: %+v, %v", s, u, err)
		}
		if a, err := netip.ParseAddr(u.Hostname()); err == nil && (a.Unmap().IsLoopback() || a.IsUnspecified()) {
			t.Fatalf("%q accepted: %s", s, a)
		}
	})
}
