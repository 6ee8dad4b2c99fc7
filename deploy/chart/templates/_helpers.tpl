{{/* The release's name for its objects: the release name when it names podstream already. */}}
{{- define "podstream.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "podstream.labels" -}}
app.kubernetes.io/part-of: podstream
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The labels that pick one install's pods. */}}
{{- define "podstream.selectorLabels" -}}
app.kubernetes.io/name: podstream
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The labels that pick one component's pods; call with (list $ "ingest"). */}}
{{- define "podstream.componentSelector" -}}
{{ include "podstream.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* The subject prefix, or podstream's default. */}}
{{- define "podstream.prefix" -}}
{{- .Values.prefix | default "podstream" -}}
{{- end -}}

{{/* The ingest's Lease, as the ingest names it from the prefix (dots become dashes). */}}
{{- define "podstream.leaseName" -}}
{{- printf "%s-ingest" (include "podstream.prefix" . | replace "." "-") -}}
{{- end -}}

{{/* The image, by digest when one is given. */}}
{{- define "podstream.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* Whether the processors take only signed pods: when the schedulers run podstream's executor. */}}
{{- define "podstream.signedPods" -}}
{{- if eq .Values.taskFailures "executor" }}true{{ end -}}
{{- end -}}

{{/* A Deployment's metadata and selector, and its pod's labels; call with (list $ "ingest" replicas). */}}
{{- define "podstream.deploymentHead" -}}
{{- $ := index . 0 -}}
{{- $component := index . 1 -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "podstream.fullname" $ }}-{{ $component }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "podstream.labels" $ | nindent 4 }}
    app.kubernetes.io/name: podstream
    app.kubernetes.io/component: {{ $component }}
  annotations:
    checkov.io/skip1: CKV_K8S_43=the image is named by release tag in the chart's values; set image.digest once your registry holds it
{{- if eq $component "ingest" }}
    checkov.io/skip2: CKV_K8S_38=the ingest lists and watches pods and holds a Lease, so it needs its token (RBAC in rbac.yaml)
{{- else if eq $component "collect" }}
    checkov.io/skip2: CKV_K8S_38=the collector deletes worker pods, so it needs its token (RBAC in rbac.yaml)
{{- end }}
spec:
  replicas: {{ index . 2 }}
  selector:
    matchLabels:
      {{- include "podstream.componentSelector" (list $ $component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "podstream.componentSelector" (list $ $component) | nindent 8 }}
        {{- with $.Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $.Values.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}

{{/* What every podstream pod shares: a non-root, read-only, capability-free container, its
probes, resources, configuration and the CA it verifies NATS and PostgreSQL with. */}}
{{- define "podstream.podDefaults" -}}
{{- $ := index . 0 -}}
{{- $component := index . 1 -}}
# Past --shutdown-timeout-seconds (25): a stopping component drains first.
terminationGracePeriodSeconds: 35
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- with $.Values.topologySpread }}
topologySpreadConstraints:
  {{- range . }}
  - {{- toYaml . | nindent 4 }}
    labelSelector:
      matchLabels:
        {{- include "podstream.selectorLabels" $ | nindent 8 }}
    matchLabelKeys:
      - app.kubernetes.io/component
  {{- end }}
{{- end }}
{{- with $.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The container's fields every component shares. */}}
{{- define "podstream.containerDefaults" -}}
image: {{ include "podstream.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
envFrom:
  - configMapRef:
      name: {{ include "podstream.fullname" . }}
ports:
  - name: metrics
    containerPort: 9090
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 10
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 5
resources:
  {{- toYaml .Values.resources | nindent 2 }}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  capabilities:
    drop: ["ALL"]
{{- end -}}

{{/* The CA's mount, first of every container's, and the NATS client certificate's. */}}
{{- define "podstream.caMount" -}}
- name: ca
  mountPath: /var/run/secrets/podstream/ca
  readOnly: true
{{- if .Values.secrets.natsClientCertificate }}
- name: nats-client
  mountPath: /var/run/secrets/podstream/nats-client
  readOnly: true
{{- end }}
{{- end -}}

{{/* The CA's volume, first of every pod's, and the NATS client certificate's. */}}
{{- define "podstream.caVolume" -}}
- name: ca
  secret:
    secretName: {{ .Values.secrets.ca }}
    defaultMode: 0440
{{- with .Values.secrets.natsClientCertificate }}
- name: nats-client
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* One key of the NATS passwords' Secret as the file `password`; call with (list $ "ingest"). */}}
{{- define "podstream.natsPassword" -}}
- name: nats-password
  secret:
    secretName: {{ (index . 0).Values.secrets.nats }}
    items:
      - key: {{ index . 1 }}
        path: password
    defaultMode: 0440
{{- end -}}
