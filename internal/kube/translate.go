package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gridv1 "github.com/grid-inference/grid/api/v1alpha1"
	"github.com/grid-inference/grid/internal/config"
)

// ErrNoNetwork is returned while the namespace holds no GridNetwork: the
// operator waits for one.
var ErrNoNetwork = errors.New("no GridNetwork in the namespace")

// Translator turns a namespace's Grid resources into the operator
// configuration file mode would read, so that Kubernetes mode runs the very
// same operator. Secret keys the resources reference are written as files
// under Dir (mode 0600), where the file-mode machinery reads them: the
// identity reloads renewed certificates from there, scrapes read bearer
// tokens, the gossip key is read at start.
type Translator struct {
	// Reader reads the Grid resources (the manager's cache).
	Reader client.Reader
	// Secrets reads the Secrets the resources name, one GET by name each
	// (the manager's API reader, uncached): no list or watch of the
	// namespace's Secrets, so the operator's Role grants get on those
	// names only, and no other Secret is held in memory. A rotated Secret
	// is read at the next reconcile (every resyncInterval at most). Nil
	// means Reader.
	Secrets   client.Reader
	Namespace string
	// Dir receives the Secrets' keys and the operator's state directory.
	Dir string
	// Base carries what the resources do not: the listeners.
	Base config.Operator
}

// Config reads the namespace and returns the configuration it declares,
// defaulted and validated as a file would be.
func (t *Translator) Config(ctx context.Context) (*config.Operator, error) {
	var networks gridv1.GridNetworkList
	if err := t.Reader.List(ctx, &networks, client.InNamespace(t.Namespace)); err != nil {
		return nil, fmt.Errorf("list GridNetworks: %w", err)
	}
	switch len(networks.Items) {
	case 0:
		return nil, ErrNoNetwork
	case 1:
	default:
		names := make([]string, len(networks.Items))
		for i, n := range networks.Items {
			names[i] = n.Name
		}
		return nil, fmt.Errorf("%d GridNetworks in namespace %s (%s): an operator belongs to exactly one grid", len(names), t.Namespace, strings.Join(names, ", "))
	}
	net := &networks.Items[0]
	var sites gridv1.GridSiteList
	if err := t.Reader.List(ctx, &sites, client.InNamespace(t.Namespace)); err != nil {
		return nil, fmt.Errorf("list GridSites: %w", err)
	}
	var providers gridv1.InferenceProviderList
	if err := t.Reader.List(ctx, &providers, client.InNamespace(t.Namespace)); err != nil {
		return nil, fmt.Errorf("list InferenceProviders: %w", err)
	}

	cfg := t.Base
	cfg.Site = net.Spec.Site
	cfg.TrustDomain = net.Spec.TrustDomain
	cfg.StateDir = filepath.Join(t.Dir, "state")
	if d := net.Spec.ScrapeInterval; d != nil {
		cfg.ScrapeInterval = config.Duration(d.Duration)
	}
	if d := net.Spec.PeerPollInterval; d != nil {
		cfg.PeerPollInterval = config.Duration(d.Duration)
	}
	tls := net.Spec.TLS
	caFile, err := t.secretFile(ctx, tls.CASecretRef, "ca.crt")
	if err != nil {
		return nil, err
	}
	certFile, err := t.secretFile(ctx, gridv1.SecretKeyRef{Name: tls.SiteSecretName, Key: corev1.TLSCertKey}, "site.crt")
	if err != nil {
		return nil, err
	}
	keyFile, err := t.secretFile(ctx, gridv1.SecretKeyRef{Name: tls.SiteSecretName, Key: corev1.TLSPrivateKeyKey}, "site.key")
	if err != nil {
		return nil, err
	}
	cfg.TLS = &config.TLS{CA: caFile, Cert: certFile, Key: keyFile}
	if m := net.Spec.Membership; m != nil {
		keyFile, err := t.secretFile(ctx, m.KeySecretRef, "gossip.key")
		if err != nil {
			return nil, err
		}
		cfg.Membership = &config.Membership{Bind: m.Bind, Advertise: m.Advertise, Seeds: m.Seeds, KeyFile: keyFile,
			Signals: m.Signals, Gateway: m.Gateway, Profile: m.Profile}
	}
	cfg.Peers = nil
	for _, s := range sites.Items {
		models, err := sharedModels(providers.Items, s.Spec.Labels)
		if err != nil {
			return nil, err
		}
		cfg.Peers = append(cfg.Peers, config.Peer{Site: s.Name, Signals: s.Spec.Signals, Gateway: s.Spec.Gateway, Models: models})
	}
	cfg.Providers = nil
	for i := range providers.Items {
		ip := &providers.Items[i]
		p := config.Provider{Name: ip.Name, Model: ip.Spec.Model, Kind: ip.Spec.Kind, Upstream: ip.Spec.Upstream,
			Unavailable: ip.Spec.Unavailable, MaxRunning: int(ip.Spec.MaxRunning), Object: &config.ObjectRevision{UID: string(ip.UID), Generation: ip.Generation},
			Metrics: config.Metrics{Endpoint: ip.Spec.Metrics.Endpoint, Path: ip.Spec.Metrics.Path, PoolName: ip.Spec.Metrics.PoolName}}
		if d := ip.Spec.Metrics.Timeout; d != nil {
			p.Metrics.Timeout = config.Duration(d.Duration)
		}
		if d := ip.Spec.Metrics.RefreshInterval; d != nil {
			p.Metrics.RefreshInterval = config.Duration(d.Duration)
		}
		if d := ip.Spec.Metrics.StaleAfter; d != nil {
			p.Metrics.StaleAfter = config.Duration(d.Duration)
		}
		if ref := ip.Spec.Metrics.BearerTokenSecretRef; ref != nil {
			if p.Metrics.BearerTokenFile, err = t.secretFile(ctx, *ref, "token-"+ip.Name); err != nil {
				return nil, err
			}
		}
		cfg.Providers = append(cfg.Providers, p)
	}
	// List order is the API server's; configuration order is by name, so
	// that the same resources always make the same configuration.
	slices.SortFunc(cfg.Peers, func(a, b config.Peer) int { return strings.Compare(a.Site, b.Site) })
	slices.SortFunc(cfg.Providers, func(a, b config.Provider) int { return strings.Compare(a.Name, b.Name) })
	return config.FinishOperator(fmt.Sprintf("GridNetwork %s/%s", t.Namespace, net.Name), &cfg)
}

