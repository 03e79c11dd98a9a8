{{/* Names: every object is RELEASE-airlock-PART unless the release is named airlock. */}}
{{- define "airlock.fullname" -}}
{{- if eq .Release.Name "airlock" -}}airlock{{- else -}}{{ printf "%s-airlock" .Release.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "airlock.name" -}}
{{ include "airlock.fullname" .root }}-{{ .part }}
{{- end -}}

{{/* Labels every object has; selectorLabels pick one part's pods. */}}
{{- define "airlock.labels" -}}
app.kubernetes.io/name: airlock
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .part }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "airlock.selectorLabels" -}}
app.kubernetes.io/name: airlock
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .part }}
{{- end -}}

{{- define "airlock.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "airlock.checkProvider" -}}
{{- $p := .Values.identity.provider -}}
{{- if not (has $p (list "spire" "cert-manager-csi")) -}}
{{- fail (printf "identity.provider %q: want spire or cert-manager-csi" $p) -}}
{{- end -}}
{{- if and (eq $p "cert-manager-csi") (not .Values.identity.certManager.executorNamedByPod) -}}
{{- fail "identity.provider cert-manager-csi names each executor by its pod (csi-driver expands no node name), so a replaced pod is a new executor: set identity.certManager.executorNamedByPod=true to accept that, or use spire" -}}
{{- end -}}
{{- end -}}

{{/* The server part every service's config has. */}}
{{- define "airlock.serverConfig" -}}
version: 1
trust_domain: {{ .root.Values.trustDomain | quote }}
listen: {{ printf "0.0.0.0:%v" .port | quote }}
data_dir: {{ .dataDir }}
tls:
  ca: {{ .root.Values.identity.mountPath }}/ca.crt
  cert: {{ .root.Values.identity.mountPath }}/tls.crt
  key: {{ .root.Values.identity.mountPath }}/tls.key
log: {level: {{ .root.Values.log.level }}, format: {{ .root.Values.log.format }}}
telemetry:
  otlp_endpoint: {{ .root.Values.telemetry.otlpEndpoint | quote }}
  insecure: {{ .root.Values.telemetry.insecure }}
  sample_ratio: {{ .root.Values.telemetry.sampleRatio }}
  prometheus_listen: {{ if .metricsPort }}{{ printf "0.0.0.0:%v" .metricsPort | quote }}{{ else }}""{{ end }}
shutdown_timeout: {{ .shutdownTimeout }}
{{- end -}}

{{/* Prometheus' scrape annotations for a pod template. */}}
{{- define "airlock.scrapeAnnotations" -}}
{{- if .port }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/*
The identity volumes of a pod: with spire the Workload API socket (SPIFFE
CSI driver), the spiffe-helper config and an in-memory directory the helper
writes the files to; with cert-manager-csi one CSI volume holding them.
*/}}
{{- define "airlock.identityVolumes" -}}
{{- $v := .root.Values.identity -}}
{{- if eq $v.provider "spire" }}
- name: spire-agent-socket
  csi:
    driver: {{ $v.spire.csiDriver }}
    readOnly: true
- name: spiffe-helper-config
  configMap:
    name: {{ include "airlock.name" (dict "root" .root "part" "spiffe-helper") }}
- name: tls
  emptyDir: {medium: Memory, sizeLimit: 1Mi}
{{- else }}
- name: tls
  csi:
    driver: {{ $v.certManager.csiDriver }}
    readOnly: true
    volumeAttributes:
      csi.cert-manager.io/issuer-name: {{ $v.certManager.issuer.name }}
      csi.cert-manager.io/issuer-kind: {{ $v.certManager.issuer.kind }}
      csi.cert-manager.io/issuer-group: {{ $v.certManager.issuer.group }}
      {{- if eq .part "executor" }}
      csi.cert-manager.io/uri-sans: {{ printf "spiffe://%s/service/executor/${POD_NAME}" .root.Values.trustDomain | quote }}
      {{- else }}
      csi.cert-manager.io/uri-sans: {{ printf "spiffe://%s/service/%s" .root.Values.trustDomain .part | quote }}
      {{- end }}
      csi.cert-manager.io/common-name: {{ printf "%s.${POD_NAMESPACE}" .part | quote }}
      csi.cert-manager.io/key-algorithm: ECDSA
      csi.cert-manager.io/key-usages: "digital signature,key encipherment,server auth,client auth"
      csi.cert-manager.io/duration: {{ $v.certManager.duration }}
      csi.cert-manager.io/renew-before: {{ $v.certManager.renewBefore }}
      csi.cert-manager.io/ca-file: ca.crt
      csi.cert-manager.io/certificate-file: tls.crt
      csi.cert-manager.io/privatekey-file: tls.key
      {{- if .fsGroup }}
      csi.cert-manager.io/fs-group: {{ .fsGroup | quote }}
      {{- end }}
{{- end }}
{{- end -}}

{{/*
The spiffe-helper sidecar (spire only): a native sidecar (an init container
that keeps running), so the service starts only once its startup probe says
the files are written, and keeps renewing them.
*/}}
{{- define "airlock.spiffeHelper" -}}
{{- $v := .root.Values.identity -}}
{{- if eq $v.provider "spire" }}
- name: spiffe-helper
  image: {{ $v.spire.helper.image }}
  restartPolicy: Always
  args: ["-config", "/etc/spiffe-helper/helper.conf"]
  startupProbe:
    httpGet: {path: /ready, port: {{ $v.spire.helper.healthPort }}}
    periodSeconds: 2
    failureThreshold: 60
  livenessProbe:
    httpGet: {path: /live, port: {{ $v.spire.helper.healthPort }}}
    periodSeconds: 30
  resources: {{- toYaml $v.spire.helper.resources | nindent 4 }}
  securityContext:
    runAsNonRoot: true
    runAsUser: {{ .uid }}
    runAsGroup: {{ .uid }}
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities: {drop: [ALL]}
    seccompProfile: {type: RuntimeDefault}
  volumeMounts:
    - {name: spire-agent-socket, mountPath: /spiffe-workload-api, readOnly: true}
    - {name: spiffe-helper-config, mountPath: /etc/spiffe-helper, readOnly: true}
    - {name: tls, mountPath: {{ $v.mountPath }}}
{{- end }}
{{- end -}}

{{/* The PostgreSQL password file and, if given, its server's CA. */}}
{{- define "airlock.postgresVolumes" -}}
- name: postgres
  secret:
    secretName: {{ .Values.postgres.passfileSecret.name }}
    items: [{key: {{ .Values.postgres.passfileSecret.key }}, path: pgpass}]
    defaultMode: 0440
{{- if .Values.postgres.caConfigMap }}
- name: postgres-ca
  configMap: {name: {{ .Values.postgres.caConfigMap }}}
{{- end }}
{{- end -}}

{{/* NetworkPolicy pieces. */}}
{{- define "airlock.metricsIngress" -}}
{{- if .port }}
- ports: [{port: {{ .port }}, protocol: TCP}]
  from: {{- toYaml .root.Values.networkPolicy.metricsFrom | nindent 4 }}
{{- end }}
{{- end -}}

{{- define "airlock.commonEgress" -}}
- to: {{- toYaml .Values.networkPolicy.dns | nindent 4 }}
  ports: [{port: 53, protocol: UDP}, {port: 53, protocol: TCP}]
{{- if and .Values.telemetry.otlpEndpoint .Values.networkPolicy.otlp.peers }}
- to: {{- toYaml .Values.networkPolicy.otlp.peers | nindent 4 }}
  ports: [{port: {{ .Values.networkPolicy.otlp.port }}, protocol: TCP}]
{{- end }}
{{- end -}}

{{/* PostgreSQL and git servers: the authority and the publisher. */}}
{{- define "airlock.storeEgress" -}}
- to: {{- toYaml .Values.postgres.networkPolicyPeers | nindent 4 }}
  ports: [{port: {{ .Values.postgres.port }}, protocol: TCP}]
- to: {{- toYaml .Values.networkPolicy.git.peers | nindent 4 }}
  ports:
    {{- range .Values.networkPolicy.git.ports }}
    - {port: {{ . }}, protocol: TCP}
    {{- end }}
{{- end -}}
