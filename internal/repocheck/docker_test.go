package repocheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfileMatchesTheBuild: the image is built with the toolchain
// go.mod names, as a static binary (the distroless base has no libc), and
// runs as a non-root user.
func TestDockerfileMatchesTheBuild(t *testing.T) {
	root := filepath.Join("..", "..")
	docker, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	tc := regexp.MustCompile(`(?m)^toolchain go(\S+)`).FindSubmatch(mod)
	if tc == nil {
		t.Fatal("go.mod names no toolchain")
	}
	d := string(docker)
	if !strings.Contains(d, "ARG GO_IMAGE=golang:"+string(tc[1])+"-") {
		t.Errorf("the Dockerfile does not build with go.mod's toolchain %s", tc[1])
	}
	if !strings.Contains(d, "CGO_ENABLED=0") {
		t.Error("the Dockerfile's build is not static (CGO_ENABLED=0)")
	}
	user := regexp.MustCompile(`(?m)^USER (\S+)`).FindStringSubmatch(d)
	if user == nil || user[1] == "0" || strings.HasPrefix(user[1], "root") || strings.HasPrefix(user[1], "0:") {
		t.Errorf("the image runs as %v, want a non-root user", user)
	}
	if !regexp.MustCompile(`(?m)^ARG BASE_IMAGE=gcr\.io/distroless/static`).MatchString(d) {
		t.Error("the final stage is not distroless/static")
	}
	for _, label := range []string{"source", "version", "revision", "licenses"} {
		if !strings.Contains(d, "org.opencontainers.image."+label+"=") {
			t.Errorf("the image has no OCI label %s", label)
		}
	}
	if regexp.MustCompile(`(?m)^CMD`).MatchString(d) {
		t.Error("the image has a default command: with no arguments it must fail with the usage, not succeed at printing help")
	}
}

// TestDockerfileStampsVersionAndRevision builds the binary with the
// Dockerfile's own link flags and no VCS metadata (as in the image, where
// .git is not sent): `grid --version` names the version and the revision
// the build was given.
func TestDockerfileStampsVersionAndRevision(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	root := filepath.Join("..", "..")
	docker, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`-ldflags "([^"]+)"`).FindSubmatch(docker)
	if m == nil {
		t.Fatal("the Dockerfile's build has no -ldflags")
	}
	flags := strings.NewReplacer("${VERSION}", "1.2.3-test", "${REVISION}", "0123abcd").Replace(string(m[1]))
	bin := filepath.Join(t.TempDir(), "grid")
	build := exec.Command("go", "build", "-buildvcs=false", "-ldflags", flags, "-o", bin, "./cmd/grid")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build with the Dockerfile's flags: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if v := string(out); !strings.Contains(v, "grid 1.2.3-test (0123abcd") {
		t.Errorf("grid --version = %q, want the version and revision the build was given", v)
	}
}
