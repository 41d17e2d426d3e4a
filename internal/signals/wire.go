package signals

import (
	"regexp"
	"slices"
	"strings"
)

// The HTTP side of the contract: where an operator answers, what its answers
// carry besides rows, and the bounds both ends apply (docs/protocol.md §2).
const (
	// SignalsPath is where an operator serves its signals to peer operators
	// and to its own gateway.
	SignalsPath = "/v1/site/signals"
	// ServingPath is where an operator tells its own gateway what the site
	// serves and where requests go (the Serving document).
	ServingPath = "/v1/site/serving"
	// ContentType is the media type of a signals answer.
	ContentType = "text/plain; version=0.0.4; charset=utf-8"
	// MaxAnswerBytes is the most a receiver reads of one signals answer; a
	// longer answer is refused whole.
	MaxAnswerBytes = 1 << 20
	// RelayBodyBytes is what a sender keeps each answer under, so that an
	// answer never reaches MaxAnswerBytes.
	RelayBodyBytes = 768 << 10
	// MaxLinesPerTarget bounds one provider's lines in an answer; a sender
	// drops a provider with more, whole.
	MaxLinesPerTarget = 4096
)

// The long poll (docs/protocol.md §2.1): every answer carries a cursor; a
// caller that passes it back as since, with a wait, is answered when what
// it may read changed after it, or when the wait ends. A caller that does
// not ask to wait is answered at once.
const (
	// CursorHeader carries an answer's cursor.
	CursorHeader = "X-Grid-Cursor"
	// WaitParam asks to wait (a duration, at most 60 s) for a change.
	WaitParam = "wait"
	// SinceParam is the cursor the wait is for.
	SinceParam = "since"
)

// Relay paging (docs/protocol.md §2.5): an answer to the Local caller that
// the body bound cut names where the next page starts; the gateway passes it
// back as the after parameter.
const (
	// RelayNextHeader carries the cursor of the next page.
	RelayNextHeader = "X-Grid-Relay-Next"
	// AfterParam is the query parameter that asks for the page after a
	// cursor.
	AfterParam = "after"
)

// RelayStore names one of the two stores a Local answer carries, in the
// order it carries them: this site's providers, then its peers'.
type RelayStore string

// The relay's stores.
const (
	StoreSite  RelayStore = "site"
	StorePeers RelayStore = "peers"
)

// Cursor is a position in the relay: a store and a target (site/provider)
// in it. Answers carry targets in (store, target) order, so a cursor stays
// meaningful while targets expire or arrive between two pages.
type Cursor struct {
	Store  RelayStore
	Target string
}

// IsZero reports whether c is the start of the relay.
func (c Cursor) IsZero() bool { return c.Store == "" }

// String renders c as it travels: "store:target".
func (c Cursor) String() string { return string(c.Store) + ":" + c.Target }

// Covers reports whether target of store comes at or before c, so was on an
// earlier page.
func (c Cursor) Covers(store RelayStore, target string) bool {
	if c.Store == "" {
		return false
	}
	if c.Store != store {
		return c.Store == StorePeers // every site target precedes the peers
	}
	return target <= c.Target
}

// ParseCursor reads a cursor a RelayNextHeader carried.
func ParseCursor(s string) (Cursor, bool) {
	store, target, ok := strings.Cut(s, ":")
	if !ok || (RelayStore(store) != StoreSite && RelayStore(store) != StorePeers) || target == "" {
		return Cursor{}, false
	}
	return Cursor{RelayStore(store), target}, true
}

// Serving is the serving document an operator gives its own gateway: this
// site's providers with the models they serve and their upstreams, and each
// peer site's gateway. Everything in it comes from the operator's
// configuration, never from a peer: a peer can describe its own load, not
// redirect traffic (docs/protocol.md §2.4).
type Serving struct {
	Site string `json:"site"`
	// LoadWindowMs is how far back the gateway reads load: long enough to
	// hold the latest reading of every site (peer poll + scrape + poll
	// timeout + peer poll).
	LoadWindowMs int64             `json:"loadWindowMs"`
	Providers    []ServingProvider `json:"providers"`
	Peers        []ServingPeer     `json:"peers"`
}

// ServingProvider is one local provider.
type ServingProvider struct {
	Name     string `json:"name"`
	Model    string `json:"model"`
	Upstream string `json:"upstream"`
	// Admission is absent when the provider takes every request.
	Admission Admission `json:"admission,omitempty"`
}

// ServingPeer is where a peer site's gateway takes forwarded requests, and
// what that site may route here.
type ServingPeer struct {
	Site    string `json:"site"`
	Gateway string `json:"gateway,omitempty"`
	// Models, when not null, are the only models the peer may route to
	// this site (docs/protocol.md §2.4); null is every model.
	Models []string `json:"models"`
}

// MayUse reports whether the peer may route a request for model here.
func (p ServingPeer) MayUse(model string) bool {
	return p.Models == nil || slices.Contains(p.Models, model)
}

var dns1123Label = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// IsDNS1123Label reports whether s is a DNS-1123 label: 1 to 63 characters of
// [a-z0-9-], starting and ending with an alphanumeric. Site and provider
// names are such labels everywhere: in configuration, certificates and rows.
func IsDNS1123Label(s string) bool { return dns1123Label.MatchString(s) }
