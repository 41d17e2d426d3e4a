{{- define "grid.site" -}}
{{- required "site is required: this release's site name (--set site=<name>), its SPIFFE identity spiffe://<trustDomain>/site/<name>" .Values.site -}}
{{- end -}}

{{- define "grid.fullname" -}}
{{- printf "%s-%s" .Release.Name (include "grid.site" .) | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* Scheduling and pull values of one component's pod spec (gateway or operator). */}}
{{- define "grid.podScheduling" -}}
{{- $c := index .root.Values .component -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $c.affinity }}
affinity:
  {{- toYaml $c.affinity | nindent 2 }}
{{- else if eq .component "gateway" }}
# Replicas prefer different nodes, so one node's loss leaves the site served.
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "grid.selector" .root | nindent 14 }}
              app.kubernetes.io/component: gateway
{{- end }}
{{- with $c.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "grid.labels" -}}
app.kubernetes.io/name: grid
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
grid-inference.io/site: {{ include "grid.site" . }}
{{- end -}}

{{- define "grid.selector" -}}
app.kubernetes.io/name: grid
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "grid.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "grid.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}


{{/* The Secrets the operator may get: the site's TLS Secrets, the gossip
key, the providers' token Secrets, and operator.secretNames; as a YAML
list, each name once. */}}
{{- define "grid.operatorSecrets" -}}
{{- $names := list .Values.tls.caSecret.name .Values.tls.siteSecret -}}
{{- if .Values.operator.membership.enabled -}}
{{- $names = append $names .Values.operator.membership.keySecret.name -}}
{{- end -}}
{{- range .Values.providers -}}
{{- with .metrics.bearerTokenSecret -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- end -}}
{{- $names = concat $names .Values.operator.secretNames -}}
{{- toYaml (uniq $names) -}}
{{- end -}}
