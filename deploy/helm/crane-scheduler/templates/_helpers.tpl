{{/* Object names: "<release>-<component>" (fullnameOverride replaces the release name). */}}
{{- define "crane.prefix" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "crane.name" -}}
{{- printf "%s-%s" (include "crane.prefix" .root) .component -}}
{{- end -}}

{{/* Labels of every object; selector labels are the stable subset. */}}
{{- define "crane.selectorLabels" -}}
app.kubernetes.io/name: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "crane.labels" -}}
{{ include "crane.selectorLabels" . }}
app.kubernetes.io/part-of: crane-scheduler
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "crane.image" -}}
{{- $v := .root.Values.image -}}
{{- $repo := printf "%s%s" $v.repositoryPrefix .component -}}
{{- if $v.registry }}{{ $repo = printf "%s/%s" $v.registry $repo }}{{ end -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion $v.tag) -}}
{{- end -}}

{{- define "crane.redisSecret" -}}
{{- default (include "crane.name" (dict "root" . "component" "redis-auth")) .Values.redis.auth.existingSecret -}}
{{- end -}}

{{- define "crane.redisURL" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s.%s.svc:6379/%v" (include "crane.name" (dict "root" . "component" "redis")) .Release.Namespace .Values.redis.database -}}
{{- else -}}
{{- required "redis.external.url is required when redis.enabled is false" .Values.redis.external.url -}}
{{- end -}}
{{- end -}}

{{/* Environment every Redis client gets: URL, password file, CA, key prefix. */}}
{{- define "crane.redisEnv" -}}
- {name: CRANE_REDIS_URL, value: {{ include "crane.redisURL" . | quote }}}
- {name: CRANE_REDIS_PREFIX, value: {{ .Values.redis.keyPrefix | quote }}}
{{- if .Values.redis.auth.enabled }}
- {name: CRANE_REDIS_PASSWORD_FILE, value: /etc/crane/redis/password}
{{- end }}
{{- if .Values.redis.tls.caSecret }}
- {name: CRANE_REDIS_CA_FILE, value: /etc/crane/redis-ca/ca.crt}
{{- end }}
{{- if .Values.redis.external.sentinelPasswordSecret }}
- {name: CRANE_REDIS_SENTINEL_PASSWORD_FILE, value: /etc/crane/redis-sentinel/password}
{{- end }}
{{- end -}}

{{- define "crane.redisMounts" -}}
{{- if .Values.redis.auth.enabled }}
- {name: redis-auth, mountPath: /etc/crane/redis, readOnly: true}
{{- end }}
{{- if .Values.redis.tls.caSecret }}
- {name: redis-ca, mountPath: /etc/crane/redis-ca, readOnly: true}
{{- end }}
{{- if .Values.redis.external.sentinelPasswordSecret }}
- {name: redis-sentinel, mountPath: /etc/crane/redis-sentinel, readOnly: true}
{{- end }}
{{- end -}}

{{- define "crane.redisVolumes" -}}
{{- if .Values.redis.auth.enabled }}
- name: redis-auth
  secret:
    secretName: {{ include "crane.redisSecret" . }}
    items: [{key: {{ .Values.redis.auth.secretKey }}, path: password}]
{{- end }}
{{- if .Values.redis.tls.caSecret }}
- name: redis-ca
  secret:
    secretName: {{ .Values.redis.tls.caSecret }}
    items: [{key: {{ .Values.redis.tls.caKey }}, path: ca.crt}]
{{- end }}
{{- if .Values.redis.external.sentinelPasswordSecret }}
- name: redis-sentinel
  secret: {secretName: {{ .Values.redis.external.sentinelPasswordSecret }}, items: [{key: password, path: password}]}
{{- end }}
{{- end -}}

{{/* Environment every service that queries Prometheus gets (crane_shared.settings.add_prometheus_flags): the
URL with its path prefix, TLS, credentials from mounted Secrets, headers, tenant, partial answers, latency offset. */}}
{{- define "crane.prometheusEnv" -}}
{{- $p := .Values.prometheus -}}
- {name: CRANE_PROMETHEUS_URL, value: {{ $p.url | quote }}}
- {name: CRANE_PROMETHEUS_TIMEOUT, value: {{ $p.timeout | quote }}}
- {name: CRANE_PROMETHEUS_PARTIAL_RESPONSE, value: {{ $p.partialResponse | quote }}}
- {name: CRANE_PROMETHEUS_LATENCY_OFFSET, value: {{ $p.latencyOffset | quote }}}
{{- if $p.denyPartialResponse }}
- {name: CRANE_PROMETHEUS_DENY_PARTIAL_RESPONSE, value: "true"}
{{- end }}
{{- if not $p.proxyFromEnvironment }}
- {name: CRANE_PROMETHEUS_NO_PROXY_FROM_ENVIRONMENT, value: "true"}
{{- end }}
{{- if $p.tenant }}
- {name: CRANE_PROMETHEUS_TENANT, value: {{ $p.tenant | quote }}}
{{- end }}
{{- if $p.headers }}
{{- $lines := list }}{{ range $k, $v := $p.headers }}{{ $lines = append $lines (printf "%s: %v" $k $v) }}{{ end }}
- {name: CRANE_PROMETHEUS_HEADERS, value: {{ join "\n" $lines | quote }}}
{{- end }}
{{- if $p.queryParams }}
{{- $lines := list }}{{ range $k, $v := $p.queryParams }}{{ $lines = append $lines (printf "%s=%v" $k $v) }}{{ end }}
- {name: CRANE_PROMETHEUS_QUERY_PARAMS, value: {{ join "\n" $lines | quote }}}
{{- end }}
{{- if $p.tls.caSecret }}
- {name: CRANE_PROMETHEUS_CA_FILE, value: /etc/crane/prometheus-ca/ca.crt}
{{- end }}
{{- if $p.tls.clientCertSecret }}
- {name: CRANE_PROMETHEUS_CLIENT_CERT_FILE, value: /etc/crane/prometheus-client/tls.crt}
- {name: CRANE_PROMETHEUS_CLIENT_KEY_FILE, value: /etc/crane/prometheus-client/tls.key}
{{- end }}
{{- if $p.bearerTokenSecret }}
- {name: CRANE_PROMETHEUS_BEARER_TOKEN_FILE, value: /etc/crane/prometheus-token/token}
{{- end }}
{{- if $p.basicAuth.username }}
- {name: CRANE_PROMETHEUS_USERNAME, value: {{ $p.basicAuth.username | quote }}}
- {name: CRANE_PROMETHEUS_PASSWORD_FILE, value: /etc/crane/prometheus-password/password}
{{- end }}
{{- if $p.headersSecret }}
- {name: CRANE_PROMETHEUS_HEADERS_FILE, value: /etc/crane/prometheus-headers/headers}
{{- end }}
{{- end -}}

{{- define "crane.prometheusMounts" -}}
{{- $p := .Values.prometheus -}}
{{- if $p.tls.caSecret }}
- {name: prometheus-ca, mountPath: /etc/crane/prometheus-ca, readOnly: true}
{{- end }}
{{- if $p.tls.clientCertSecret }}
- {name: prometheus-client, mountPath: /etc/crane/prometheus-client, readOnly: true}
{{- end }}
{{- if $p.bearerTokenSecret }}
- {name: prometheus-token, mountPath: /etc/crane/prometheus-token, readOnly: true}
{{- end }}
{{- if $p.basicAuth.username }}
- {name: prometheus-password, mountPath: /etc/crane/prometheus-password, readOnly: true}
{{- end }}
{{- if $p.headersSecret }}
- {name: prometheus-headers, mountPath: /etc/crane/prometheus-headers, readOnly: true}
{{- end }}
{{- end -}}

{{- define "crane.prometheusVolumes" -}}
{{- $p := .Values.prometheus -}}
{{- if $p.tls.caSecret }}
- name: prometheus-ca
  secret:
    secretName: {{ $p.tls.caSecret }}
    items: [{key: {{ $p.tls.caKey }}, path: ca.crt}]
{{- end }}
{{- if $p.tls.clientCertSecret }}
- name: prometheus-client
  secret: {secretName: {{ $p.tls.clientCertSecret }}, items: [{key: tls.crt, path: tls.crt}, {key: tls.key, path: tls.key}]}
{{- end }}
{{- if $p.bearerTokenSecret }}
- name: prometheus-token
  secret: {secretName: {{ $p.bearerTokenSecret }}, items: [{key: {{ $p.bearerTokenKey }}, path: token}]}
{{- end }}
{{- if $p.basicAuth.username }}
{{- if not $p.basicAuth.passwordSecret }}{{ fail "prometheus.basicAuth.passwordSecret is required with prometheus.basicAuth.username" }}{{ end }}
- name: prometheus-password
  secret: {secretName: {{ $p.basicAuth.passwordSecret }}, items: [{key: {{ $p.basicAuth.passwordKey }}, path: password}]}
{{- end }}
{{- if $p.headersSecret }}
- name: prometheus-headers
  secret: {secretName: {{ $p.headersSecret }}, items: [{key: {{ $p.headersKey }}, path: headers}]}
{{- end }}
{{- end -}}

{{- define "crane.commonEnv" -}}
- {name: CRANE_LOG_FORMAT, value: {{ .Values.logFormat | quote }}}
- {name: CRANE_LOG_LEVEL, value: {{ .Values.logLevel | quote }}}
- {name: CRANE_METRICS_ACCESS, value: {{ .Values.metrics.access | quote }}}
{{- end -}}

{{/* Pod-level fields every Deployment shares: service account, security context, scheduling constraints. */}}
{{- define "crane.podSpec" -}}
{{- $c := .values -}}
serviceAccountName: {{ include "crane.name" . }}
securityContext: {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Container fields every service shares: image, probes on the "http" port, security context, resources. */}}
{{- define "crane.container" -}}
image: {{ include "crane.image" . }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
readinessProbe: {httpGet: {path: /readyz, port: http}, periodSeconds: 5}
livenessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 10, failureThreshold: 6}
securityContext: {{- toYaml .root.Values.containerSecurityContext | nindent 2 }}
resources: {{- toYaml .values.resources | nindent 2 }}
{{- end -}}

{{/* The objects around each service: ServiceAccount, metrics Service, PodDisruptionBudget, NetworkPolicy. */}}
{{- define "crane.serviceObjects" -}}
{{- $name := include "crane.name" . -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name }}
  namespace: {{ .root.Release.Namespace }}
  labels: {{- include "crane.labels" . | nindent 4 }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  namespace: {{ .root.Release.Namespace }}
  labels: {{- include "crane.labels" . | nindent 4 }}
spec:
  selector: {{- include "crane.selectorLabels" . | nindent 4 }}
  ports: [{name: http, port: {{ .port }}, targetPort: http}]
{{- if and .values.podDisruptionBudget.enabled (gt (int .values.replicas) 1) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  namespace: {{ .root.Release.Namespace }}
  labels: {{- include "crane.labels" . | nindent 4 }}
spec:
  minAvailable: {{ .values.podDisruptionBudget.minAvailable }}
  selector:
    matchLabels: {{- include "crane.selectorLabels" . | nindent 6 }}
{{- end }}
{{- if .root.Values.networkPolicy.enabled }}
---
# Nothing but the metrics scrapers{{ if .from }} and the extender's callers{{ end }} may connect to this pod.
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ $name }}
  namespace: {{ .root.Release.Namespace }}
  labels: {{- include "crane.labels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels: {{- include "crane.selectorLabels" . | nindent 6 }}
  policyTypes: [Ingress]
  ingress:
    - from: {{- toYaml .root.Values.networkPolicy.metricsFrom | nindent 8 }}
      ports: [{port: http}]
{{- with .from }}
    - from: {{- toYaml . | nindent 8 }}
      ports: [{port: http}]
{{- end }}
{{- end }}
{{- end -}}

{{/* A Lease of its own: create any (the name is only known once created), then get/update only its own. */}}
{{- define "crane.leaseRBAC" -}}
{{- $name := include "crane.name" . -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $name }}-lease
  namespace: {{ .root.Release.Namespace }}
  labels: {{- include "crane.labels" . | nindent 4 }}
rules:
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [create]
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    resourceNames: [{{ $name }}]
    verbs: [get, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $name }}-lease
  namespace: {{ .root.Release.Namespace }}
  labels: {{- include "crane.labels" . | nindent 4 }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: {{ $name }}-lease}
subjects: [{kind: ServiceAccount, name: {{ $name }}, namespace: {{ .root.Release.Namespace }}}]
{{- end -}}

{{/* A container of the uninstall hook Job: cranectl in the annotator's image. */}}
{{- define "crane.hookContainer" -}}
image: {{ include "crane.image" (dict "root" . "component" "annotator") }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
securityContext: {{- toYaml .Values.containerSecurityContext | nindent 2 }}
resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 256Mi}}
{{- end -}}

{{/* The schedulers whose Scheduled events the event recorder records: kube-scheduler and every profile of
crane-scheduler's configuration (an event's reportingController is its profile's name), so a binding under a
profile added in values counts in the hot values too. */}}
{{- define "crane.reportingControllers" -}}
{{- $names := list "default-scheduler" -}}
{{- range .Values.scheduler.profiles }}{{ $names = append $names .schedulerName }}{{ end -}}
{{- $names | uniq | join "," -}}
{{- end -}}
