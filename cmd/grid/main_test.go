package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/grid-inference/grid/internal/identity"
)

func TestHelpListsEveryCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"--help"}, &out, &errOut); code != 0 {
		t.Fatalf("--help exited %d", code)
	}
	for name := range commands {
		if !strings.Contains(errOut.String(), "\n  "+name+" ") {
			t.Errorf("help does not list %q:\n%s", name, errOut.String())
		}
	}
}

func TestExitCodes(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "Commands:"},
		{[]string{"bogus"}, 2, `unknown command "bogus"`},
		{[]string{"--log-level", "loud", "version"}, 2, "log level"},
		{[]string{"demo", "--sites", "9"}, 1, "--sites must be between 1 and 3"},
		{[]string{"sim", "--kind", "triton"}, 2, `sim kind "triton"`},
		{[]string{"sim", "--no-such-flag"}, 2, "no-such-flag"},
		{[]string{"operator", "--config", "/nonexistent.yaml"}, 1, "read config"},
		{[]string{"operator", "--kubernetes", "--namespace", ""}, 2, "--kubernetes needs --namespace"},
		{[]string{"version"}, 0, ""},
		{[]string{"bench"}, 2, "grid bench routing"},
		{[]string{"demo", "--rate", "-5"}, 2, "--rate must be"},
		{[]string{"demo", "--duration", "-5s"}, 2, "--duration must not be negative"},
	}
	// Help and version go to stdout with exit 0, for every command and
	// command group.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--version"}, "grid "},
		{[]string{"certs", "--help"}, "gossip-key"},
		{[]string{"bench", "--help"}, "routing"},
		{[]string{"help"}, "gossip-key"},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != 0 || !strings.Contains(out.String(), tc.want) {
			t.Errorf("grid %v: exit %d, stdout %q; want exit 0 containing %q", tc.args, code, out.String(), tc.want)
		}
	}
	for _, tc := range tests {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut)
		if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("grid %v: exit %d, stderr %q; want exit %d containing %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
}

// TestCheckConfigLoadsCertificates: --check-config loads the certificate
// material as a start would: a missing certificate, a garbage one, and one
// paired with another site's key are each refused with the file named; a
// whole set passes and says when it expires. Relative paths are read
// against the configuration file's directory.
func TestCheckConfigLoadsCertificates(t *testing.T) {
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	if err := identity.Init(certs, "grid.internal", time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"east", "west"} {
		if err := identity.Issue(certs, s, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(certs, "garbage.crt"), []byte("not a certificate"), 0o600)
	write := func(cert, key string) string {
		path := filepath.Join(dir, "east-gateway.yaml")
		os.WriteFile(path, []byte(fmt.Sprintf("site: east\ntls: {ca: certs/ca.crt, cert: certs/%s, key: certs/%s}\noperator: {signals: \"https://127.0.0.1:9091\"}\n", cert, key)), 0o600)
		return path
	}
	for _, tc := range []struct {
		cert, key, want string
		code            int
	}{
		{"east.crt", "east.key", "certificate valid until", 0},
		{"missing.crt", "east.key", "missing.crt", 1},
		{"garbage.crt", "east.key", "garbage.crt", 1},
		{"east.crt", "west.key", "east.crt", 1},
		{"west.crt", "west.key", "west", 1},
	} {
		var out, errOut bytes.Buffer
		code := run([]string{"gateway", "--config", write(tc.cert, tc.key), "--check-config"}, &out, &errOut)
		if code != tc.code || !strings.Contains(out.String()+errOut.String(), tc.want) {
			t.Errorf("cert %s key %s: exit %d, %q %q; want exit %d naming %q", tc.cert, tc.key, code, out.String(), errOut.String(), tc.code, tc.want)
		}
	}
}