// Wait reads the namespace until it declares a grid whose configuration
// translates, retrying every five seconds, and returns that configuration.
// Each refusal is logged and, when startup is set, shown on its probes.
func (t *Translator) Wait(ctx context.Context, log *slog.Logger, startup *Startup) (*config.Operator, error) {
	for {
		cfg, err := t.Config(ctx)
		if err == nil {
			return cfg, nil
		}
		if errors.Is(err, ErrNoNetwork) {
			log.Warn("waiting for a GridNetwork", "namespace", t.Namespace)
		} else {
			log.Warn("the namespace's configuration does not translate yet", "err", err)
		}
		startup.Set(err.Error())
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}

// secretFile writes one key of a Secret to Dir/name, replacing the file only
// when its content changed (a rename, so a reader never sees half a
// certificate), and returns the path.
func (t *Translator) secretFile(ctx context.Context, ref gridv1.SecretKeyRef, name string) (string, error) {
	var s corev1.Secret
	secrets := t.Secrets
	if secrets == nil {
		secrets = t.Reader
	}
	if err := secrets.Get(ctx, client.ObjectKey{Namespace: t.Namespace, Name: ref.Name}, &s); err != nil {
		return "", fmt.Errorf("secret %s/%s: %w", t.Namespace, ref.Name, err)
	}
	data, ok := s.Data[ref.Key]
	if !ok {
		return "", fmt.Errorf("secret %s/%s has no key %q", t.Namespace, ref.Name, ref.Key)
	}
	if err := os.MkdirAll(t.Dir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(t.Dir, name)
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return path, nil
	}
	tmp, err := os.CreateTemp(t.Dir, name+".tmp-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return path, os.Rename(tmp.Name(), path)
}

// sharedModels turns the providers' access policies into what a peer with
// the given GridSite labels may use: nil (every model) when no provider has
// a policy; otherwise the models every provider of which admits the peer.
// A model some provider of which does not admit the peer is not shared: the
// most restrictive policy wins, so no restricted provider is read or routed
// to through a sibling's model.
func sharedModels(providers []gridv1.InferenceProvider, siteLabels map[string]string) ([]string, error) {
	restricted := false
	admits := map[string]bool{} // model -> every provider admits the peer
	for i := range providers {
		ip := &providers[i]
		ok := true
		if ap := ip.Spec.AccessPolicy; ap != nil {
			restricted = true
			sel, err := metav1.LabelSelectorAsSelector(&ap.SiteSelector)
			if err != nil {
				return nil, fmt.Errorf("InferenceProvider %s: accessPolicy.siteSelector: %w", ip.Name, err)
			}
			ok = sel.Matches(labels.Set(siteLabels))
		}
		if prev, seen := admits[ip.Spec.Model]; seen {
			ok = ok && prev
		}
		admits[ip.Spec.Model] = ok
	}
	if !restricted {
		return nil, nil
	}
	models := []string{}
	for m, ok := range admits {
		if ok {
			models = append(models, m)
		}
	}
	slices.Sort(models)
	return models, nil
}
