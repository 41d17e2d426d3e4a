// Package buildinfo reports the version the binary was built as.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set at link time (-ldflags "-X .../buildinfo.Version=v1.2.3");
// otherwise the module version, or "devel".
var Version = ""

// Revision is the VCS revision set at link time, for builds without the
// repository's metadata (an image build, where .git is not sent); the Go
// toolchain's vcs.revision wins when both exist.
var Revision = ""

// String describes the build on one line: version, VCS revision, Go version
// and platform.
func String() string {
	v, rev, built := Version, Revision, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				built = s.Value
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	s := fmt.Sprintf("grid %s", v)
	if rev != "" {
		s += " (" + rev
		if built != "" {
			s += ", " + built
		}
		s += ")"
	}
	return s + fmt.Sprintf(" %s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
