{{/*
The operator's permissions, in two parts (kopf's deployment RBAC draws the same line):

- framework: what kopf itself does whatever the handlers are: post Events (goodput's Events go
  through kopf too) and keep its peering object. kopf's namespace and CRD scanning is switched off
  by the operator, so it needs no namespaces or customresourcedefinitions access; API discovery
  (/api, /apis) is open to every authenticated client.
- controller: what goodput's handlers read and write, verb by verb. Nodes are cluster-scoped, so
  they are granted apart, by a ClusterRole, in every mode.
*/}}

{{- define "goodput.rbac.frameworkRules" -}}
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.peering.enabled }}
- apiGroups: ["kopf.dev"]
  resources: [{{ if .Values.watchNamespaces }}"kopfpeerings"{{ else }}"clusterkopfpeerings"{{ end }}]
  verbs: ["list", "watch"]
- apiGroups: ["kopf.dev"]
  resources: [{{ if .Values.watchNamespaces }}"kopfpeerings"{{ else }}"clusterkopfpeerings"{{ end }}]
  resourceNames: [{{ include "goodput.peeringName" . | quote }}]
  verbs: ["get", "patch"]
{{- end }}
{{- end }}

{{- define "goodput.rbac.controllerRules" -}}
# The custom resources: watched, annotated and given a finalizer by kopf, status written by goodput;
# the autoscaler reads the current object before each decision.
- apiGroups: ["goodput.dev"]
  resources: ["modelgroups", "slopolicies"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["goodput.dev"]
  resources: ["modelgroups/status", "slopolicies/status"]
  verbs: ["patch"]
# Group pods name their ModelGroup as owner with blockOwnerDeletion, which the OwnerReferences
# admission plugin (OpenShift, hardened clusters) allows only with update on the owner's finalizers.
- apiGroups: ["goodput.dev"]
  resources: ["modelgroups/finalizers"]
  verbs: ["update"]
# The autoscaler sets a ModelGroup's replicas through its scale subresource, as the HPA does.
- apiGroups: ["goodput.dev"]
  resources: ["modelgroups/scale"]
  verbs: ["get", "patch", "update"]
# Group pods: created gated, released together, drained, deleted whole; watched through indexes.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The group-ready readiness-gate condition is set through the pods' status subresource.
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
# One headless Service per multi-pod group, for the leader's address.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "delete"]
# A draining group's pods must have left its Service's endpoints before requests are awaited.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
# ModelGroups with engine.gpuDeviceClassName: each pod's GPUs come from a claim made from a template
# the operator creates, and placement counts the devices that allocated claims hold.
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaimtemplates"]
  verbs: ["create"]
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaims"]
  verbs: ["list", "watch"]
# The autoscaler prices a model from the checkpoint's config.json that a ModelGroup's
# profile.modelConfigRef names: it gets that ConfigMap by name, and lists or watches none.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get"]
{{- end }}

{{- define "goodput.rbac.leaderElectionRules" -}}
# The Lease the replicas compete for, in the release's namespace only: created once (RBAC cannot
# name an object that does not exist yet), then read and renewed by name.
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["create"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: [{{ include "goodput.leaseName" . | quote }}]
  verbs: ["get", "update"]
{{- end }}

{{- define "goodput.rbac.nodeRules" -}}
# GPU inventory and topology labels for gang placement; under dynamic resource allocation, the
# devices the drivers publish per node and the classes that select them (both cluster-scoped).
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceslices", "deviceclasses"]
  verbs: ["get", "list", "watch"]
{{- end }}
