// Package v1alpha1 holds the Kubernetes resources of Grid's operator in
// Kubernetes mode (`grid operator --kubernetes`): GridNetwork (the grid this
// site belongs to), GridSite (a peer site) and InferenceProvider (one of
// this site's inference backends). They carry what a file-mode
// configuration carries (docs/configuration.md); the operator turns them
// into one and runs exactly as in file mode. The CRDs in deploy/crds are
// generated from these types by controller-gen (`go generate ./api/...`).
//
// +kubebuilder:object:generate=true
// +groupName=grid-inference.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 object paths=. crd:crdVersions=v1 output:crd:dir=../../deploy/crds
//go:generate sh -c "cp ../../deploy/crds/*.yaml ../../deploy/helm/grid/crds/"

// GroupVersion is the API group and version of Grid's resources.
var GroupVersion = schema.GroupVersion{Group: "grid-inference.io", Version: "v1alpha1"}

var (
	// SchemeBuilder registers the types; the package depends on
	// apimachinery alone, so that clients can import it cheaply.
	SchemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, &GridNetwork{}, &GridNetworkList{}, &GridSite{}, &GridSiteList{}, &InferenceProvider{}, &InferenceProviderList{})
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})
	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// SecretKeyRef names one key of a Secret in the operator's namespace.
type SecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Key in the Secret's data.
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
}

// SiteTLS names the Secrets holding the site identity.
type SiteTLS struct {
	// CASecretRef is the grid CA bundle, PEM (for example key ca.crt).
	CASecretRef SecretKeyRef `json:"caSecretRef"`
	// SiteSecretName is a kubernetes.io/tls Secret (keys tls.crt, tls.key)
	// with this site's certificate: exactly one URI SAN,
	// spiffe://<trustDomain>/site/<site>.
	// +kubebuilder:validation:MinLength=1
	SiteSecretName string `json:"siteSecretName"`
}

// Membership joins the grid's SWIM gossip cluster (the file mode's
// membership block).
type Membership struct {
	// Bind is the gossip listener, host:port.
	// +optional
	Bind string `json:"bind,omitempty"`
	// Advertise is where other members reach this one, host:port.
	// +optional
	Advertise string `json:"advertise,omitempty"`
	// Seeds are members to join through, host:port.
	// +optional
	Seeds []string `json:"seeds,omitempty"`
	// KeySecretRef holds the gossip key: base64 of 16, 24 or 32 bytes.
	KeySecretRef SecretKeyRef `json:"keySecretRef"`
	// Signals is this operator's signals URL as other members poll it.
	// +kubebuilder:validation:Pattern=`^https://`
	Signals string `json:"signals"`
	// Gateway is this site's gateway hop URL.
	// +optional
	// +kubebuilder:validation:Pattern=`^https://`
	Gateway string `json:"gateway,omitempty"`
	// Profile is memberlist's timing preset.
	// +optional
	// +kubebuilder:validation:Enum=lan;wan;local
	Profile string `json:"profile,omitempty"`
}

// GridNetworkSpec is the grid this site belongs to and how it takes part.
type GridNetworkSpec struct {
	// Site is this site's name, its SPIFFE identity and grid_site label.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`
	Site string `json:"site"`
	// TrustDomain is the grid's SPIFFE trust domain (default grid.internal).
	// +optional
	TrustDomain string `json:"trustDomain,omitempty"`
	// TLS names the site identity's Secrets. Required: there is no plaintext
	// signals path.
	TLS SiteTLS `json:"tls"`
	// ScrapeInterval is how often every provider is scraped (default 1s).
	// +optional
	ScrapeInterval *metav1.Duration `json:"scrapeInterval,omitempty"`
	// PeerPollInterval is how often every peer is polled (default 5s).
	// +optional
	PeerPollInterval *metav1.Duration `json:"peerPollInterval,omitempty"`
	// Membership, when set, discovers peers by gossip in addition to the
	// namespace's GridSites.
	// +optional
	Membership *Membership `json:"membership,omitempty"`
}

// GridNetwork is the grid a site's operator belongs to. Exactly one per
// operator namespace: with none the operator waits, with more it refuses.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=gridnet
// +kubebuilder:printcolumn:name="Site",type=string,JSONPath=`.spec.site`
// +kubebuilder:printcolumn:name="Trust domain",type=string,JSONPath=`.spec.trustDomain`
type GridNetwork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              GridNetworkSpec `json:"spec"`
}

// GridNetworkList is a list of GridNetworks.
//
// +kubebuilder:object:root=true
type GridNetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GridNetwork `json:"items"`
}

// GridSiteSpec is one peer site.
type GridSiteSpec struct {
	// Signals is the https base URL of the peer operator's signals
	// listener. The peer's certificate must name the site (metadata.name).
	// +kubebuilder:validation:Pattern=`^https://`
	Signals string `json:"signals"`
	// Gateway is the https base URL of the peer gateway's hop listener.
	// +optional
	// +kubebuilder:validation:Pattern=`^https://`
	Gateway string `json:"gateway,omitempty"`
	// Labels describe the site (region, cloud); informational.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
}

