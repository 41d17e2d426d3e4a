// Command grid is the single binary of Grid: the site operator, the site
// gateway, a simulated backend, certificate tooling and a demo. This file only
// parses flags and wires packages together.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/grid-inference/grid/internal/buildinfo"
	"github.com/grid-inference/grid/internal/logging"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, env *env) error
}

// env is what every subcommand gets from main.
type env struct {
	stdout, stderr io.Writer
	log            *slog.Logger
}

var commands = map[string]command{
	"operator": {"run the site operator: scrape backends, publish and poll load signals", runOperator},
	"gateway":  {"run the site gateway: an OpenAI-compatible proxy that routes to the least-loaded site", runGateway},
	"demo":     {"run a whole grid on loopback with a load generator and a live view", runDemo},
	"sim":      {"run a simulated inference backend (llm-d EPP, vLLM or SGLang)", runSim},
	"certs":    {"create a grid CA, SPIFFE site certificates and a gossip key (init, issue, gossip-key)", runCerts},
	"bench":    {"measure routing policies under stale load readings (bench routing)", runBench},
	"status":   {"show what an operator or gateway currently believes about the sites", runStatus},
	"version":  {"print the version and build information", runVersion},
}

// errUsage marks a command-line mistake: exit status 2.
var errUsage = errors.New("usage")

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	global := flag.NewFlagSet("grid", flag.ContinueOnError)
	global.SetOutput(stderr)
	logLevel := global.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := global.String("log-format", "text", "log format: text or json")
	version := global.Bool("version", false, "print the version and build information, and exit")
	global.Usage = func() { usage(stderr, global) }
	if helpAsked(args) {
		global.Usage = func() { usage(stdout, global) } // asked for: on stdout
	}
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *version {
		fmt.Fprintln(stdout, buildinfo.String())
		return 0
	}
	if global.NArg() == 0 {
		usage(stderr, global)
		return 2
	}
	name, rest := global.Arg(0), global.Args()[1:]
	if name == "help" {
		usage(stdout, global)
		return 0
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "grid: unknown command %q\n\n", name)
		usage(stderr, global)
		return 2
	}
	log, err := logging.New(stderr, *logLevel, *logFormat)
	if err != nil {
		fmt.Fprintf(stderr, "grid: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = cmd.run(ctx, rest, &env{stdout: stdout, stderr: stderr, log: log})
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "grid %s: %v\n", name, err)
		return 2
	default:
		fmt.Fprintf(stderr, "grid %s: %v\n", name, err)
		return 1
	}
}

func usage(w io.Writer, global *flag.FlagSet) {
	fmt.Fprintf(w, "Grid routes LLM inference requests to the least-loaded healthy site that serves the model.\n\n")
	fmt.Fprintf(w, "Usage: grid [--log-level LEVEL] [--log-format text|json] <command> [flags]\n\nCommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun 'grid <command> --help' for a command's flags.\n\nGlobal flags:\n")
	global.SetOutput(w)
	global.PrintDefaults()
}

func runVersion(_ context.Context, _ []string, e *env) error {
	fmt.Fprintln(e.stdout, buildinfo.String())
	return nil
}

// newFlagSet returns a flag set whose parse errors are usage errors.
func newFlagSet(name string, e *env) *flag.FlagSet {
	fs := flag.NewFlagSet("grid "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return fs
}

func parseFlags(e *env, fs *flag.FlagSet, args []string) error {
	if helpAsked(args) {
		fs.SetOutput(e.stdout) // asked for: help is the answer, on stdout
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	return nil
}

// helpAsked reports whether args ask for help (-h, -help, --help) among
// the flags, before any positional argument or "--".
func helpAsked(args []string) bool {
	for _, a := range args {
		switch {
		case a == "-h" || a == "-help" || a == "--help" || a == "--h":
			return true
		case a == "--" || !strings.HasPrefix(a, "-"):
			return false
		}
	}
	return false
}
