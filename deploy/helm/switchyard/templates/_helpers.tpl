{{/* Names and labels shared by every template. */}}

{{- define "switchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "switchyard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "switchyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "switchyard.labels" -}}
helm.sh/chart: {{ include "switchyard.chart" . }}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchyard
{{- end -}}

{{/* Selector labels of one component: include "switchyard.selector" (list $ "gateway") */}}
{{- define "switchyard.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "switchyard.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "switchyard.gateway.name" -}}
{{- printf "%s-gateway" (include "switchyard.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "switchyard.redis.name" -}}
{{- printf "%s-redis" (include "switchyard.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Engine resource name: include "switchyard.engine.name" (list $ NAME) */}}
{{- define "switchyard.engine.name" -}}
{{- printf "%s-engine-%s" (include "switchyard.fullname" (index . 0)) (index . 1) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "switchyard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "switchyard.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "switchyard.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The policy ConfigMap's name, or "" when the gateway runs its bundled default policy. */}}
{{- define "switchyard.policy.configMap" -}}
{{- if .Values.policy.existingConfigMap -}}
{{- .Values.policy.existingConfigMap -}}
{{- else if .Values.policy.content -}}
{{- printf "%s-policy" (include "switchyard.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Whether the gateway gets SWITCHYARD_REDIS_URL. */}}
{{- define "switchyard.redis.wanted" -}}
{{- if or .Values.redis.enabled .Values.redis.external.url .Values.redis.external.existingSecret -}}true{{- end -}}
{{- end -}}

{{- define "switchyard.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
fsGroup: {{ .uid }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "switchyard.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/*
More than one gateway pod shares keys, budgets, rate limits, stored Responses and conversation
stickiness only through PostgreSQL and Redis: refuse to render such an install without both
(unless gateway.allowPerReplicaState says each pod may keep its own).
*/}}
{{- define "switchyard.replicas.check" -}}
{{- $g := .Values.gateway -}}
{{- $many := or (and $g.autoscaling.enabled (gt (int $g.autoscaling.maxReplicas) 1)) (and (not $g.autoscaling.enabled) (gt (int $g.replicas) 1)) -}}
{{- $shared := and .Values.ledger.postgresql.existingSecret (include "switchyard.redis.wanted" .) -}}
{{- if and $many (not $shared) (not $g.allowPerReplicaState) -}}
{{- $missing := list -}}
{{- if not .Values.ledger.postgresql.existingSecret -}}{{- $missing = append $missing "ledger.postgresql.existingSecret (the ledger, virtual keys and stored Responses)" -}}{{- end -}}
{{- if not (include "switchyard.redis.wanted" .) -}}{{- $missing = append $missing "redis.enabled or redis.external (rate limits, budgets, the exact cache, conversation stickiness)" -}}{{- end -}}
{{- fail (printf "gateway: more than one replica needs shared state; set %s. Without it every pod keeps its own keys, budgets, caches and conversations (docs/replicas.md); set gateway.allowPerReplicaState=true to accept that" (join " and " $missing)) -}}
{{- end -}}
{{- end -}}
