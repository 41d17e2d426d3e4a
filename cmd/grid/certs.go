package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/grid-inference/grid/internal/identity"
	"github.com/grid-inference/grid/internal/membership"
)

func runCerts(_ context.Context, args []string, e *env) error {
	const subcommands = "Usage: grid certs <subcommand> [flags]\n\nSubcommands:\n" +
		"  init        create a grid CA (ca.crt, ca.key)\n" +
		"  issue       issue a site certificate: spiffe://<trust-domain>/site/<name>\n" +
		"  gossip-key  write a random key for the membership gossip\n\n" +
		"Run 'grid certs <subcommand> --help' for its flags.\n"
	if len(args) == 0 {
		return fmt.Errorf("%w: want `grid certs init`, `grid certs issue` or `grid certs gossip-key`", errUsage)
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		fmt.Fprint(e.stdout, subcommands)
		return nil
	case "init":
		fs := newFlagSet("certs init", e)
		dir := fs.String("dir", "certs", "directory for ca.crt and ca.key")
		td := fs.String("trust-domain", "grid.internal", "SPIFFE trust domain of the grid")
		if err := parseFlags(e, fs, args[1:]); err != nil {
			return err
		}
		if err := identity.Init(*dir, *td, time.Now()); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "wrote %s/ca.crt and %s/ca.key (trust domain %s)\n", *dir, *dir, *td)
		return nil
	case "issue":
		fs := newFlagSet("certs issue", e)
		dir := fs.String("dir", "certs", "directory holding the CA; NAME.crt and NAME.key are written here")
		site := fs.String("site", "", "site name (a DNS-1123 label)")
		var dns stringList
		fs.Var(&dns, "dns", "extra DNS SAN (repeatable), e.g. the in-cluster Service name")
		if err := parseFlags(e, fs, args[1:]); err != nil {
			return err
		}
		if *site == "" {
			return fmt.Errorf("%w: --site is required", errUsage)
		}
		if err := identity.Issue(*dir, *site, dns, time.Now()); err != nil {
			return err
		}
		crt, key := identity.SiteFiles(*dir, *site)
		fmt.Fprintf(e.stdout, "wrote %s and %s\n", crt, key)
		return nil
	case "gossip-key":
		fs := newFlagSet("certs gossip-key", e)
		dir := fs.String("dir", "certs", "directory gossip.key is written to")
		if err := parseFlags(e, fs, args[1:]); err != nil {
			return err
		}
		file := filepath.Join(*dir, "gossip.key")
		if err := membership.WriteKey(file); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "wrote %s: give every operator of the grid this file (membership.keyFile)\n", file)
		return nil
	default:
		return fmt.Errorf("%w: unknown certs command %q; want init, issue or gossip-key", errUsage, args[0])
	}
}

// stringList is a repeatable string flag.
type stringList []string

var _ flag.Value = (*stringList)(nil)

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
