{{/*
Names and labels shared by every template.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "goodput.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name: fullnameOverride, else the release name when it already contains
the chart name, else "<release>-<chart>". Cut to 52 characters so suffixes such as "-framework" stay
within the 63 characters of a label value.
*/}}
{{- define "goodput.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "goodput.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels that select the operator pods; never change them in an upgrade. */}}
{{- define "goodput.selectorLabels" -}}
app.kubernetes.io/name: {{ include "goodput.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels on every object of the chart. */}}
{{- define "goodput.labels" -}}
helm.sh/chart: {{ include "goodput.chart" . }}
app.kubernetes.io/name: {{ include "goodput.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: goodput
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "goodput.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "goodput.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator image reference: a digest wins over a tag; the tag defaults to appVersion.
global.imageRegistry (set by a parent chart) replaces the repository's registry: its first path
component when that names a host (has a "." or ":" or is "localhost"), else it is put in front.
*/}}
{{- define "goodput.image" -}}
{{- $repository := .Values.image.repository }}
{{- $registry := (.Values.global | default dict).imageRegistry }}
{{- if $registry }}
{{- $parts := splitn "/" 2 $repository }}
{{- $first := $parts._0 }}
{{- if and $parts._1 (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $repository = $parts._1 }}
{{- end }}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Image pull Secrets: the chart's own, then a parent chart's global ones, each name once. */}}
{{- define "goodput.imagePullSecrets" -}}
{{- $global := (.Values.global | default dict).imagePullSecrets | default list }}
{{- toJson (uniq (concat .Values.imagePullSecrets $global)) }}
{{- end }}

{{/* The leader election Lease's name. */}}
{{- define "goodput.leaseName" -}}
{{- default (include "goodput.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* The kopf peering object's name. */}}
{{- define "goodput.peeringName" -}}
{{- default (include "goodput.fullname" .) .Values.peering.name }}
{{- end }}

{{/*
The Prometheus job label of the operator's metrics, set by the ServiceMonitor or PodMonitor
relabelling so the alert rules can select the operator whatever scraped it.
*/}}
{{- define "goodput.metricsJob" -}}
{{- include "goodput.fullname" . }}
{{- end }}

{{/*
A histogram bucket bound as Prometheus writes the `le` label of a classic histogram: with a decimal
point ("2.5", "1.0", "2560.0"), so the rules match the series exactly.
*/}}
{{- define "goodput.bucketBound" -}}
{{- $bound := toString . }}
{{- if or (contains "." $bound) (contains "e" $bound) }}{{ $bound }}{{ else }}{{ $bound }}.0{{ end }}
{{- end }}

{{/* Render-time checks of value combinations the schema cannot express. */}}
{{- define "goodput.validate" -}}
{{- if and .Values.prometheus.serviceMonitor.enabled .Values.prometheus.podMonitor.enabled }}
{{- fail "prometheus.serviceMonitor.enabled and prometheus.podMonitor.enabled both scrape the operator: enable one of them, not both" }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not (or .Values.leaderElection.enabled .Values.peering.enabled)) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled: without it every replica would act on the same objects" }}
{{- end }}
{{- if and .Values.leaderElection.enabled .Values.peering.enabled }}
{{- fail "leaderElection.enabled and peering.enabled both coordinate replicas: enable one of them, not both" }}
{{- end }}
{{- if and .Values.leaderElection.enabled (le (float64 .Values.leaderElection.leaseDurationSeconds) (float64 .Values.leaderElection.renewDeadlineSeconds)) }}
{{- fail "leaderElection.leaseDurationSeconds must exceed leaderElection.renewDeadlineSeconds: the leader must stop before another may take over" }}
{{- end }}
{{- if ne (len .Values.watchNamespaces) (len (uniq .Values.watchNamespaces)) }}
{{- fail "watchNamespaces lists a namespace more than once" }}
{{- end }}
{{- if and .Values.gateway.enabled .Values.gateway.modelGroup .Values.gateway.modelGroupSelector }}
{{- fail "gateway.modelGroup and gateway.modelGroupSelector: set one (one ModelGroup, or the ModelGroups a label selector picks)" }}
{{- end }}
{{- if and .Values.agent.enabled (not (include "goodput.agentNamespaces" . | fromJsonArray)) }}
{{- fail "agent.enabled needs the namespaces that run ModelGroups: set agent.namespaces (or watchNamespaces)" }}
{{- end }}
{{- if and .Values.networkPolicy.engines.enabled (not (include "goodput.engineNamespaces" . | fromJsonArray)) }}
{{- fail "networkPolicy.engines.enabled needs the namespaces that run ModelGroups: set networkPolicy.engines.namespaces (or agent.namespaces, or watchNamespaces)" }}
{{- end }}
{{- end }}

{{/* The gateway's object names, labels and selector. */}}
{{- define "goodput.gateway.fullname" -}}
{{- printf "%s-gateway" (include "goodput.fullname" .) }}
{{- end }}

{{- define "goodput.gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "goodput.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* The namespace of the ModelGroup the gateway serves. */}}
{{- define "goodput.gateway.namespace" -}}
{{- default .Release.Namespace .Values.gateway.namespace }}
{{- end }}

{{/* The endpoint picker's object names, labels and selector, and its InferencePool's namespace. */}}
{{- define "goodput.endpointPicker.fullname" -}}
{{- printf "%s-endpoint-picker" (include "goodput.fullname" .) }}
{{- end }}

{{- define "goodput.endpointPicker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "goodput.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end }}

{{- define "goodput.endpointPicker.namespace" -}}
{{- default .Release.Namespace .Values.endpointPicker.namespace }}
{{- end }}

{{/* The namespaces that get the health agent's ServiceAccount and Role, as a JSON array. */}}
{{- define "goodput.agentNamespaces" -}}
{{- default .Values.watchNamespaces .Values.agent.namespaces | uniq | toJson }}
{{- end }}

{{/*
The port the operator's Prometheus queries reach: networkPolicy.prometheus.port, else the port of
prometheus.url, else its scheme's default (https 443, http 80).
*/}}
{{- define "goodput.prometheusPort" -}}
{{- if .Values.networkPolicy.prometheus.port }}
{{- .Values.networkPolicy.prometheus.port }}
{{- else }}
{{- $url := urlParse .Values.prometheus.url }}
{{- $hostPort := splitList ":" $url.host }}
{{- if gt (len $hostPort) 1 }}
{{- last $hostPort }}
{{- else if eq $url.scheme "https" }}443
{{- else }}80
{{- end }}
{{- end }}
{{- end }}

{{/* A NetworkPolicy peer: the pods of one namespace (every namespace when it is empty), optionally
narrowed by labels. */}}
{{- define "goodput.namespacePeer" -}}
{{- if .namespace }}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ .namespace }}
{{- else }}
- namespaceSelector: {}
{{- end }}
  {{- with .podLabels }}
  podSelector:
    matchLabels:
      {{- toYaml . | nindent 6 }}
  {{- end }}
{{- end }}

{{/* Egress every pod of ours needs: the cluster DNS and the API server. */}}
{{- define "goodput.networkPolicy.baseEgress" -}}
# The cluster DNS, to resolve Service names.
- to:
    {{- $dns := .Values.networkPolicy.dns }}
    {{- include "goodput.namespacePeer" (dict "namespace" $dns.namespace "podLabels" (default (dict "k8s-app" "kube-dns") $dns.podLabels)) | nindent 4 }}
  ports:
    - protocol: UDP
      port: 53
    - protocol: TCP
      port: 53
# The API server: its endpoints are host addresses outside any pod selector, so they are named by
# CIDR (networkPolicy.apiServer.cidrs) or, by default, by port alone.
- ports:
    {{- range .Values.networkPolicy.apiServer.ports }}
    - protocol: TCP
      port: {{ . }}
    {{- end }}
  {{- with .Values.networkPolicy.apiServer.cidrs }}
  to:
    {{- range . }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
  {{- end }}
{{- end }}

{{/* The namespaces whose ModelGroup pods get the engines' NetworkPolicy, as a JSON array. */}}
{{- define "goodput.engineNamespaces" -}}
{{- default (include "goodput.agentNamespaces" . | fromJsonArray) .Values.networkPolicy.engines.namespaces | uniq | toJson }}
{{- end }}
