package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/grid-inference/grid/internal/status"
)

func runStatus(ctx context.Context, args []string, e *env) error {
	fs := newFlagSet("status", e)
	target := fs.String("metrics", "http://127.0.0.1:9090", "base URL of an operator's or a gateway's plain metrics listener")
	if err := parseFlags(e, fs, args); err != nil {
		return err
	}
	base := *target
	if !strings.Contains(base, "://") {
		base = "http://" + base // host:port, as the listeners are configured
	}
	url := strings.TrimRight(base, "/") + "/metrics"
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("read %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("read %s: HTTP %d", url, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read %s: %w", url, err)
	}
	r, err := status.Parse(body)
	if err != nil {
		return fmt.Errorf("parse %s: %w", url, err)
	}
	return r.Write(e.stdout, time.Now())
}
