package main

import (
	"bytes"
	"strings"
	"testing"
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
