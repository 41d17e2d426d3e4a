//go:build tools

// Package helm pins the Helm the e2e tests render the chart with, the
// version .ci/helm lints it with.
package helm

import _ "helm.sh/helm/v3/cmd/helm"
