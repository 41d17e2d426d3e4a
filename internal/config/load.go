package config

import "fmt"

// LoadOperator reads, defaults and validates an operator configuration file.
func LoadOperator(file string) (*Operator, error) {
	var c Operator
	doc, err := decodeFile(file, &c)
	if err != nil {
		return nil, err
	}
	return finishOperator(doc, &c)
}

// ParseOperator is LoadOperator for configuration already in memory; name is
// used in error messages in place of a file name.
func ParseOperator(name string, data []byte) (*Operator, error) {
	var c Operator
	doc, err := decodeBytes(name, data, &c)
	if err != nil {
		return nil, err
	}
	return finishOperator(doc, &c)
}

// FinishOperator defaults and validates a configuration built in memory
// (Kubernetes mode builds one from its resources), exactly as a file is;
// source names where it came from in errors.
func FinishOperator(source string, c *Operator) (*Operator, error) {
	return finishOperator(&document{file: source}, c)
}

func finishOperator(doc *document, c *Operator) (*Operator, error) {
	c.applyDefaults()
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
	c.applyDefaults()
	if err := c.validate(doc); err != nil {
		return nil, fmt.Errorf("invalid gateway config:\n%w", err)
	}
	return c, nil
}
