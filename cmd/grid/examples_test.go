package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// shBlock is a README's ```sh block, indented as a list item's or not.
var shBlock = regexp.MustCompile("(?ms)^( *)```sh\n(.*?)^ *```")

// readmeCommands returns the commands of a README's sh blocks, in order,
// one string a block, without the `go build` of the binary (the test has
// built it).
func readmeCommands(t *testing.T, readme string) []string {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range shBlock.FindAllStringSubmatch(string(b), -1) {
		var lines []string
		for _, l := range strings.Split(m[2], "\n") {
			l = strings.TrimPrefix(l, m[1])
			if !strings.HasPrefix(l, "go build ") {
				lines = append(lines, l)
			}
		}
		blocks = append(blocks, strings.Join(lines, "\n"))
	}
	return blocks
}

// TestExamplesRunAsWritten runs each example README's commands as a user
// would paste them, in a copy of the example's directory with the binary
// built beside them: certificates, check, start in the background, a
// request, status, stop. The request is answered by the example's site, and
// the README's stop ends every process it started.
func TestExamplesRunAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("starts each example's processes")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("GRID_REQUIRE_CURL") == "1" {
			t.Fatal("curl is not installed, and GRID_REQUIRE_CURL=1: the examples' commands must run")
		}
		t.Skip("the examples' commands use curl")
	}
	for _, ex := range []struct{ dir, site string }{
		{"vllm", "east"}, {"sglang", "west"}, {"llm-d", "central"}, {"two-sites", "east|west"},
	} {
		t.Run(ex.dir, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), ex.dir)
			if err := os.CopyFS(dir, os.DirFS(filepath.Join("../../examples", ex.dir))); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(gridBinary, filepath.Join(dir, "grid")); err != nil {
				t.Fatal(err)
			}
			blocks := readmeCommands(t, filepath.Join(dir, "README.md"))
			if len(blocks) < 3 || !strings.Contains(blocks[len(blocks)-1], "kill $(cat pids)") {
				t.Fatalf("README.md: %d sh blocks, the last %q; want the steps and a stop that reads pids", len(blocks), blocks[len(blocks)-1])
			}
			var started []int
			t.Cleanup(func() {
				for _, pid := range started {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			out := runScript(t, dir, strings.Join(blocks[:len(blocks)-1], "\n"), func() {
				started = readPids(t, dir)
			})
			if !regexp.MustCompile(`(?mi)^ok$`).MatchString(out) {
				t.Errorf("the gateway never answered ready:\n%s", out)
			}
			if !regexp.MustCompile(`(?mi)^x-grid-site: (` + ex.site + `)\r?$`).MatchString(out) {
				t.Errorf("the request was not answered by site %s:\n%s", ex.site, out)
			}
			if len(started) == 0 {
				t.Fatalf("the steps wrote no pids:\n%s", out)
			}
			runScript(t, dir, blocks[len(blocks)-1], nil)
			deadline := time.Now().Add(45 * time.Second)
			for _, pid := range started {
				for alive(pid) {
					if time.Now().After(deadline) {
						t.Fatalf("process %d still runs after the README's stop", pid)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
}

// runScript runs script with bash -euo pipefail in dir; its output goes to
// a file, so the processes it leaves running do not hold the test. after,
// when set, runs once the script has ended, whether it failed or not.
func runScript(t *testing.T, dir, script string, after func()) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, log, log
	runErr := cmd.Run()
	if after != nil {
		after()
	}
	out, _ := os.ReadFile(log.Name())
	if runErr != nil {
		t.Fatalf("%v running:\n%s\n--- output:\n%s", runErr, script, out)
	}
	return string(out)
}

func readPids(t *testing.T, dir string) []int {
	b, _ := os.ReadFile(filepath.Join(dir, "pids"))
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// alive reports whether pid runs (a zombie waiting to be reaped does not).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
