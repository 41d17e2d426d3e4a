package main

import (
	"context"
	"fmt"

	"github.com/grid-inference/grid/internal/config"
)

func runOperator(ctx context.Context, args []string, e *env) error {
	fs := newFlagSet("operator", e)
	file := fs.String("config", "site.yaml", "operator configuration file")
	check := fs.Bool("check-config", false, "validate the configuration and exit")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := config.LoadOperator(*file)
	if err != nil {
		return err
	}
	if *check {
		fmt.Fprintf(e.stdout, "%s: valid operator configuration for site %q (%d providers, %d peers)\n", *file, cfg.Site, len(cfg.Providers), len(cfg.Peers))
		return nil
	}
	return fmt.Errorf("%w (the operator's scrape loop arrives with a later release; --check-config works)", errNotImplemented)
}
