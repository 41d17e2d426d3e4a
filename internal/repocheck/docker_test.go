package repocheck

import (
	"os"
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
	if !strings.Contains(d, "FROM golang:"+string(tc[1])+"-") {
		t.Errorf("the Dockerfile does not build with go.mod's toolchain %s", tc[1])
	}
	if !strings.Contains(d, "CGO_ENABLED=0") {
		t.Error("the Dockerfile's build is not static (CGO_ENABLED=0)")
	}
	user := regexp.MustCompile(`(?m)^USER (\S+)`).FindStringSubmatch(d)
	if user == nil || user[1] == "0" || strings.HasPrefix(user[1], "root") || strings.HasPrefix(user[1], "0:") {
		t.Errorf("the image runs as %v, want a non-root user", user)
	}
	if !regexp.MustCompile(`(?m)^FROM gcr\.io/distroless/static`).MatchString(d) {
		t.Error("the final stage is not distroless/static")
	}
}
