// Package backend scrapes inference providers: an llm-d EPP's pool metrics,
// or an engine (vLLM, SGLang, or any server of /v1/loads) through the
// /v1/loads probe with its /metrics fallback. It turns a response into a
// Reading and every failure into one of a bounded set of classes.
package backend

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
)

// Class is a bounded failure class, the `result` label of
// grid_provider_scrape_total.
type Class string

// Failure classes.
const (
	ClassTimeout      Class = "timeout"
	ClassUnauthorized Class = "unauthorized"
	ClassTLS          Class = "tls"
	ClassDNS          Class = "dns"
	ClassConnect      Class = "connect"
	ClassHTTP         Class = "http"
	ClassBodyCap      Class = "body_cap"
	ClassParse        Class = "parse"
	ClassConfig       Class = "config"
)

// Results that are not failures.
const (
	ResultSuccess  = "success"
	ResultNoSeries = "no_series"
)

// Results lists every value of the result label, so counters can be
// pre-created at zero.
var Results = []string{ResultSuccess, ResultNoSeries, string(ClassTimeout), string(ClassUnauthorized), string(ClassTLS),
	string(ClassDNS), string(ClassConnect), string(ClassHTTP), string(ClassBodyCap), string(ClassParse), string(ClassConfig)}

// Error is a classified scrape failure.
type Error struct {
	Class Class
	Err   error
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %v", e.Class, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// ClassOf returns the class of a scrape error.
func ClassOf(err error) Class {
	var se *Error
	if errors.As(err, &se) {
		return se.Class
	}
	return classify(err)
}

// classify maps a transport error to its class by walking the error chain.
func classify(err error) Class {
	var (
		dnsErr   *net.DNSError
		certErr  *tls.CertificateVerificationError
		recErr   tls.RecordHeaderError
		alertErr tls.AlertError
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		host     x509.HostnameError
	)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return ClassTimeout
	case errors.As(err, &dnsErr):
		return ClassDNS
	case errors.As(err, &certErr), errors.As(err, &recErr), errors.As(err, &alertErr),
		errors.As(err, &unknown), errors.As(err, &invalid), errors.As(err, &host):
		return ClassTLS
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ClassTimeout
	}
	// Refused, reset, unreachable, or a connection lost mid-answer: the
	// provider could not be talked to.
	return ClassConnect
}

var errBodyCap = errors.New("body exceeds the scrape budget")
