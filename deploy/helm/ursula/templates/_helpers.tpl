{{/* Resource names. */}}
{{- define "ursula.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ursula.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ursula.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels: pass (dict "ctx" $ "component" "node"). */}}
{{- define "ursula.labels" -}}
helm.sh/chart: {{ include "ursula.chart" .ctx }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
{{ include "ursula.selectorLabels" . }}
{{- end -}}

{{- define "ursula.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ursula.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ursula.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "ursula.serviceAccountName" -}}
{{- default (include "ursula.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "ursula.nodeName" -}}{{ include "ursula.fullname" . }}-node{{- end -}}
{{- define "ursula.headlessName" -}}{{ include "ursula.fullname" . }}-node-headless{{- end -}}
{{- define "ursula.configName" -}}{{ include "ursula.fullname" . }}-config{{- end -}}

{{- define "ursula.nodeSecretPrefix" -}}
{{- default (printf "%s-node-tls" (include "ursula.fullname" .)) .Values.tls.nodeSecretPrefix -}}
{{- end -}}
{{- define "ursula.gatewaySecret" -}}
{{- default (printf "%s-gateway-tls" (include "ursula.fullname" .)) .Values.tls.gatewaySecret -}}
{{- end -}}
{{- define "ursula.coldgcSecret" -}}
{{- default (printf "%s-coldgc-tls" (include "ursula.fullname" .)) .Values.tls.coldgcSecret -}}
{{- end -}}
{{- define "ursula.backupSecret" -}}
{{- default (printf "%s-backup-tls" (include "ursula.fullname" .)) .Values.tls.backupSecret -}}
{{- end -}}
{{- define "ursula.adminTokenSecret" -}}
{{- default (printf "%s-admin-token" (include "ursula.fullname" .)) .Values.adminToken.existingSecret -}}
{{- end -}}

{{/* The DNS name of voter pod ordinal .i: (dict "ctx" $ "i" 0). */}}
{{- define "ursula.podHost" -}}
{{- printf "%s-%d.%s.%s.svc" (include "ursula.nodeName" .ctx) (int .i) (include "ursula.headlessName" .ctx) .ctx.Release.Namespace -}}
{{- end -}}

{{/* upstream.nodes: every voter's client plane, as a TOML array. */}}
{{- define "ursula.upstreamNodes" -}}
{{- $hosts := list -}}
{{- range $i := until (int .Values.node.replicas) -}}
{{- $hosts = append $hosts (printf "%q" (printf "%s:%d" (include "ursula.podHost" (dict "ctx" $ "i" $i)) (int $.Values.server.ports.client))) -}}
{{- end -}}
[{{ join ", " $hosts }}]
{{- end -}}

{{/* The [storage.cold] section shared by nodes and the cold-GC worker. */}}
{{- define "ursula.coldToml" -}}
[storage.cold]
  backend = {{ .Values.storage.cold.backend | quote }}
{{- if .Values.storage.cold.root }}
  root = {{ .Values.storage.cold.root | quote }}
{{- end }}
{{- if eq .Values.storage.cold.backend "s3" }}
  [storage.cold.s3]
    bucket = {{ .Values.storage.cold.s3.bucket | quote }}
{{- with .Values.storage.cold.s3.region }}
    region = {{ . | quote }}
{{- end }}
{{- with .Values.storage.cold.s3.endpoint }}
    endpoint = {{ . | quote }}
{{- end }}
    path_style = {{ .Values.storage.cold.s3.pathStyle }}
{{- end }}
{{- end -}}

{{/* The [upstream] section of the gateway, cold-GC and backup roles: (dict "ctx" $). */}}
{{- define "ursula.upstreamToml" -}}
[upstream]
  # Every voter's client plane; the nodes serve TLS and the process proves
  # its role with its certificate.
  nodes = {{ include "ursula.upstreamNodes" .ctx }}
  tls = { ca_file = "/etc/ursula/tls/ca.crt", cert_file = "/etc/ursula/tls/tls.crt", key_file = "/etc/ursula/tls/tls.key" }
{{- end -}}

{{- define "ursula.logToml" -}}
[log]
  level = {{ .Values.log.level | quote }}
  format = {{ .Values.log.format | quote }}
{{- end -}}

{{/* Pod security: the image's user, no privilege. */}}
{{- define "ursula.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "ursula.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* S3 credentials as environment variables, when a Secret is named. */}}
{{- define "ursula.s3Env" -}}
{{- with .Values.storage.cold.s3.credentialsSecret -}}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: AWS_SECRET_ACCESS_KEY
{{- end }}
{{- end -}}
