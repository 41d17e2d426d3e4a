{{- define "grid.fullname" -}}
{{- printf "%s-%s" .Release.Name .Values.site | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "grid.labels" -}}
app.kubernetes.io/name: grid
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
grid-inference.io/site: {{ .Values.site }}
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