// GridSite is a peer site; its name is the site's name.
//
// +kubebuilder:object:root=true
// +kubebuilder:printcolumn:name="Signals",type=string,JSONPath=`.spec.signals`
// +kubebuilder:printcolumn:name="Gateway",type=string,JSONPath=`.spec.gateway`
type GridSite struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              GridSiteSpec `json:"spec"`
}

// GridSiteList is a list of GridSites.
//
// +kubebuilder:object:root=true
type GridSiteList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GridSite `json:"items"`
}

// ProviderMetrics is how a provider is scraped.
type ProviderMetrics struct {
	// Endpoint is the base URL of the metrics server (for an EPP, its
	// Service).
	// +kubebuilder:validation:Pattern=`^https?://`
	Endpoint string `json:"endpoint"`
	// Path is the exposition path (default /metrics).
	// +optional
	Path string `json:"path,omitempty"`
	// PoolName keeps only EPP series of this pool (label name, or
	// inference_pool for flow control).
	// +optional
	PoolName string `json:"poolName,omitempty"`
	// Timeout bounds one scrape (default 2s).
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// StaleAfter is how long without a successful scrape before the
	// provider is declared not ready (default half the signals TTL).
	// +optional
	StaleAfter *metav1.Duration `json:"staleAfter,omitempty"`
	// RefreshInterval is how often the backend recomputes the gauges it
	// serves: the EPP's --refresh-prometheus-metrics-interval (default
	// none: live gauges, as an engine's). The operator learns when it
	// recomputes them, scrapes just after, and stamps each reading with
	// when its values were computed.
	// +optional
	RefreshInterval *metav1.Duration `json:"refreshInterval,omitempty"`
	// BearerTokenSecretRef holds a token sent as Authorization: Bearer (the
	// EPP's /metrics requires one by default).
	// +optional
	BearerTokenSecretRef *SecretKeyRef `json:"bearerTokenSecretRef,omitempty"`
}

// InferenceProviderSpec is one inference backend of this site.
type InferenceProviderSpec struct {
	// Model is the model name clients ask for.
	// +kubebuilder:validation:MinLength=1
	Model string `json:"model"`
	// Kind is how the provider is read.
	// +optional
	// +kubebuilder:validation:Enum=epp;vllm;sglang;auto;generic
	Kind string `json:"kind,omitempty"`
	// Metrics says where and how to scrape the provider's load.
	Metrics ProviderMetrics `json:"metrics"`
	// Upstream is where this site's gateway forwards the provider's
	// requests.
	// +kubebuilder:validation:Pattern=`^https?://`
	Upstream string `json:"upstream"`
	// Unavailable takes the provider out of service: it is published not
	// ready (ProviderUnavailable) whatever its metrics say.
	// +optional
	Unavailable bool `json:"unavailable,omitempty"`
	// MaxRunning is the most requests one ready unit of the provider (an
	// endpoint of a pool, an engine) runs at once (vLLM's --max-num-seqs,
	// SGLang's --max-running-requests). Relayed to every gateway, which
	// then credits a unit with no more undemonstrated capacity than this.
	// 0 relays what the engine declares, if anything.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxRunning int32 `json:"maxRunning,omitempty"`
	// AccessPolicy restricts which peer sites may read the provider's
	// signals and route to it; absent, every peer may.
	// +optional
	AccessPolicy *AccessPolicy `json:"accessPolicy,omitempty"`
}

// AccessPolicy says which peer sites may use a provider.
type AccessPolicy struct {
	// SiteSelector selects the peer sites (GridSites, by their
	// spec.labels) that may read the provider's signals and route to it.
	// A model is shared with a peer only when every provider of the model
	// admits it.
	SiteSelector metav1.LabelSelector `json:"siteSelector"`
}

// InferenceProviderStatus is what the operator concludes of the provider.
type InferenceProviderStatus struct {
	// ObservedGeneration is the generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions holds Ready: its reason is the readiness reason (Ready,
	// ScrapeTimedOut, NoEndpointsReady, ...; docs/operator.md).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// InferenceProvider is one inference backend of this site: an llm-d EPP
// pool or an engine. Its name is the provider's routing identity (the
// grid_provider label); its metadata.uid and metadata.generation are the
// provider revision peers order its batches by.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ip
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.model`
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.spec.kind`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
type InferenceProvider struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              InferenceProviderSpec   `json:"spec"`
	Status            InferenceProviderStatus `json:"status,omitempty"`
}

// InferenceProviderList is a list of InferenceProviders.
//
// +kubebuilder:object:root=true
type InferenceProviderList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InferenceProvider `json:"items"`
}
