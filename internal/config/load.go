package config

import (
	"fmt"
	"path/filepath"
)

// LoadOperator reads, defaults and validates an operator configuration file.
func LoadOperator(file string) (*Operator, error) {
	var c Operator
	doc, err := decodeFile(file, &c)
	if err != nil {
		return nil, err
	}
	return finishOperator(doc, &c, filepath.Dir(file))
}

// ParseOperator is LoadOperator for configuration already in memory; name is
// used in error messages in place of a file name.
func ParseOperator(name string, data []byte) (*Operator, error) {
	var c Operator
	doc, err := decodeBytes(name, data, &c)
	if err != nil {
		return nil, err
	}
	return finishOperator(doc, &c, "")
}

// FinishOperator defaults and validates a configuration built in memory
// (Kubernetes mode builds one from its resources), exactly as a file is;
// source names where it came from in errors.
func FinishOperator(source string, c *Operator) (*Operator, error) {
	return finishOperator(&document{file: source}, c, "")
}

// finishOperator defaults and validates c; dir, when set, is the directory
// of the file it came from, which relative paths (defaults included) are
// read against.
func finishOperator(doc *document, c *Operator, dir string) (*Operator, error) {
	if doc != nil {
		c.Deprecated = doc.deprecated
	}
	c.applyDefaults()
	if dir != "" {
		c.resolvePaths(dir)
	}
	c.TLS.locate(doc, "tls")
	if err := c.validate(doc); err != nil {
		return nil, fmt.Errorf("invalid operator config:\n%w", err)
	}
	return c, nil
}

// LoadGateway reads, defaults and validates a gateway configuration file.
func LoadGateway(file string) (*Gateway, error) {
	var c Gateway
	doc, err := decodeFile(file, &c)
	if err != nil {
		return nil, err
	}
	c.TLS.resolve(filepath.Dir(file))
	return finishGateway(doc, &c)
}

// ParseGateway is LoadGateway for configuration already in memory.
func ParseGateway(name string, data []byte) (*Gateway, error) {
	var c Gateway
	doc, err := decodeBytes(name, data, &c)
	if err != nil {
		return nil, err
	}
	return finishGateway(doc, &c)
}

func finishGateway(doc *document, c *Gateway) (*Gateway, error) {
	if doc != nil {
		c.Deprecated = doc.deprecated
	}
	c.applyDefaults()
	c.TLS.locate(doc, "tls")
	if err := c.validate(doc); err != nil {
		return nil, fmt.Errorf("invalid gateway config:\n%w", err)
	}
	return c, nil
}

// resolve makes a relative path of a file relative to dir, the directory of
// the configuration file that names it: a configuration means the same
// files wherever the daemon is started from.
func resolve(dir string, p *string) {
	if *p != "" && !filepath.IsAbs(*p) {
		*p = filepath.Join(dir, *p)
	}
}

func (t *TLS) resolve(dir string) {
	if t != nil {
		resolve(dir, &t.CA)
		resolve(dir, &t.Cert)
		resolve(dir, &t.Key)
	}
}

func (c *Operator) resolvePaths(dir string) {
	c.TLS.resolve(dir)
	resolve(dir, &c.StateDir)
	if c.Membership != nil {
		resolve(dir, &c.Membership.KeyFile)
	}
	for i := range c.Providers {
		m := &c.Providers[i].Metrics
		resolve(dir, &m.BearerTokenFile)
		if m.TLS != nil {
			resolve(dir, &m.TLS.CA)
			resolve(dir, &m.TLS.Cert)
			resolve(dir, &m.TLS.Key)
		}
	}
}
